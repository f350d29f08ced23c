"""The mixture's mode jumps (service/sgais/engine.py ``Sampler._jump``, models/mixture.py
``GaussianMixture.propose_jump``) and the sampler settings that came with them (warm-up, the
model's default control variates, the state's ``jumps_left``)."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from bench import data as D
from models import build_model
from models.mixture import GaussianMixture, _log_q_weights, standard_gamma_rows
from service.sgais import ConfigError, SGAISConfig, SGAISState, build_sampler


def _jump_only_estimates(monkeypatch=None, broken=False):
    """AIS from the prior to a 2-component mixture's posterior on 300 rows (1-D) with 1,000 particles
    and no SGHMC at all: the jumps are the only moves, so the estimate is unbiased only if they leave
    each tempered target invariant."""
    x = D.gmm_data(300, 0, components=2, dims=1)
    model = build_model("gmm:components=2", n_columns=1)
    if broken:  # a proposal whose MH ratio forgets the proposal densities
        orig = GaussianMixture.propose_jump

        def without_q(self, *a, **k):
            prop, ratio = orig(self, *a, **k)
            return prop, torch.zeros_like(ratio)

        monkeypatch.setattr(GaussianMixture, "propose_jump", without_q)
    out = []
    for seed in range(4):
        sampler = build_sampler(model, SGAISConfig(particles=1000, sghmc_steps=0, jumps=4))
        state = sampler.init(seed)
        state, result, _ = sampler.update(state, x, sampler.new_reservoir())
        out.append(result.log_evidence)
    return model, x, out


def _reference(model, x):
    from bench.reference import importance_log_evidence, laplace_log_evidence

    rows = model.featurize(x)
    ref = laplace_log_evidence(model, rows)
    chk = importance_log_evidence(model, rows, ref, draws=5000)
    return chk.log_evidence, chk.std_error


def test_jumps_alone_give_an_unbiased_evidence():
    """Measured: the four estimates -672.48, -672.35, -672.22, -672.31 (mean -672.34) against the
    importance-sampling reference -672.42 +- 0.003 (Laplace -672.43): the mean within 0.1 nats, one
    run's spread about 0.1. The bound, 0.4 nats on the mean, is 5 times that; a kernel without the
    proposal ratio is 4.8 nats off (next test)."""
    model, x, est = _jump_only_estimates()
    ref, se = _reference(model, x)
    assert abs(np.mean(est) - ref) < 0.4 + 4 * se, (est, ref)


def test_the_unbiasedness_test_can_fail(monkeypatch):
    """The same run with the proposal densities left out of the acceptance: measured -667.5 to -667.7,
    4.8 nats above the reference. The check above would catch it."""
    model, x, est = _jump_only_estimates(monkeypatch, broken=True)
    ref, _ = _reference(model, x)
    assert np.mean(est) - ref > 2.0, est


def _screened_estimates(monkeypatch, seeds=4):
    """As ``_jump_only_estimates``, in two chunks (30 rows, then 270), the second with the two-stage
    jump (``Sampler._jump``) on: ``JUMP_SCREEN_ROWS`` 10 of the reservoir's 30 rows and no slack (a
    proposal passes stage 1 with the estimated ratio's own MH probability), so the first stage turns
    many proposals away."""
    from service.sgais import engine

    monkeypatch.setattr(engine, "JUMP_SCREEN_ROWS", 10)
    monkeypatch.setattr(engine, "JUMP_SCREEN_SLACK", 0.0)
    monkeypatch.setattr(engine, "JUMP_SCREEN_SE", 0.0)
    x = D.gmm_data(300, 0, components=2, dims=1)
    model = build_model("gmm:components=2", n_columns=1)
    out = []
    for seed in range(seeds):
        sampler = build_sampler(model, SGAISConfig(particles=1000, sghmc_steps=0, jumps=4))
        state, reservoir = sampler.init(seed), sampler.new_reservoir()
        for part in (x[:30], x[30:]):
            state, result, writes = sampler.update(state, part, reservoir)
            reservoir.apply(writes)
        out.append(result.log_evidence)
        accepted, proposed, passed = sampler.jump_stats
        assert 0 < passed < proposed and accepted > 0  # stage 1 ran, passed some and turned others away
    return model, x, out


def test_two_stage_jumps_run_inside_the_annealing(monkeypatch):
    """Measured: -672.69, -672.81, -672.12, -672.41 (mean -672.51) against the reference -672.42 (the
    test above): the same bound as there, 0.4 nats on the mean. This estimate leans on the reweighting
    more than on the moves: a stage 2 without its correction also measured within 0.2 nats. So this
    test checks that the two-stage path runs end to end; its exactness is the next test's."""
    model, x, est = _screened_estimates(monkeypatch)
    ref, se = _reference(model, x)
    assert abs(np.mean(est) - ref) < 0.4 + 4 * se, (est, ref)


def test_delayed_acceptance_is_reversible():
    """For any first-stage estimate and slack, alpha(x, y) / alpha(y, x) = pi(y) q(x | y) / (pi(x) q(y | x)):
    the two stages together satisfy detailed balance (checked on 10,000 random cases, the reverse move
    seeing the negated estimate and ratio, the same slack); without the correction they do not."""
    from service.sgais.engine import delayed_log_acceptance

    g = torch.Generator().manual_seed(0)
    est = 30 * torch.randn(10_000, generator=g, dtype=torch.float64)
    exact = est + 10 * torch.randn(10_000, generator=g, dtype=torch.float64)
    slack = 20 * torch.rand(10_000, generator=g, dtype=torch.float64)

    def log_alpha(e, r, accept=delayed_log_acceptance):
        a1, a1_rev = torch.clamp(e + slack, max=0.0), torch.clamp(slack - e, max=0.0)
        return a1 + accept(r, a1, a1_rev)

    assert torch.allclose(log_alpha(est, exact) - log_alpha(-est, -exact), exact, atol=1e-9)
    naive = lambda r, a1, a1_rev: torch.clamp(r, max=0.0)  # noqa: E731
    assert not torch.allclose(log_alpha(est, exact, naive) - log_alpha(-est, -exact, naive), exact, atol=1e-3)


def test_a_jump_reports_the_gain_of_the_move_it_accepted():
    """``Sampler._jump`` returns the largest gain in log target of an accepted move, which sets
    ``jumps_left`` (``JUMP_FOLLOW`` chunks of jumps after a gain over ``JUMP_GAIN``). Until 2026-11-26
    it was measured after the particle had moved and was always 0. Here the particles are prior draws
    on 300 rows, the proposal is (with a zero proposal ratio) the particles of a finished run, so every
    move is accepted and the gain is computed independently from the target."""
    from service.sgais import engine

    x = D.gmm_data(300, 0, components=2, dims=1)
    model = build_model("gmm:components=2", n_columns=1)
    rows = model.featurize(x)
    sampler = build_sampler(model, SGAISConfig(particles=8, jumps=1))
    state, _, _ = sampler.update(sampler.init(0), x, sampler.new_reservoir())
    good, theta = state.theta, model.sample_prior(torch.Generator().manual_seed(1), 8)
    lam = 0.5

    def log_target(th):
        return model.log_prior(th) + lam * model.log_likelihood(th, rows).sum(1)

    def propose(th):
        return good.clone(), torch.zeros(len(th), dtype=torch.float64)

    moved, chunk_ll, gain = sampler._jump(theta, lam, rows, rows[:0], 0, propose, torch.Generator().manual_seed(2))
    want = log_target(good) - log_target(theta)
    assert torch.equal(moved, good) and np.allclose(chunk_ll, model.log_likelihood(good, rows).sum(1).numpy())
    assert gain > engine.JUMP_GAIN and abs(gain - float(want.max())) < 1e-6 * abs(gain), (gain, want)
    assert sampler._jumps_left(0, "last step", gain) == engine.JUMP_FOLLOW


def test_the_weights_proposal_density_is_a_density():
    """``_log_q_weights`` is the density of z = log(w S), w ~ Dirichlet(alpha), S ~ Gamma(K, 1): its
    Monte Carlo normaliser over a box that holds nearly all of its mass is 1 (K = 2, where z is 2-D)."""
    alpha = np.array([[3.0, 5.0]])
    grid = np.linspace(-8.0, 4.0, 601)
    z1, z2 = np.meshgrid(grid, grid, indexing="ij")
    z = np.stack([z1.ravel(), z2.ravel()], axis=1)
    dens = np.exp(_log_q_weights(z, np.repeat(alpha, len(z), axis=0)))
    mass = dens.sum() * (grid[1] - grid[0]) ** 2
    assert abs(mass - 1.0) < 1e-3, mass


def test_gamma_rows_have_the_right_means_and_are_reproducible():
    alpha = np.array([[1.0, 2.5, 40.0]]).repeat(20_000, axis=0)
    a = standard_gamma_rows(torch.Generator().manual_seed(3), alpha)
    b = standard_gamma_rows(torch.Generator().manual_seed(3), alpha)
    assert np.array_equal(a, b)
    # Gamma(alpha, 1): mean alpha, sd sqrt(alpha); 20,000 draws: the mean within 5 standard errors
    assert np.all(np.abs(a.mean(0) - alpha[0]) < 5 * np.sqrt(alpha[0] / 20_000)), a.mean(0)


def test_jumps_are_deterministic_and_survive_a_state_round_trip():
    """Same seed, same chunks: the same numbers, also when the state is saved and reloaded half-way
    (the jumps draw from the sampler's generator; ``jumps_left`` is saved)."""
    x = D.distribution_shift_data(6_000, 0)[0]
    model = build_model("gmm:components=5", n_columns=2)
    sampler = build_sampler(model, SGAISConfig())
    straight = [r.log_evidence for _, r, _ in sampler.run(x, 500, seed=4)]
    state, reservoir, got = sampler.init(4), sampler.new_reservoir(), []
    for start in range(0, 6_000, 500):
        state, r, writes = sampler.update(state, x[start : start + 500], reservoir)
        reservoir.apply(writes)
        state = SGAISState.from_bytes(state.to_bytes())
        got.append(r.log_evidence)
    assert got == straight
    assert sampler.jump_stats[0] > 0  # the jumps did run and were accepted


def test_a_state_saved_before_jumps_loads_with_none_left():
    import json
    import struct

    from service.sgais.state import MAGIC

    raw = SGAISState(theta=torch.zeros(2, 3, dtype=torch.float64), log_weights=torch.zeros(2, dtype=torch.float64),
                     log_evidence=0.0, n=0, chunks=0, rng=torch.Generator().get_state(),
                     cv_theta=torch.zeros(0, dtype=torch.float64), cv_grad=torch.zeros(0, dtype=torch.float64),
                     jumps_left=3, surprise_n=10_500).to_bytes()
    assert SGAISState.from_bytes(raw).surprise_n == 10_500  # saved (``Sampler._check_modes``' extra checks)
    (hlen,) = struct.unpack_from("<I", raw, len(MAGIC))
    header = json.loads(raw[len(MAGIC) + 4 : len(MAGIC) + 4 + hlen])
    assert header.pop("jumps_left") == 3 and header.pop("surprise_n") == 10_500
    head = json.dumps(header, separators=(",", ":")).encode()
    old = MAGIC + struct.pack("<I", len(head)) + head + raw[len(MAGIC) + 4 + hlen :]
    assert SGAISState.from_bytes(old).jumps_left == 0 and SGAISState.from_bytes(old).surprise_n == 0


@pytest.mark.parametrize("bad,name", [({"jumps": -1}, "jumps"), ({"jumps": 1.5}, "jumps"), ({"jumps": True}, "jumps"),
                                      ({"warmup": -1.0}, "warmup"), ({"warmup": math.inf}, "warmup"),
                                      ({"warmup": "9"}, "warmup"), ({"control_variates": 1}, "control_variates"),
                                      ({"first_draws": -1}, "first_draws"), ({"first_draws": 10.0}, "first_draws"),
                                      ({"first_draws": False}, "first_draws"), ({"first_draws": 100_001}, "first_draws"),
                                      ({"check_draws": -1}, "check_draws"), ({"check_draws": "300"}, "check_draws")])
def test_bad_settings_name_the_option(bad, name):
    with pytest.raises(ConfigError, match=name):
        SGAISConfig(**bad)


def test_warmup_steps_and_model_defaults():
    cfg = SGAISConfig()
    assert cfg.run_steps(0, 500, 9.0) == 200 and cfg.run_steps(500, 500, 9.0) == 110
    assert cfg.run_steps(99_500, 500, 9.0) == 21 and cfg.run_steps(0, 500) == 20  # no model warm-up: the paper's 20
    assert SGAISConfig(warmup=0.0).run_steps(0, 500, 9.0) == 20
    plain = SGAISConfig.preset("paper-plain")
    assert (plain.jumps, plain.warmup, plain.control_variates, plain.first_draws, plain.check_draws) == (0, 0.0, False, 0, 0)


def test_the_mixtures_warm_up_gives_way_to_its_first_draws_and_comes_back_in_the_restarts():
    """The mixture's first chunk is carried by its importance draws (``first_draws``): no SGHMC warm-up
    then; without the draws (set off, or the detector's restarts) the model's 9 is back; a warm-up set
    by the user is kept; logistic regression (no draws) keeps its own."""
    from service.detect.detector import Detector

    gmm, logistic = build_model("gmm:components=3", 2), build_model("logistic-regression:classes=3", 4)
    assert SGAISConfig().for_model(gmm).warmup == 0.0
    assert SGAISConfig(first_draws=0).for_model(gmm).warmup == gmm.sgais_warmup == 9.0
    assert SGAISConfig(warmup=2.0).for_model(gmm).warmup == 2.0
    assert SGAISConfig().for_model(logistic).warmup == logistic.sgais_warmup == 9.0
    det = Detector(build_sampler(gmm, SGAISConfig()))
    assert det.restarts.config.first_draws == 0 and det.restarts.config.warmup == 9.0
    det = Detector(build_sampler(gmm, SGAISConfig(warmup=2.0)))
    assert det.restarts.config.warmup == 2.0


def test_logistic_regression_uses_control_variates_by_default():
    x = D.logistic_regression_data(1_500, 0)
    model = build_model("logistic-regression:classes=4", n_columns=x.shape[1])
    few = {"particles": 10}  # (the model's own 30 only cost time here)
    on = [s for s, _, _ in build_sampler(model, SGAISConfig(**few)).run(x, 500, seed=0)][-1]
    off = [s for s, _, _ in build_sampler(model, SGAISConfig(control_variates=False, **few)).run(x, 500, seed=0)][-1]
    assert on.cv_theta.numel() == model.dim and off.cv_theta.numel() == 0


def test_a_one_row_chunk_is_tested_for_surprise_without_a_warning():
    """A chunk of one row has no variance of its own; the surprise test takes the history's for it
    (under "nothing new" the row is drawn like them). It used ``var()`` of one value: NaN and a
    UserWarning, so a stream fed row by row never saw a surprise."""
    import warnings

    x = D.gmm_data(6_000, 0, components=3, dims=2)
    model = build_model("gmm:components=3", n_columns=2)
    sampler = build_sampler(model, SGAISConfig.preset("paper"))
    for state, _, res in sampler.run(x, 500, seed=0):
        pass
    state = dataclasses.replace(state, jumps_left=0)  # not in a follow-up or a cooldown
    rows = model.featurize(x[:1])
    far = model.featurize(torch.tensor([[1e3, -1e3]], dtype=torch.float64))
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wanted = [sampler._jumps_wanted(state, state.log_weights.numpy(), model.log_likelihood(state.theta, r), res.data, g)
                  for r in (rows, far)]
    assert wanted[1] == "surprise", wanted
    assert wanted[0] in ("", "last step"), wanted


def test_the_jump_schedule_counts_rows_not_chunks(monkeypatch):
    """Chunks of 500 (the benches', the demo's) jump as before: every chunk of the first 5,000 rows
    and the last step of every 8th chunk. Chunks of one row no longer jump at every row of the first
    5,000 (15-24 ms a row for a 5-component mixture here) but once per 50 rows, and once per 4,000
    after that, not every 8 rows."""
    from service.sgais.engine import JUMP_EVERY_ROWS, JUMP_WARMUP_EVERY, _holds_multiple

    assert [_holds_multiple(500 * c, 500, JUMP_EVERY_ROWS) for c in range(64)] == [c % 8 == 0 for c in range(64)]
    assert all(_holds_multiple(500 * c, 500, JUMP_WARMUP_EVERY) for c in range(10))
    assert sum(_holds_multiple(n, 1, JUMP_WARMUP_EVERY) for n in range(5_000)) == 100
    # chunks of 7 rows up to row 40,004 meet 0, 4,000, ..., 40,000
    assert sum(_holds_multiple(n, 7, JUMP_EVERY_ROWS) for n in range(0, 40_000, 7)) == 11

    calls = []
    orig = GaussianMixture.jump_candidates

    def counted(self, *a, **k):
        calls.append(1)
        return orig(self, *a, **k)

    monkeypatch.setattr(GaussianMixture, "jump_candidates", counted)
    x = D.gmm_data(300, 0, components=3, dims=2)
    sampler = build_sampler(build_model("gmm:components=3", n_columns=2), SGAISConfig.preset("paper"))
    for state, _, _ in sampler.run(x, 1, seed=0):
        pass
    # 6 scheduled chunks (rows 0, 50, ..., 250), each maybe followed by 2 more after a gain
    assert 6 <= len(calls) <= 18, len(calls)


@pytest.mark.parametrize("seed", range(3))
def test_the_weights_proposal_is_centred_on_a_particles_own_weights_at_the_mode(seed):
    """The Dirichlet behind a jump's weights (and behind the reverse move's density) is set by
    ``_weight_counts``: EM sweeps on the weights alone under a particle's means and variances. For a
    particle at the mode (EM run to convergence on three overlapping clusters, 10,000 rows, all of
    them the assignment rows) its counts must give back its own weights, or the reverse density of
    the particle's weights is many standard deviations (sqrt(w (1 - w) / 10,000), about 0.004) out
    and no move away from it is ever accepted. Measured, seeds 0-2: largest difference 0.0000,
    0.0000, 0.0002 with 20 sweeps; 0.0087, 0.0072, 0.0095 with the 3 used before."""
    from models.mixture import _em_matrix, _kmeanspp

    rng = np.random.default_rng(seed)
    y = np.array([[-1.5, 0.0], [1.5, 0.0], [0.0, 2.0]])[rng.choice(3, 10_000, p=[0.5, 0.3, 0.2])] + rng.standard_normal((10_000, 2))
    model = build_model("gmm:components=3", 2)
    w, mu, var, _ = _em_matrix(y, _kmeanspp(y, 3, np.random.default_rng(seed)), 200)
    cands = model.assignment_rows(torch.as_tensor(y), torch.as_tensor(y[:0]), 10_000, torch.Generator(), rows=10_000)
    counts = model._weight_counts(mu[None], np.log(var)[None], cands, 1.0, 0)[0] - 1.0
    assert np.abs(counts / counts.sum() - w).max() < 1e-3, (counts / counts.sum(), w)


def test_a_particles_weight_counts_do_not_depend_on_the_particles_beside_it():
    """The reverse density of a move uses the counts of the particle it came from, computed in
    another batch (``_weight_counts``: EM sweeps that stop per particle once its weights settle,
    each distinct particle once per ``JumpCandidates``). So a particle's counts must be the same
    numbers alone, among other particles, and as a copy, or the move's ratio is not the one its
    detailed balance needs."""
    rng = np.random.default_rng(0)
    y = np.array([[-1.5, 0.0], [1.5, 0.0], [0.0, 2.0]])[rng.choice(3, 4_000, p=[0.5, 0.3, 0.2])] + rng.standard_normal((4_000, 2))
    model = build_model("gmm:components=3", 2)
    mu = np.array([[-1.5, 0.0], [1.5, 0.0], [0.0, 2.0]])[None] + 0.3 * rng.standard_normal((6, 3, 2))
    s = 0.2 * rng.standard_normal((6, 3, 2))
    mu[4], s[4] = mu[1], s[1]  # a copy

    def cands():
        return model.assignment_rows(torch.as_tensor(y), torch.as_tensor(y[:500]), 3_500, torch.Generator(), rows=3_500)

    together = model._weight_counts(mu, s, cands(), 0.5, 500)
    assert np.array_equal(together[4], together[1])
    for i in range(6):
        assert np.array_equal(model._weight_counts(mu[i : i + 1], s[i : i + 1], cands(), 0.5, 500)[0], together[i]), i
        assert np.array_equal(model._particle_counts(mu[i : i + 1], s[i : i + 1], cands(), 0.5, 500)[0], together[i]), i


@pytest.mark.parametrize("offset,scale", [(1000.0, 100.0), (-1000.0, 1e4)])
def test_the_first_chunks_draws_keep_a_mixture_in_raw_units_near_its_reference(offset, scale):
    """The stationary 5-cluster data moved to raw units, K = 5, two chunks of 500 rows, against the
    Laplace reference (``bench.reference``; its own error is a few tenths of a nat here). The
    annealing from prior draws alone (``first_draws`` 0, and no fresh estimate at the mode checks,
    ``check_draws`` 0) ends the first chunk hundreds of nats low: measured after 1,000 rows, sampler
    seeds 0-7, -372 to -702 (offset 1000, scale 100) and -204 to -345 (offset -1000, scale 1e4);
    with the draws averaged in (``Sampler._first_chunk``), -34 to +3.3 (seven of eight within 5) and
    -14 to -2.7. Draws around the likelihood's mode, without the prior's EM steps
    (``FIRST_MAP_STEPS``), gave -60 to -91 and -3.5 to -18. (Since the mode checks start at 64 rows,
    2026-11-28, the check at 500 rows restates a first chunk without draws too: -19 to -23 and 0,
    seeds 0-3; the control here turns both off.)"""
    from bench.reference import laplace_log_evidence

    x = offset + scale * D.gmm_data(1_000, 0)
    model = build_model("gmm:components=5", n_columns=2)
    ref = laplace_log_evidence(model, model.featurize(x)).log_evidence

    def error(draws: int, seed: int, **more) -> float:
        state = [s for s, _, _ in build_sampler(model, SGAISConfig(first_draws=draws, **more)).run(x, 500, seed=seed)][-1]
        return state.log_evidence - ref

    for seed in (0, 1):
        assert -70.0 < error(1000, seed) < 10.0, seed  # measured -34 to +3.3 (16 runs)
    assert error(0, 0, check_draws=0) < -150.0  # measured -205 to -702: the check above can fail


def test_the_checks_after_new_clusters_draw_a_fresh_estimate_of_the_evidence():
    """3 clusters, 2 more from row 5,000, K = 5, 8,000 rows in chunks of 500, against the Laplace
    reference (``bench.reference``). The chunk at 5,000 surprises the particles; the mode checks
    1,000 and 2,000 rows later also estimate the evidence so far by importance sampling around
    their fit and average it with the running estimate (``SGAISConfig.check_draws``). Measured,
    sampler seeds 0-5: -4.4 nats with the draws on every seed (the fresh estimate, whose draws are
    seeded by n, sets the evidence; -3.9 to -11 before its fit used every row, 2026-11-28), -126 to
    -251 without (``check_draws`` 0: the nats lost while the clusters appeared stay lost)."""
    from bench.reference import laplace_log_evidence

    x = D.distribution_shift_data(8_000, 0, changes=(5_000, 10**12))[0]
    model = build_model("gmm:components=5", n_columns=2)
    ref = laplace_log_evidence(model, model.featurize(x), restarts=8).log_evidence

    def error(draws: int, seed: int) -> float:
        state = [s for s, _, _ in build_sampler(model, SGAISConfig(check_draws=draws)).run(x, 500, seed=seed)][-1]
        assert state.surprise_n == 5_500  # the checks ran where the test says
        return state.log_evidence - ref

    for seed in (0, 1):
        assert -40.0 < error(300, seed) < 10.0, seed  # measured -4.4 (6 seeds; -11 to -3.9 before)
    assert error(0, 0) < -100.0  # measured -251 to -126: the check above can fail


def test_a_check_that_finds_the_posterior_moved_draws_a_fresh_estimate_too():
    """The paper's 3 -> 5 -> 7 clusters, K = 3, 10,000 rows: five clusters from row 1,000 for three
    components. Between 5,000 and 7,000 rows the posterior's mass moves to another merge of the
    clusters; the particles stay in the old one (at 7,000 they sit 113-122 nats below the new mode)
    and, without a fresh estimate, the evidence ends 184-196 nats below the Laplace reference
    (10 seeds). The check at 8,192 (every power of two while the reservoir holds the history) finds
    the particles more than ``CONFIG_GAP`` nats per parameter below its fit and, as after a surprise,
    estimates the evidence afresh (``SGAISConfig.check_draws``): -4.6 to -1.2 (10 seeds). The chunk
    says so: its log-evidence steps by its log predictive plus ``restated``, beyond 10 nats, with the
    warning ``evidence_restated``."""
    from bench.reference import laplace_log_evidence

    x = D.distribution_shift_data(10_000, 0)[0]
    model = build_model("gmm:components=3", n_columns=2)
    ref = laplace_log_evidence(model, model.featurize(x)).log_evidence

    def run(draws: int, seed: int) -> tuple[float, list]:
        out = [(s, r) for s, r, _ in build_sampler(model, SGAISConfig(check_draws=draws)).run(x, 500, seed=seed)]
        return out[-1][0].log_evidence - ref, [r for _, r in out]

    for seed in (0, 1):
        error, results = run(300, seed)
        assert -20.0 < error < 10.0, seed  # measured -4.6 to -1.2 (10 seeds)
        before, at = results[15], results[16]  # the chunk that passes 8,192
        assert at.n == 8_500 and "evidence_restated" in at.warnings and not at.reliable, at
        assert 100.0 < at.restated < 300.0, at.restated  # measured 175-186 (10 seeds)
        assert at.log_evidence == pytest.approx(before.log_evidence + at.log_predictive + at.restated, abs=1e-6)
    error, results = run(0, 0)
    assert error < -100.0  # measured -196 to -184: the check above can fail
    assert not any("evidence_restated" in r.warnings or r.restated for r in results)


@pytest.mark.parametrize("n_prev,n,due", [(0, 63, False), (0, 64, True), (12, 76, True), (64, 127, False), (100, 200, True),
                                          (0, 1_023, True), (1_000, 1_500, True), (1_024, 2_047, False), (2_000, 2_048, True),
                                          (8_000, 8_500, True), (60_000, 70_000, True), (70_000, 100_000, False),
                                          (100_000, 200_000, False), (131_000, 131_500, False), (262_000, 262_500, True),
                                          (0, 10**6, True)])
def test_the_mode_checks_run_at_powers_of_two_while_the_reservoir_holds_the_history(n_prev, n, due):
    from service.sgais.engine import _mode_check_due

    assert _mode_check_due(n_prev, n, 100_000) is due


def test_the_draws_fit_on_every_row_and_on_a_sample_when_there_are_too_many(monkeypatch):
    """``first_draws`` fits its law's centre on every row up to ``FIRST_MAP_ROWS`` and on a uniform
    sample of that many beyond (statistics scaled to all). Both give draws for every one asked; on
    the stationary 5 clusters (6,000 rows, 300 draws, 3 seeds) the estimate from a fit on every row
    is -21,698 to -21,696 nats, from a 1,000-row sample's fit 12-38 nats lower (its centre sits
    about sqrt(n / R - 1) posterior sds off the mode): why every row is used (issue 20)."""
    x = D.gmm_data(6_000, 0)
    m = build_model("gmm:components=5", n_columns=2)
    rows = m.featurize(x)

    def estimate(seed: int) -> float:
        theta, log_q = m.first_draws(rows, torch.Generator().manual_seed(seed), 300)
        lw = (m.log_prior(theta) + m.total_log_likelihood(theta, rows) - log_q).numpy()
        assert theta.shape == (300, m.dim) and np.isfinite(lw).all()
        return float(np.logaddexp.reduce(lw) - math.log(300))

    every = [estimate(s) for s in range(3)]
    monkeypatch.setattr(type(m), "FIRST_MAP_ROWS", 1_000)
    sample = [estimate(s) for s in range(3)]
    assert np.mean(every) > np.mean(sample) + 5.0, (every, sample)  # measured 12-38 nats apart


def test_the_laplace_information_and_gradient_are_the_log_posteriors():
    """``_laplace_pass`` (Louis's identity, plus the prior's curvature) and ``_laplace_gradient`` (one E
    step's sums) against autograd of the log posterior in v = (eta, mu, log var), at a point that is
    no mode (K = 3, d = 2, 200 rows, rows standing for 1.5 each). Measured 1e-12 apart; a missing term
    (the missing information, or the prior) is off by tens."""
    from models.mixture import _laplace_gradient, _laplace_pass

    rng = np.random.default_rng(0)
    k, d, weight = 3, 2, 1.5
    y = rng.normal(size=(200, d)) + rng.integers(0, 3, size=(200, 1)) * 2.0
    w = np.array([0.2, 0.3, 0.5])
    mu = rng.normal(size=(k, d))
    var = np.exp(0.3 * rng.normal(size=(k, d)))

    def log_post(v):
        eta = torch.cat([v[: k - 1], torch.zeros(1, dtype=v.dtype)])
        lw = eta - torch.logsumexp(eta, 0)
        m, s = v[k - 1 : k - 1 + k * d].reshape(k, d), v[k - 1 + k * d :].reshape(k, d)
        ld = (-0.5 * (math.log(2 * math.pi) + s[None] + (torch.from_numpy(y)[:, None] - m[None]) ** 2 / torch.exp(s)[None])).sum(-1)
        prior = lw.sum() + (-s - torch.exp(-s)).sum() - 0.5 * (s + m * m * torch.exp(-s) / 4.0).sum()
        return weight * torch.logsumexp(ld + lw[None], 1).sum() + prior

    v0 = torch.from_numpy(np.concatenate([np.log(w[:-1] / w[-1]), mu.ravel(), np.log(var).ravel()]))
    hess = torch.autograd.functional.hessian(log_post, v0).numpy()
    grad = torch.autograd.functional.jacobian(log_post, v0).numpy()
    feats = np.concatenate([np.ones((200, 1)), y, y * y], 1)
    assert np.abs(_laplace_pass(y, weight, w, mu, var) + hess).max() < 1e-8 * np.abs(hess).max()
    assert np.abs(_laplace_gradient(y, feats, weight, w, mu, var) - grad).max() < 1e-8 * np.abs(grad).max()


def test_the_fresh_draws_are_a_density_with_the_laplace_law_in_the_mix():
    """``first_draws`` draws half from the Laplace law (a multivariate t around the posterior's mode,
    components in a random order) and half from the configuration law, and gives the mixture's
    density. Then E_q[r / q] = 1 for a density r: here the Laplace law's own density written out
    with the sum over every label order (not only the near ones ``_laplace_log_q`` keeps), so r / q
    <= 2. K = 2, d = 1, 400 rows of two clusters, 20,000 draws, seeds 1-3: measured 1.0001, 1.0021,
    1.0061 with a standard error of 0.0039; the tolerance is 5 of them. Without the log K! in
    ``_laplace_log_q`` the mean is 0.61 (the test can fail)."""
    from models.mixture import ModeFit, _logsumexp, _map_em

    model = build_model("gmm:components=2", 1)
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(150, 1, generator=g, dtype=torch.float64) * 0.5 - 2.0,
                   torch.randn(250, 1, generator=g, dtype=torch.float64) + 3.0])
    rows = model.featurize(x)
    fit = ModeFit(0.0, torch.tensor([[math.log(0.4), math.log(0.6), -2.0, 3.0, math.log(0.25), 0.0]], dtype=torch.float64), 400)
    t = fit.theta[0].numpy()
    w, mu, var = _map_em(x.numpy(), np.exp(t[:2] - _logsumexp(t[:2], 0)), t[2:4].reshape(2, 1), np.exp(t[4:]).reshape(2, 1),
                         model.FIRST_MAP_STEPS)
    lap = model._laplace(x.numpy(), 1.0, w, mu, var)
    assert lap is not None
    nu, dp = model.LAPLACE_DOF, len(lap.mode)
    const = (math.lgamma(0.5 * (nu + dp)) - math.lgamma(0.5 * nu) - 0.5 * dp * math.log(nu * math.pi)
             + float(np.log(np.diag(lap.chol)).sum()))
    m = 20_000
    theta, log_q = model.first_draws(rows, torch.Generator().manual_seed(1), m, fit=fit, laplace=True)
    th = theta.numpy()
    terms = []
    for order in ([0, 1], [1, 0]):
        z, mu_, s_ = th[:, order], th[:, 2:4][:, order], th[:, 4:6][:, order]
        v = np.stack([z[:, 0] - z[:, 1], mu_[:, 0], mu_[:, 1], s_[:, 0], s_[:, 1]], 1)
        u = (v - lap.mode[None]) @ lap.chol
        terms.append(const - 0.5 * (nu + dp) * np.log1p((u * u).sum(1) / nu))
    log_s = np.logaddexp(th[:, 0], th[:, 1])
    log_r = np.logaddexp(*terms) - math.log(2.0) + 2 * log_s - np.exp(log_s)  # Gamma(2, 1) on S, times S
    ratio = np.exp(log_r - log_q.numpy())
    se = ratio.std() / math.sqrt(m)
    assert abs(ratio.mean() - 1.0) < 5 * se, (ratio.mean(), se)


def test_the_laplace_law_gives_the_fresh_estimates_an_effective_sample(monkeypatch):
    """The mode checks' fresh estimates (``first_draws``) on the late clusters at 30,000 rows (3
    clusters, 2 more from 25,000), 300 draws: with the configuration law alone (``LAPLACE_SHARE`` 0,
    as before 2026-11-28) the effective sample was 1.5-2.8 and the estimates 3-9 nats below
    -111,111 (3 seeds); with half the draws from the Laplace law 28-90 and -111,110.9 to -111,111.1.
    The thresholds sit between."""
    x = D.distribution_shift_data(30_000, 0, changes=(25_000, 10**12))[0]
    m = build_model("gmm:components=5", n_columns=2)
    rows = m.featurize(x)
    found = m.mode_fit(rows.new_zeros((1, m.dim)), rows, torch.Generator().manual_seed(30_000), rows, 1.0,
                       joint=torch.zeros(1, dtype=torch.float64))

    def draws(seed: int) -> tuple[float, float]:
        theta, log_q = m.first_draws(rows, torch.Generator().manual_seed(seed), 300, fit=found, laplace=True)
        lw = (m.log_prior(theta) + m.total_log_likelihood(theta, rows) - log_q).numpy()
        wts = np.exp(lw - lw.max())
        return float(np.logaddexp.reduce(lw) - math.log(300)), float(wts.sum() ** 2 / (wts * wts).sum())

    laplace = [draws(s) for s in (7, 1007)]
    assert all(ess > 10 for _, ess in laplace), laplace
    monkeypatch.setattr(GaussianMixture, "LAPLACE_SHARE", 0.0)
    alone = [draws(s) for s in (7, 1007)]
    assert all(ess < 5 for _, ess in alone), alone
    assert min(e for e, _ in laplace) > max(e for e, _ in alone), (laplace, alone)


def test_beyond_eight_components_the_fresh_draws_cover_every_label_order(monkeypatch):
    """Beyond ``CONFIG_MAX_PERMUTED`` components the fresh estimate's draws stayed in the fit's order:
    they cover one of the posterior's K! relabelled copies, and the estimate came out log K! low
    (K = 9, 5,000 rows of nine separated clusters: 12.64-12.84 nats below the Laplace reference of
    ``bench.reference``, which takes minutes here). Now, where the fit's components are apart
    (``_labels_apart``), the draws come in a random order with the matched term of the density's
    sum: within 0.16 nats of the reference (3 seeds), and exactly log K! above the fit-order
    estimate from the same draws (measured 12.80 for K = 9, 19.99 for K = 12). With a duplicated
    component (K = 10 on the nine clusters) the fit's components are not apart and the draws keep
    its order."""
    rng = np.random.default_rng(0)
    centres = np.array([[6.0 * (i % 4), 6.0 * (i // 4)] for i in range(9)])
    x = torch.from_numpy(centres[rng.integers(0, 9, 5_000)] + rng.normal(size=(5_000, 2)))

    def estimate(k: int) -> float:
        m = build_model(f"gmm:components={k}", 2)
        rows = m.featurize(x)
        found = m.mode_fit(rows.new_zeros((1, m.dim)), rows, torch.Generator().manual_seed(1), rows, 1.0,
                           joint=torch.zeros(1, dtype=torch.float64))
        theta, log_q = m.first_draws(rows, torch.Generator().manual_seed(0), 300, fit=found, laplace=True)
        lw = (m.log_prior(theta) + m.total_log_likelihood(theta, rows) - log_q).numpy()
        return float(np.logaddexp.reduce(lw) - math.log(300))

    relabelled, duplicated = estimate(9), estimate(10)
    monkeypatch.setattr(GaussianMixture, "LABEL_GAP", math.inf)  # never apart: the fit's order
    assert abs(relabelled - estimate(9) - math.lgamma(10)) < 0.05  # measured 12.80 = log 9!
    assert estimate(10) == duplicated  # not apart either way: the same draws and estimate


@pytest.mark.parametrize("d, loc, scale", [(1, 1000.0, 0.01), (3, 7.0, 3.0), (2, -5000.0, 100.0)])
def test_a_one_component_fresh_estimate_matches_the_exact_gaussian_evidence(d, loc, scale):
    """A mixture of one component is the Normal-Inverse-Gamma Gaussian with kappa0 = 1/4 (means
    N(0, 4 sigma^2), variances InvGamma(1, 1); its weight integrates out), whose evidence is exact
    (``gaussian:kappa0=0.25``). The mode check's fresh estimate (``first_draws`` with the Laplace
    law, 300 draws, 3,000 rows in raw units) against it: measured within 0.04 nats on seeds 0-2 of
    each case (effective samples 190-250 of 300); the tolerance is 0.2. The Laplace law's
    information also had no case for K = 1 (no weight ratios): it raised there until 2026-11-28."""
    x = torch.randn(3_000, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * scale + loc
    m = build_model("gmm:components=1", d)
    rows = m.featurize(x)
    found = m.mode_fit(rows.new_zeros((1, m.dim)), rows, torch.Generator().manual_seed(1), rows, 1.0,
                       joint=torch.zeros(1, dtype=torch.float64))
    g = build_model("gaussian:kappa0=0.25", d)
    exact = float(g.exact_update(g.exact_init(), g.featurize(x))[1])
    for seed in range(3):
        theta, log_q = m.first_draws(rows, torch.Generator().manual_seed(seed), 300, fit=found, laplace=True)
        lw = (m.log_prior(theta) + m.total_log_likelihood(theta, rows) - log_q).numpy()
        assert abs(float(np.logaddexp.reduce(lw) - math.log(300)) - exact) < 0.2, seed


def test_a_one_component_stream_runs_its_checks_and_ends_near_the_exact_evidence():
    """The same one-component mixture through the sampler (5,000 rows in raw units, chunks of 500):
    its mode checks at 1,024, 2,048 and 4,096 run the fresh estimate (which raised for K = 1 before
    2026-11-28) and the run ends within a few nats of the exact evidence. Measured, d = 1 (around
    1,000, sd 0.01) and d = 2 (around -5,000, sd 100), seeds 0-2: -2.1 to -0.2 nats, restated by up
    to 8.7 at the checks; the tolerance is 10."""
    from service.sgais import SGAISConfig as Config

    for d, loc, scale in ((1, 1000.0, 0.01), (2, -5000.0, 100.0)):
        x = torch.randn(5_000, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * scale + loc
        g = build_model("gaussian:kappa0=0.25", d)
        exact = float(g.exact_update(g.exact_init(), g.featurize(x))[1])
        results = [r for _, r, _ in build_sampler(build_model("gmm:components=1", d), Config()).run(x, 500, seed=0)]
        assert any(r.restated for r in results)  # the checks' fresh estimates ran
        assert abs(results[-1].log_evidence - exact) < 10.0, (d, results[-1].log_evidence - exact)


def test_the_first_mode_checks_restate_a_mixture_that_small_chunks_left_in_a_poor_mode(monkeypatch):
    """The stationary 5-cluster data in raw units (offset 1000, scale 100), K = 5, 1,000 rows in chunks
    of 12, against the Laplace reference (``bench.reference``). Annealed through chunks of a few rows,
    the particles sit in a poor mode for the first hundred rows or so; while the first mode check was
    at 1,024 rows, the evidence at 1,000 was -198 to -628 nats off (sampler seeds 0-5), and model
    probabilities with it. From ``FIRST_MODE_CHECK`` = 64 the checks restate it: -8 to -64 (the same
    seeds; -8.7 to +0.7 when those checks also drew the particles afresh, ``REDRAW_FROM``)."""
    from bench.reference import laplace_log_evidence
    from service.sgais import engine

    x = 1000.0 + 100.0 * D.gmm_data(1_000, 0)
    model = build_model("gmm:components=5", n_columns=2)
    ref = laplace_log_evidence(model, model.featurize(x)).log_evidence

    def error(seed: int) -> float:
        return [s for s, _, _ in build_sampler(model, SGAISConfig()).run(x, 12, seed=seed)][-1].log_evidence - ref

    for seed in (0, 1):
        assert -100.0 < error(seed) < 10.0, seed  # measured -27 and -53
    monkeypatch.setattr(engine, "FIRST_MODE_CHECK", 1024)
    assert error(0) < -150.0  # measured -420 (-198 to -628 on seeds 0-5): the check above can fail


def test_a_cluster_appearing_early_in_a_stream_is_checked_soon_after(monkeypatch):
    """Two clusters in raw units (latency and bytes), a third from row 1,500, K = 3, chunks of 100,
    against the Laplace reference at 2,000 rows. The first 5,000 rows had no surprise test, so the
    new cluster's losses stayed until the power-of-two check at 2,048 (on another draw of these
    clusters, -142 and -208 nats at 2,000). The test now runs there too, and the check
    ``SURPRISE_EARLY_CHECK`` rows after the surprising chunk restates the evidence: 0.0 and -1.1
    (sampler seeds 0 and 1); without that check (the control), -103 and -120."""
    from bench.reference import laplace_log_evidence
    from service.sgais import engine

    rng = np.random.default_rng(11)
    n = 2000
    a = np.c_[rng.normal(120, 10, n), rng.normal(2e4, 2e3, n)]
    b = np.c_[rng.normal(350, 25, n), rng.normal(6e4, 5e3, n)]
    c = np.c_[rng.normal(900, 60, n), rng.normal(2.5e5, 2e4, n)]
    lab = np.where(np.arange(n) < 1500, rng.integers(0, 2, n), rng.integers(0, 3, n))
    x = torch.from_numpy(np.where(lab[:, None] == 0, a, np.where(lab[:, None] == 1, b, c)))
    model = build_model("gmm:components=3", n_columns=2)
    ref = laplace_log_evidence(model, model.featurize(x)).log_evidence

    def error(seed: int) -> float:
        return [s for s, _, _ in build_sampler(model, SGAISConfig()).run(x, 100, seed=seed)][-1].log_evidence - ref

    assert -20.0 < error(0) < 10.0
    monkeypatch.setattr(engine, "SURPRISE_EARLY_CHECK", 10**9)
    assert error(0) < -50.0  # the check above can fail


@pytest.mark.parametrize("chunk", [12, 100])
def test_stationary_clusters_raise_no_surprise_while_the_particles_learn(chunk):
    """The surprise test runs in a stream's first 5,000 rows too (``SURPRISE_MIN_HISTORY`` rows of
    history on). A false surprise there would set the checks' schedule, and none is taken again until
    it has run: 5 stationary clusters (raw units too, measured), chunks of 12, 100 and 500, 2 sampler
    seeds: none."""
    x = 1000.0 + 100.0 * D.gmm_data(5_000, 1)
    sampler = build_sampler(build_model("gmm:components=5", n_columns=2), SGAISConfig())
    marks = {s.surprise_n for s, _, _ in sampler.run(x, chunk, seed=0)}
    assert marks == {0}, marks

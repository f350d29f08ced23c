"""The mixture's check against its dominant mode (Model.mode_gap, Sampler._check_modes): SGAIS
particles all stuck in a poor mode (issue 20: two clusters in one component, one component with
no data) are flagged 'stuck_mode'; healthy runs are not; the check draws from its own generator,
so the sampler's numbers do not change."""

import numpy as np
import pytest
import torch

from models import build_model
from models.mixture import GaussianMixture
from service.sgais import SGAISConfig, SGAISState, build_sampler


def clusters(centres, n=20_000, seed=0):
    rng = np.random.default_rng(seed)
    lab = rng.integers(0, len(centres), n)
    return torch.as_tensor(np.array(centres, dtype=float)[lab] + rng.standard_normal((n, 2)))


def run(k, data, seed, preset="paper-plain"):
    """The check is tested on the paper's plain sampler, which gets stuck; the default (mode jumps)
    frees those runs (test_mode_jumps_free_the_stuck_runs)."""
    sampler = build_sampler(build_model(f"gmm:components={k}", 2), SGAISConfig.preset(preset))
    results = [(s, r) for s, r, _ in sampler.run(data, 500, seed)]
    return results


@pytest.mark.parametrize("seed,stuck", [(0, True), (2, True), (3, False)])
def test_stuck_mixtures_are_flagged(seed, stuck):
    """Three separated clusters, K = 3, 20,000 rows, the paper's plain sampler (``paper-plain``: no mode
    jumps), judged against the Laplace
    reference at the global mode (bench/reference.py, validated there by importance sampling).
    Measured: seeds 0 and 2 end stuck, 14,268 and 21,748 nats below the reference, their particles
    11,699 and 17,857 nats below the EM mode (limit max(10 D, 1e-3 of the log joint) = 150): flagged.
    Seed 3 ends in the dominant mode (gap 11.6; 453 nats low from earlier chunks): not flagged."""
    from bench.reference import laplace_log_evidence

    data = clusters([[-4, 0], [4, 0], [0, 5]], seed=seed)
    state, last = run(3, data, seed)[-1]
    m = build_model("gmm:components=3", 2)
    error = last.log_evidence - laplace_log_evidence(m, m.featurize(data)).log_evidence
    if stuck:
        assert error < -5000 and state.mode_gap > 10 * state.mode_limit, (error, state.mode_gap)
        assert "stuck_mode" in last.warnings and not last.reliable
    else:
        assert error > -1000 and state.mode_gap < state.mode_limit and last.reliable, (error, state.mode_gap)


@pytest.mark.parametrize("seed", range(6))
def test_mode_jumps_free_the_stuck_runs(seed):
    """The same data with the default sampler (mode jumps, service/sgais/engine.py ``_jump``; first-
    chunk warm-up). Measured, seeds 0-5: the plain sampler ends -14,268, -1,067, -21,748, -453,
    -9,682, -21,605 nats from the reference (five runs flagged); the default -47.4, -34.8, -30.5,
    -35.6, -38.1, -47.0 (|reference| about 8e4: relative < 1e-3), never flagged. The bound, 150 nats,
    is 3x the worst measured; a run stuck as the plain ones are misses it by thousands."""
    from bench.reference import laplace_log_evidence

    data = clusters([[-4, 0], [4, 0], [0, 5]], seed=seed)
    results = run(3, data, seed, preset="paper")
    m = build_model("gmm:components=3", 2)
    error = results[-1][1].log_evidence - laplace_log_evidence(m, m.featurize(data)).log_evidence
    assert -150 < error < 20, error  # measured -47.4 .. -30.5
    assert all(r.reliable for _, r in results)


@pytest.mark.parametrize("seed", range(3))
def test_healthy_mixtures_are_not_flagged(seed):
    """Two separated clusters, K = 2: the particles sample the dominant mode, no warning on any chunk.
    Measured gaps, the EM fit refined on all 20,000 rows: 16.4, 36.7, 13.7 nats (seeds 0-2; 3.2 and
    7.4 at seeds 3 and 5). Posterior samples sit about D/2 = 5 below the mode, so SGHMC's particles
    lag it by up to about 30 more; the limit is 100, the bound half of it. (Seed 4 of the same data
    ends stuck, 7,558 nats below, and is flagged: SGAIS's problem, not the check's.)"""
    results = run(2, clusters([[-3, 0], [3, 0]], seed=seed), seed)
    assert all(r.reliable for _, r in results)
    state = results[-1][0]
    assert abs(state.mode_gap) < state.mode_limit / 2


def test_the_gap_is_zero_at_the_mode_itself():
    m = build_model("gmm:components=2", 2)
    rows = m.featurize(clusters([[-3, 0], [3, 0]], n=4000))
    y = rows[:, :2].numpy()
    lab = (y[:, 0] > 0).astype(int)
    theta = torch.tensor([np.log(np.mean(lab == j)) for j in (0, 1)]
                         + [v for j in (0, 1) for v in y[lab == j].mean(0)]
                         + [v for j in (0, 1) for v in np.log(y[lab == j].var(0))], dtype=torch.float64)[None]
    gap = m.mode_gap(theta, rows, rows, 1.0, torch.Generator().manual_seed(0), rows, 1.0)
    assert abs(gap) < 1.0  # EM and the hard-assignment fit agree on separated clusters (measured 0.05)


def test_the_check_leaves_the_samplers_numbers_alone(monkeypatch):
    data = clusters([[-4, 0], [4, 0], [0, 5]], n=5000)
    on = [r.log_evidence for _, r in run(3, data, 1)]
    monkeypatch.setattr(GaussianMixture, "checks_modes", False)
    off = [r.log_evidence for _, r in run(3, data, 1)]
    assert on == off


def test_the_check_is_saved_with_the_state():
    state, _ = run(3, clusters([[-4, 0], [4, 0], [0, 5]], n=3000), 0)[-1]
    back = SGAISState.from_bytes(state.to_bytes())
    assert (back.mode_gap, back.mode_limit) == (state.mode_gap, state.mode_limit) and back.to_bytes() == state.to_bytes()


def test_a_stuck_seven_component_run_is_flagged_and_a_healthy_one_is_not():
    """The paper's 3 -> 5 -> 7 clusters (data seed 1), K = 7, default sampler, 66,000 rows (the check
    runs at 65,536). Measured against the Laplace reference (-275,676, 33 s, not recomputed here):
    sampler seed 1 ends 2,170 nats low, its particles with a duplicate on one cluster and one
    component over two others; seed 0 ends 867 low (lost while the new clusters appeared) but in the
    dominant mode. The check before (2 EM restarts on 2,000 rows, judged on 2,000 others) reported a
    gap of -7,211 at seed 1 (its own fit far below the particles) and did not flag it. Now: 770 at
    seed 1 and -7 at seed 0 (limit 350)."""
    from bench import data as D

    x, _ = D.distribution_shift_data(100_000, 1)
    sampler = build_sampler(build_model("gmm:components=7", 2), SGAISConfig.preset("paper"))
    stuck, last = [(s, r) for s, r, _ in sampler.run(x[:66_000], 500, 1)][-1]
    assert stuck.mode_gap > stuck.mode_limit and "stuck_mode" in last.warnings, stuck.mode_gap
    healthy, last = [(s, r) for s, r, _ in sampler.run(x[:66_000], 500, 0)][-1]
    assert abs(healthy.mode_gap) < healthy.mode_limit / 2 and last.reliable, healthy.mode_gap

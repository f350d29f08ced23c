"""The exact method (service/sgais/exact.py): conjugate models' closed-form evidence, checked
against references computed here independently of the models' code: the Normal-Inverse-Gamma
marginal in plain Python (the formula of ../shared/tools/evidence_check.py) and, for linear
regression, the dense Gaussian log N(y; 0, noise^2 I + s^2 X X^T) in 60-digit arithmetic
(mpmath), so raw units (offsets of 1e6, scales of 1e-4) cannot hide in float64 rounding of the
reference itself."""

import math

import mpmath
import numpy as np
import pytest
import torch

import cusp
from models import ModelError, build_model
from models.mixture import RESTART_KAPPA0
from service.detect import DetectorConfig, OfflineRun
from service.sgais import ExactSampler, ExactState, Reservoir, Sampler, SGAISConfig, build_sampler, load_state

LOCS = (-1e6, -3e4, 0.0, 0.002, 250.0, 1e6)
SCALES = (1e-4, 1e-2, 1.0, 20.0, 1e4)


def nig_reference(y: np.ndarray, m0=0.0, k0=1.0, a0=1.0, b0=1.0) -> float:
    """log p(y) per column under mu | s2 ~ N(m0, s2/k0), s2 ~ IG(a0, b0), summed; sums in math.fsum."""
    total = 0.0
    n = y.shape[0]
    for col in y.T:
        vals = [float(v) for v in col]
        ybar = math.fsum(vals) / n
        ss = math.fsum((v - ybar) ** 2 for v in vals)
        kn, an = k0 + n, a0 + n / 2
        bn = b0 + 0.5 * ss + k0 * n * (ybar - m0) ** 2 / (2 * kn)
        total += (math.lgamma(an) - math.lgamma(a0) + a0 * math.log(b0) - an * math.log(bn)
                  + 0.5 * math.log(k0 / kn) - 0.5 * n * math.log(2 * math.pi))
    return total


def linear_reference(x: np.ndarray, y: np.ndarray, noise=1.0, prior_scale=1.0) -> float:
    """log N(y; 0, noise^2 I + s^2 Xa Xa^T), Xa = (x, 1), in 60-digit arithmetic."""
    with mpmath.workdps(60):
        n = len(y)
        xa = [[mpmath.mpf(float(v)) for v in row] + [mpmath.mpf(1)] for row in x]
        s2, v = mpmath.mpf(prior_scale) ** 2, mpmath.mpf(noise) ** 2
        cov = mpmath.matrix(n, n)
        for i in range(n):
            for j in range(n):
                cov[i, j] = s2 * mpmath.fsum(a * b for a, b in zip(xa[i], xa[j])) + (v if i == j else 0)
        chol = mpmath.cholesky(cov)
        yv = mpmath.matrix([mpmath.mpf(float(t)) for t in y])
        z = mpmath.lu_solve(chol, yv)  # chol is lower-triangular: forward substitution
        logdet = 2 * mpmath.fsum(mpmath.log(chol[i, i]) for i in range(n))
        return float(-0.5 * n * mpmath.log(2 * mpmath.pi) - 0.5 * logdet - 0.5 * mpmath.fsum(t * t for t in z))


def run_exact(spec: str, data: torch.Tensor, chunk: int, seed: int = 0):
    model = build_model(spec, data.shape[1])
    sampler = build_sampler(model, SGAISConfig())
    assert isinstance(sampler, ExactSampler)
    results = [r for _, r, _ in sampler.run(data, chunk, seed)]
    return results


def test_a_framed_gaussian_restart_is_centred_at_the_incumbents_mean():
    """`gaussian:warmup=5` (the default of a stream of several columns), two columns: the first
    moves by 30 sds at 100 and the model restarts there (a change adopted), then again at 200 with
    nothing changed. The second restart, fed rows 200-299, predicts rows 210-299 as well as a fresh
    model on them (its own warm-up at 200-204): measured, restart less fresh, seeds 0-7, -0.12 to
    +0.89 nats (-0.02 to +0.97 with the restart's kappa 1, before RESTART_KAPPA0). Centred at the
    warm-up's mean, as before 2026-12-07, -81 to -102: the prior's mean term, kappa0 (30 / scale)^2
    / 2, went into the noise variance. Bound -10."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        y = rng.normal(0, 1, (300, 2))
        y[100:, 0] += 30
        rows = torch.from_numpy(y)
        m = build_model("gaussian:warmup=5", 2)
        post, _ = m.exact_update(m.exact_init(), rows[:100])
        first = m.exact_restart(post)
        post, _ = m.exact_update(first, rows[100:200])
        again = m.exact_restart(post)
        (centre, scale), (moved, same) = m.frame(first), m.frame(again)
        # the posterior mean of the first column's level: the 100 rows' mean, shrunk towards the first
        # restart's centre by k / (k + 100), k the restart's kappa (RESTART_KAPPA0)
        mean, k = float(y[100:200, 0].mean()), RESTART_KAPPA0
        assert same == scale and moved[0] == pytest.approx(centre[0] + (mean - centre[0]) * 100 / (100 + k), rel=1e-12)
        restarted = m.exact_update(m.exact_update(again, rows[200:210])[0], rows[210:])[1]
        fresh = m.exact_update(m.exact_update(m.exact_init(), rows[200:210])[0], rows[210:])[1]
        assert restarted - fresh > -10.0, (seed, restarted - fresh)


@pytest.mark.parametrize("loc", LOCS)
@pytest.mark.parametrize("scale", SCALES)
def test_gaussian_exact_evidence_in_raw_units(loc, scale):
    """Every column located anywhere in +-1e6 with scales from 1e-4 to 1e4, two columns at once,
    chunks of 1, 7 and 500: the running log-evidence equals the reference to 1e-9 relative
    (the issue asks 1e-3; measured: below 1e-13)."""
    rng = np.random.default_rng(int(abs(loc) + 1000 * scale) % 2**32)
    y = np.column_stack([rng.normal(loc, scale, 1500), rng.normal(-loc / 3, scale * 7, 1500)])
    ref = nig_reference(y)
    for chunk in (1, 7, 500):
        got = run_exact("gaussian", torch.from_numpy(y), chunk)[-1].log_evidence
        assert abs(got - ref) <= 1e-9 * abs(ref), (chunk, got, ref)


def test_gaussian_exact_evidence_with_other_priors():
    rng = np.random.default_rng(5)
    y = rng.normal(3.0, 0.5, (400, 1))
    got = run_exact("gaussian:mu0=2.5,kappa0=0.1,alpha0=3,beta0=0.2", torch.from_numpy(y), 33)[-1].log_evidence
    assert got == pytest.approx(nig_reference(y, 2.5, 0.1, 3.0, 0.2), rel=1e-12)


@pytest.mark.parametrize("loc,scale", [(0.0, 1.0), (250.0, 20.0), (1e3, 1e-2), (-3e4, 50.0), (1e6, 1e-4), (1e4, 1e4)])
def test_linear_regression_exact_evidence_in_raw_units(loc, scale):
    """Features located at ``loc`` with spread ``scale``, the target in the same units; 60 rows,
    chunks of 1, 7 and 60, against the 60-digit dense reference (1e-7 relative; measured: the
    worst case, x at 1e6 +- 1e-4, is 2.6e-11)."""
    rng = np.random.default_rng(11)
    x = rng.normal(loc, scale, (60, 2))
    y = 0.7 * (x[:, 0] - loc) / scale - 0.2 * (x[:, 1] - loc) / scale + rng.normal(loc, scale, 60)
    ref = linear_reference(x, y)
    data = torch.from_numpy(np.column_stack([x, y]))
    for chunk in (1, 7, 60):
        got = run_exact("linear-regression", data, chunk)[-1].log_evidence
        assert abs(got - ref) <= 1e-7 * abs(ref), (chunk, got, ref)


@pytest.mark.parametrize("spec,cols", [("gaussian", 2), ("linear-regression:noise=0.5,prior_scale=2", 3)])
def test_row_predictive_is_the_one_row_update(spec, cols):
    model = build_model(spec, cols)
    data = torch.randn(50, cols, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 4 + 10
    rows = model.featurize(data)
    post, _ = model.exact_update(model.exact_init(), rows[:40])
    per_row = model.exact_row_log_predictive(post, rows[40:])
    one = torch.tensor([model.exact_update(post, rows[i : i + 1])[1] for i in range(40, 50)], dtype=torch.float64)
    assert torch.allclose(per_row, one, rtol=1e-12, atol=1e-12)
    assert model.exact_log_evidence(rows) == pytest.approx(sum(model.exact_update(model.exact_init(), rows)[1:]), rel=1e-15)


def test_conjugate_models_default_to_exact_and_sgais_on_request():
    assert isinstance(build_sampler(build_model("gaussian", 1)), ExactSampler)
    assert isinstance(build_sampler(build_model("linear-regression", 3)), ExactSampler)
    assert isinstance(build_sampler(build_model("gaussian:sampler=exact", 1)), ExactSampler)
    assert isinstance(build_sampler(build_model("gaussian:sampler=sgais", 1)), Sampler)
    assert isinstance(build_sampler(build_model("gmm:components=2", 1)), Sampler)
    m = build_model("gaussian:sampler=sgais", 1)
    assert "sampler=sgais" in m.spec() and build_model(m.spec(), 1) == m
    assert "sampler" not in build_model("gaussian", 1).spec()
    with pytest.raises(ModelError, match="no closed-form evidence"):
        build_model("gmm:sampler=exact", 1)
    with pytest.raises(ModelError, match="sampler must be"):
        build_model("gaussian:sampler=magic", 1)


def test_exact_sampler_resumes_bit_for_bit_and_does_not_mutate():
    data = torch.randn(900, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 3 + 1e4
    model = build_model("gaussian", 2)
    cfg = SGAISConfig(reservoir_capacity=300)
    sampler = ExactSampler(model, cfg)
    straight = [(s, r) for s, r, _ in sampler.run(data, 100, 4)]
    for state, _, reservoir in sampler.run(data[:400], 100, 4):
        pass
    state2 = load_state(state.to_bytes())
    assert isinstance(state2, ExactState) and state2.to_bytes() == state.to_bytes()
    res2 = Reservoir.from_bytes(300, model.feature_width, reservoir.to_bytes())
    snap, res_snap, chunk = state2.to_bytes(), res2.data.clone(), data[400:500].clone()
    sampler.update(state2, chunk, res2)
    assert state2.to_bytes() == snap and torch.equal(res2.data, res_snap) and torch.equal(chunk, data[400:500])
    resumed = [(s, r) for s, r, _ in sampler.run(data[400:], 100, 0, state=state2, reservoir=res2)]
    for (a, ra), (b, rb) in zip(straight[4:], resumed):
        assert a.to_bytes() == b.to_bytes() and ra.log_evidence == rb.log_evidence
    assert reservoir.size == 300  # the reservoir sample is kept like SGAIS's
    r = straight[-1][1]
    assert r.method == "exact" and r.annealing_steps == 0 and r.ess_after is None
    # (1e4 +- 3 under the prior's mu0 = 0: the prior's mean term holds most of the noise the model expects)
    assert r.warnings == ("prior_conflict",) and not r.reliable
    with pytest.raises(ValueError, match="not a"):
        load_state(b"junk")


def test_exact_sampler_rejects_bad_chunks_and_changes_nothing():
    sampler = build_sampler(build_model("gaussian", 2))
    state, res = sampler.init(0), sampler.new_reservoir()
    raw = state.to_bytes()
    with pytest.raises(ValueError, match="NaN or infinite"):
        sampler.update(state, torch.tensor([[1.0, float("inf")]], dtype=torch.float64), res)
    with pytest.raises(ModelError, match="columns"):
        sampler.update(state, torch.zeros(3, 3, dtype=torch.float64), res)
    with pytest.raises(ValueError, match="empty"):
        sampler.update(state, torch.zeros(0, 2, dtype=torch.float64), res)
    assert state.to_bytes() == raw and res.size == 0


def test_sgais_on_raw_units_is_flagged_against_the_exact_value():
    """With the exact method switched off (sampler=sgais), raw units (N(250, 20^2), the issue's
    latency case) leave SGAIS's particles far from the posterior: its log-evidence is tens of
    percent off (measured 57% at 20,000 points; here 5,000), and every result says so. On
    standardized data the same check stays quiet (measured: 1.4e-3 relative after the first chunk,
    under 5e-4 after that; the tolerance is 1e-2)."""
    rng = np.random.default_rng(0)
    raw = torch.from_numpy(rng.normal(250.0, 20.0, (5000, 1)))
    sampler = build_sampler(build_model("gaussian:sampler=sgais", 1), SGAISConfig())
    results = [r for _, r, _ in sampler.run(raw, 500, 0)]
    last = results[-1]
    assert abs(last.log_evidence - last.reference_log_evidence) > 0.1 * abs(last.reference_log_evidence)
    assert all("reference_mismatch" in r.warnings and not r.reliable for r in results[1:])
    assert last.to_dict()["warnings"] == ["reference_mismatch"] and last.to_dict()["reliable"] is False
    calm = [r for _, r, _ in sampler.run((raw - 250.0) / 20.0, 500, 0)]
    assert all(r.reliable for r in calm), [r.warnings for r in calm]
    exact = run_exact("gaussian", raw, 500)[-1]
    assert exact.log_evidence == pytest.approx(last.reference_log_evidence, rel=1e-12)


def test_the_reference_beside_sgais_counts_from_the_same_rows_after_a_change():
    """`gaussian:sampler=sgais`, +3 sd at 250, chunks of 10: the change is adopted, and the log-evidence
    goes on over both segments. The exact reference beside it did not: it was the new segment's
    alone (-368 against -713, a held-out trial). Now both count the segments before the restart the
    same way: within 10 nats at every chunk (measured at most 3.3). And ``reference_mismatch`` needs
    1 nat as well as 1%: before the change (one segment, the flag computed on these very values)
    it is raised exactly where both are exceeded (the first chunks' 0.2-1 nats were flagged)."""
    from service.sgais.engine import REFERENCE_FLOOR, REFERENCE_TOLERANCE

    y = np.random.default_rng(11).standard_normal(500)
    y[250:] += 3.0
    det = cusp.Detector(models=["gaussian:sampler=sgais"], chunk_size=10, seed=0)
    det.update(y).flush()
    (name,) = det.names
    assert [e.location for e in det.events[name]] == [250]
    results = det.results[name]
    gaps = [abs(r.log_evidence - r.reference_log_evidence) for r in results]
    assert max(gaps) < 10.0, gaps
    before = results[:25]  # rows 0-249
    flagged = ["reference_mismatch" in r.warnings for r in before]
    assert flagged == [g > max(REFERENCE_TOLERANCE * abs(r.reference_log_evidence), REFERENCE_FLOOR)
                       for g, r in zip(gaps, before)]
    assert not all(flagged) and min(gaps[:25]) < 1.0


def test_detector_finds_a_shift_in_raw_units_with_the_exact_method():
    """A +50 ms shift at observation 8,000 of N(250, 20^2) latencies, chunks of 100: found, placed
    within one chunk, no false alarm (with SGAIS on the raw data this came late with two)."""
    rng = np.random.default_rng(1)
    y = np.concatenate([rng.normal(250, 20, 8000), rng.normal(300, 20, 4000)])[:, None]
    model = build_model("gaussian", 1)
    run = OfflineRun(build_sampler(model, SGAISConfig()), 0, DetectorConfig())
    events = []
    for lo in range(0, len(y), 100):
        events += run.step(torch.from_numpy(y[lo : lo + 100]))[1]
    assert [abs(e.location - 8000) <= 100 for e in events] == [True], [e.location for e in events]


def framed_reference(y: np.ndarray, warmup: int) -> float:
    """``gaussian:warmup=W``'s evidence, independently: each column's frame (mean and standard
    deviation, n - 1, of its first W values, in math.fsum), the paper's prior on (y - centre) /
    scale, log p(rows after W | the first W) = log p(all) - log p(first W) in the frame, less
    log scale for each scored row."""
    total = 0.0
    for col in y.T:
        head = [float(v) for v in col[:warmup]]
        c = math.fsum(head) / warmup
        s = math.sqrt(math.fsum((v - c) ** 2 for v in head) / (warmup - 1)) or 1.0  # flat integers: a unit of 1
        z = (col - c) / s
        total += nig_reference(z[:, None]) - nig_reference(z[:warmup, None]) - (len(col) - warmup) * math.log(s)
    return total


@pytest.mark.parametrize("loc,scale", [(0.0, 1.0), (250.0, 20.0), (1e6, 1e-4), (-3e4, 1e3), (0.002, 1e-4)])
def test_gaussian_with_a_warm_up_frame_has_exact_evidence_in_raw_units(loc, scale):
    """``gaussian:warmup=5`` (the default of a stream of several columns): two columns, 300 rows,
    chunks of 1, 7 and 300 (the warm-up split across chunks or not), against the reference above
    to 1e-9 relative; the frame is the first 5 rows' (``frame``), the warm-up rows are conditioned
    on and not scored (the first result's ``conditioned``), and a row's predictive is its one-row
    update."""
    rng = np.random.default_rng(int(abs(loc) + 1000 * scale) % 2**32)
    y = np.column_stack([rng.normal(loc, scale, 300), rng.normal(-loc / 3, scale * 7, 300)])
    if loc == 0.0:  # a third column flat at 5 through the warm-up (a unit of 1, its step), then moving
        y = np.column_stack([y, np.r_[np.full(5, 5.0), rng.integers(3, 8, 295)].astype(float)])
    ref = framed_reference(y, 5)
    for chunk in (1, 7, 300):
        results = run_exact("gaussian:warmup=5", torch.from_numpy(y), chunk)
        assert abs(results[-1].log_evidence - ref) <= 1e-9 * abs(ref), (chunk, results[-1].log_evidence, ref)
        assert sum(r.conditioned for r in results) == 5 and results[-1].n == 300
    model = build_model("gaussian:warmup=5", y.shape[1])
    rows = model.featurize(torch.from_numpy(y))
    post, _ = model.exact_update(model.exact_init(), rows[:40])
    centre, scale_ = model.frame(post)
    assert centre == pytest.approx(y[:5].mean(0), rel=1e-12, abs=1e-300)
    assert scale_ == pytest.approx(np.where(y[:5].std(0) > 0, y[:5].std(0, ddof=1), 1.0), rel=1e-9)
    assert post.numel() == 1 + 6 * y.shape[1]  # the warm-up rows are not kept once the frame is fixed
    per_row = model.exact_row_log_predictive(post, rows[40:50])
    one = torch.tensor([model.exact_update(post, rows[i : i + 1])[1] for i in range(40, 50)], dtype=torch.float64)
    assert torch.allclose(per_row, one, rtol=1e-12, atol=1e-12)
    assert model.frame(model.exact_update(model.exact_init(), rows[:4])[0]) is None  # still in its warm-up


def test_gaussian_warm_up_settings_are_checked():
    for bad in ("gaussian:warmup=1", "gaussian:warmup=-1", "gaussian:warmup=2.5", "gaussian:warmup=20000",
                "gaussian:warmup=true"):
        with pytest.raises(ModelError, match="warmup"):
            build_model(bad, 2)
    with pytest.raises(ModelError, match="warmup x columns must be at most 65,536"):
        build_model("gaussian:warmup=1000", 100)
    with pytest.raises(ModelError, match="row 2, column 1 has nan"):
        build_model("gaussian:warmup=5", 2).featurize(torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, math.nan]]))
    with pytest.raises(ModelError, match="exact method only"):
        build_model("gaussian:warmup=5,sampler=sgais", 2)
    assert build_model("gaussian:warmup=0,sampler=sgais", 2).warmup == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_framed_gaussian_finds_a_shift_far_from_zero(seed):
    """One column of 1,000 +- 5, +20 (4 sd) at 300: ``gaussian`` with the prior in data units
    never reports it (the prior's mean term keeps the noise it expects near 1,000^2 / rows: 58
    for 5 after 300 rows), ``gaussian:warmup=5`` does, within 20 rows point by point and in the
    first chunk of 10 after it, and nothing else; the default of a stream of two columns (1,000 +-
    5 and 5e4 +- 300, the shift in the first) likewise."""
    from models.registry import default_portfolio
    from service.detect import detect_series, detect_stream

    rng = np.random.default_rng(seed)
    y = 1000 + 5 * rng.standard_normal(600)
    y[300:] += 20
    assert detect_series(y, "gaussian", chunk_size=10, seed=0) == []
    for chunk in (1, 10):
        found = [(e.location, e.detected_at) for e in detect_series(y, "gaussian:warmup=5", chunk_size=chunk, seed=0)]
        assert len(found) == 1 and found[0][0] == 300 and found[0][1] <= 320, (chunk, found)
    two = np.column_stack([y, 5e4 + 300 * rng.standard_normal(600)])
    assert default_portfolio(2) == ("gaussian:warmup=5",)
    _, changes = detect_stream(two, chunk_size=10, seed=0)
    assert [c.location for c in changes] == [300], changes


def _conflicts(y: np.ndarray, mu0=0.0, kappa0=1.0, beta0=1.0, rows=20) -> np.ndarray:
    """For each row of a one-column series, ``Gaussian.exact_warnings``'s rule computed afresh from
    its definition, in float64 sums about the series' first value: after n >= ``rows`` rows, is
    beta0 + kappa0 n (ybar - mu0)^2 / (2 (kappa0 + n)) above S / 2?"""
    n = np.arange(1, len(y) + 1)
    d = y - y[0]
    s1, s2 = np.cumsum(d), np.cumsum(d * d)
    ybar = y[0] + s1 / n
    ss = s2 - s1 * s1 / n
    prior = beta0 + 0.5 * kappa0 * n / (kappa0 + n) * (ybar - mu0) ** 2
    return (n >= rows) & (prior > 0.5 * ss)


@pytest.mark.parametrize("chunk", [1, 7])
def test_gaussian_far_from_its_prior_says_so_and_a_frame_does_not(chunk):
    """`gaussian` in data units: where its prior holds more of the noise it expects than the data
    do, every result says ``prior_conflict`` (the model scores every row too low; a change within
    that noise goes unseen), as the rule computed afresh says, row for row at the end of each chunk:
    latency 250 +- 20 ms for its first ~150 rows, 1,000 +- 5 and a rate of 0.002 +- 1e-4 throughout.
    Standardised data (5 seeds, 2,000 rows) never; `gaussian:warmup=5` on the same series never."""
    g = np.random.default_rng(0)
    cases = {"latency": 250 + 20 * g.standard_normal(2000), "offset": 1000 + 5 * g.standard_normal(2000),
             "rate": 0.002 + 1e-4 * g.standard_normal(2000),
             **{f"unit{k}": g.standard_normal(2000) + (3.0 if k else 0.0) for k in range(5)}}
    for name, y in cases.items():
        data = torch.from_numpy(y[:, None])
        got = ["prior_conflict" in r.warnings for r in run_exact("gaussian", data, chunk)]
        want = _conflicts(y)[[min(lo + chunk, len(y)) - 1 for lo in range(0, len(y), chunk)]].tolist()
        assert got == want, name
        assert any(got) == (name in ("latency", "offset", "rate")), name
        assert not any("prior_conflict" in r.warnings for r in run_exact("gaussian:warmup=5", data, chunk)), name
    assert sum(_conflicts(cases["latency"])) in range(100, 200) and _conflicts(cases["rate"])[-1]


def test_a_shift_the_prior_hides_is_missed_with_a_warning_and_found_with_a_frame():
    """+5 sd at 150 in 100 +- 1, chunks of 10: `gaussian` in data units expects noise about 6x the
    data's spread (the prior's mean term, 100^2 / 2, in its b) and finds nothing, each result
    saying ``prior_conflict``; with a frame the shift is found at once."""
    g = np.random.default_rng(0)
    y = 100 + g.standard_normal(300)
    y[150:] += 5
    x = torch.from_numpy(y[:, None])
    for spec, want in (("gaussian", []), ("gaussian:warmup=5", [150])):
        run = OfflineRun(build_sampler(build_model(spec, 1), SGAISConfig()), 0, DetectorConfig())
        steps = [run.step(x[lo : lo + 10]) for lo in range(0, 300, 10)]
        assert [e.location for _, evs in steps for e in evs] == want, spec
        warned = ["prior_conflict" in r.warnings for r, _ in steps]
        assert all(warned[2:]) if spec == "gaussian" else not any(warned), spec

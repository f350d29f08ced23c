"""Models for real metric series (models/timeseries.py): exact partial evidence against a dense
60-digit reference written here from the documented model, equivariance under units, chunking,
the warm-up, counts, bad settings, and detection on trends, seasons, raw units and count rates."""

import json
import math

import mpmath
import cusp
import numpy as np
import pytest
import torch

from models import ModelError, build_model
from service.detect import DetectorConfig, OfflineRun
from service.sgais import ExactSampler, SGAISConfig, build_sampler

SPECS = ["level", "ar", "ar:order=3", "trend", "trend:order=1", "seasonal:period=12",
         "seasonal:period=7,harmonics=3,trend=1,order=2"]


def design(spec: str, z: np.ndarray, seasons: list[tuple[float, int]] | None = None) -> np.ndarray:
    """The documented features of each row: 1, t (trend), sin/cos(2 pi h t / period), lags of z (0
    before t = 0); ``seasons``: (period, harmonics) of several seasons at once, each in turn,
    in place of the spec's one."""
    m = build_model(spec, 1)
    if seasons is None:
        seasons = [(m.period, m.harmonics)] if m.period else []
    rows = []
    for t in range(len(z)):
        phi = [1.0] + ([float(t)] if m.trend else [])
        for period, harmonics in seasons:
            for h in range(1, harmonics + 1):
                phi += [math.sin(2 * math.pi * h * t / period), math.cos(2 * math.pi * h * t / period)]
        phi += [float(z[t - i]) if t - i >= 0 else 0.0 for i in range(1, m.order + 1)]
        rows.append(phi)
    return np.array(rows)


def nig_log_marginal(phi: np.ndarray, z: np.ndarray, coef_scale: float, a0: float, b0: float) -> mpmath.mpf:
    """log p(z) for z = phi beta + e, beta | s2 ~ N(0, s2 c^2 I), s2 ~ IG(a0, b0): a multivariate t."""
    n = len(z)
    with mpmath.workdps(60):
        c2 = mpmath.mpf(coef_scale) ** 2
        p = [[mpmath.mpf(float(v)) for v in row] for row in phi]
        cov = mpmath.matrix(n, n)
        for i in range(n):
            for j in range(n):
                cov[i, j] = c2 * mpmath.fsum(a * b for a, b in zip(p[i], p[j])) + (1 if i == j else 0)
        chol = mpmath.cholesky(cov)
        w = mpmath.lu_solve(chol, mpmath.matrix([mpmath.mpf(float(v)) for v in z]))
        quad = mpmath.fsum(t * t for t in w)
        logdet = 2 * mpmath.fsum(mpmath.log(chol[i, i]) for i in range(n))
        an = mpmath.mpf(a0) + mpmath.mpf(n) / 2
        return (mpmath.loggamma(an) - mpmath.loggamma(a0) + a0 * mpmath.log(b0) - an * mpmath.log(b0 + quad / 2)
                - logdet / 2 - n * mpmath.log(2 * mpmath.pi) / 2)


def standardised(spec: str, y: np.ndarray):
    """(the model, its warm-up k, scale, z): the warm-up fixes centre and scale (mean, sd with
    n - 1) of z = (y - centre) / scale."""
    m = build_model(spec, 1)
    k = m.warmup
    centre, scale = float(np.mean(y[:k])), float(np.std(y[:k], ddof=1))
    return m, k, scale, (y - centre) / scale


def reference_parts(spec: str, y: np.ndarray, seasons: list[tuple[float, int]] | None = None,
                    ) -> tuple[mpmath.mpf, mpmath.mpf, float]:
    """(log p(z_1..n), log p(z_1..k), (n - k) log scale); ``seasons`` as ``design``'s."""
    m, k, scale, z = standardised(spec, y)
    phi = design(spec, z, seasons)
    full = nig_log_marginal(phi, z, m.coef_scale, m.alpha0, m.beta0)
    head = nig_log_marginal(phi[:k], z[:k], m.coef_scale, m.alpha0, m.beta0)
    return full, head, (len(y) - k) * math.log(scale)


def reference(spec: str, y: np.ndarray) -> float:
    """log p(y_{k+1..n} | y_1..k) = log p(z_1..n) - log p(z_1..k) - (n - k) log scale."""
    full, head, jacobian = reference_parts(spec, y)
    return float(full - head) - jacobian


def series(n: int, loc: float = 250.0, scale: float = 20.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return loc + scale * (0.02 * t + np.sin(2 * np.pi * t / 12) + 0.5 * rng.standard_normal(n))


def evidence(spec: str, y: np.ndarray, chunk: int) -> tuple[float, list]:
    sampler = build_sampler(build_model(spec, 1), SGAISConfig())
    assert isinstance(sampler, ExactSampler)
    results = [r for _, r, _ in sampler.run(torch.from_numpy(y[:, None]), chunk, 0)]
    return results[-1].log_evidence, results


@pytest.mark.parametrize("spec", SPECS)
def test_partial_evidence_matches_the_dense_reference(spec):
    """40 points of a trending seasonal series in raw units; chunks of 1, 3 and 40 (measured
    agreement: 6e-16 relative; the bound is 1e-9)."""
    y = series(40)
    ref = reference(spec, y)
    for chunk in (1, 3, 40):
        got, _ = evidence(spec, y, chunk)
        assert abs(got - ref) <= 1e-9 * abs(ref), (chunk, got, ref)


@pytest.mark.parametrize("spec", SPECS + ["level:warmup=2", "ar:warmup=12,coef_scale=3,alpha0=2,beta0=0.5",
                                          "seasonal", "seasonal:order=0,trend=1"])
@pytest.mark.parametrize("a,b", [(1e-4, 1e6), (-3.0, 7.0), (1e4, -3e4)])
def test_units_only_add_the_jacobian(spec, a, b):
    """y -> a y + b changes the partial evidence by -(n - k) log|a| and nothing else: the models
    fix their frame from the warm-up (tolerance 1e-6 of the evidence, about 3e-4 nats; measured at
    most 1.6e-5 nats, the rounding of a y + b itself at 1e6 + 1e-4 y)."""
    y = series(300, loc=0.0, scale=1.0, seed=3)
    k = build_model(spec, 1).warmup
    base, _ = evidence(spec, y, 25)
    moved, _ = evidence(spec, a * y + b, 25)
    assert moved == pytest.approx(base - (len(y) - k) * math.log(abs(a)), abs=1e-6 * max(1.0, abs(base)))


def test_the_warm_up_is_conditioned_on_and_reported():
    y = series(20)
    _, results = evidence("ar", y, 3)
    assert [(r.rows, r.conditioned) for r in results[:3]] == [(3, 3), (3, 2), (3, 0)]
    assert results[0].log_predictive == 0.0 and results[0].log_predictive_per_observation is None
    assert results[1].log_predictive_per_observation == pytest.approx(results[1].log_predictive)  # one row scored
    assert results[0].to_dict()["conditioned"] == 3


def test_poisson_counts_exact_and_checked():
    rng = np.random.default_rng(4)
    y = rng.poisson([3.0, 40.0], (200, 2)).astype(float)
    m = build_model("poisson", 2)
    # reference: rate ~ Gamma(a0 + sum of warm-up, b0 + k), then the Gamma-Poisson marginal of the rest
    k, ref = m.warmup, 0.0
    for j in range(2):
        a, b = m.alpha0 + y[:k, j].sum(), m.beta0 + k
        rest = y[k:, j]
        s, n = rest.sum(), len(rest)
        ref += (math.lgamma(a + s) - math.lgamma(a) + a * math.log(b) - (a + s) * math.log(b + n)
                - sum(math.lgamma(v + 1) for v in rest))
    sampler = build_sampler(m, SGAISConfig())
    got = [r for _, r, _ in sampler.run(torch.from_numpy(y), 9, 0)][-1].log_evidence
    assert got == pytest.approx(ref, rel=1e-12)
    rows = m.featurize(torch.from_numpy(y))
    post, _ = m.exact_update(m.exact_init(), rows[:50])
    one = torch.tensor([m.exact_update(post, rows[i : i + 1])[1] for i in range(50, 60)], dtype=torch.float64)
    assert torch.allclose(m.exact_row_log_predictive(post, rows[50:60]), one, rtol=1e-12)
    for bad, where in (([[1.5, 2.0]], "row 0, column 0"), ([[1.0, -2.0]], "row 0, column 1")):
        with pytest.raises(ModelError, match=where):
            sampler.update(sampler.init(0), torch.tensor(bad, dtype=torch.float64), sampler.new_reservoir())


def test_row_predictive_is_the_one_step_update():
    y = series(60)
    for spec in ("level", "trend", "seasonal:period=12", "ar:order=2", "seasonal"):
        m = build_model(spec, 1)
        rows = m.featurize(torch.from_numpy(y[:, None]))
        post, _ = m.exact_update(m.exact_init(), rows[:50])
        assert float(m.exact_row_log_predictive(post, rows[50:51])[0]) == pytest.approx(m.exact_update(post, rows[50:51])[1], rel=1e-12)


@pytest.mark.parametrize("settings", ["", "order=0", "trend=1,harmonics=3,order=2", "pairs=1", "pairs=1,order=0"])
def test_seasonal_without_a_period_is_the_exact_average_over_the_calendar_periods(settings):
    """``seasonal`` without a period: log of the equal-weight mixture of the dense references of
    ``seasonal:period=P`` for P in AUTO_PERIODS (with ``pairs=1`` also of the two seasons of each
    pair in AUTO_PAIRS at once; harmonics at most (P - 1) / 2), on 40 points of a monthly-like series; chunks of 1, 3
    and 40 (1e-9 relative, as above). The weights are equal after the warm-up, as the stream's
    models compete on the rows after it; weighing the periods by the warm-up rows too would give
    other numbers (0.11, 0.47 and 0.51 nats here), which the test tells apart."""
    from models.timeseries import AUTO_PAIRS, AUTO_PERIODS

    y = series(40)
    given = dict(kv.split("=") for kv in settings.split(",") if kv)
    given.setdefault("order", "1")  # without a period, one AR lag by default
    h = int(given.pop("harmonics", 2))
    pairs = given.pop("pairs", "0") == "1"
    spec = ",".join(["seasonal:period=12"] + [f"{k}={v}" for k, v in given.items()])  # (its own season replaced)
    seasons = [[p] for p in AUTO_PERIODS] + ([list(pair) for pair in AUTO_PAIRS] if pairs else [])
    parts = [reference_parts(spec, y, [(p, min(h, int((p - 1) // 2))) for p in ps]) for ps in seasons]
    with mpmath.workdps(60):
        ref = float(mpmath.log(mpmath.fsum(mpmath.exp(f - h) for f, h, _ in parts) / len(parts))) - parts[0][2]
        joint = float(mpmath.log(mpmath.fsum(mpmath.exp(f) for f, _, _ in parts))
                      - mpmath.log(mpmath.fsum(mpmath.exp(h) for _, h, _ in parts))) - parts[0][2]
    assert abs(joint - ref) > 0.05  # the two differ (measured 0.11-0.51 nats)
    spec = "seasonal" + (":" + settings if settings else "")
    for chunk in (1, 3, 40):
        got, _ = evidence(spec, y, chunk)
        assert abs(got - ref) <= 1e-9 * abs(ref), (chunk, got, ref)


def test_seasonal_without_a_period_learns_the_period():
    """A daily cycle in hourly readings (period 24) and a yearly one in monthly values (12), 10
    cycles each: the true period is the most probable, above 0.9 (measured: 24 -> 1, the others below 1e-170;
    12 -> 0.94, the rest on 24, whose second harmonic is period 12 too, at the Occam cost of
    its first; every other period below 1e-80). A daily cycle within a weekly one in hourly
    readings (5 weeks), ``pairs=1``: the pair (168, 24), above 0.9 (measured: 1.0; 24 alone below 1e-30)."""
    rng = np.random.default_rng(5)
    for period in (24, 12):
        t = np.arange(10 * period)
        y = 500 + 80 * np.sin(2 * np.pi * t / period) + rng.normal(0, 10, len(t))
        m = build_model("seasonal", 1)
        post, _ = m.exact_update(m.exact_init(), m.featurize(torch.from_numpy(y[:, None])))
        probs = m.period_probabilities(post)
        assert probs[float(period)] > 0.9 and max(probs, key=probs.get) == period, probs
        shifted = m.exact_shift(post)
        assert torch.equal(shifted[3:8], post[3:8])  # a level shift keeps what was learned about the period
        assert m.period_probabilities(m.exact_restart(post)) == pytest.approx({p: 1 / len(probs) for p in probs})
    t = np.arange(5 * 168)
    y = 1000 + 300 * np.sin(2 * np.pi * t / 24) + 150 * np.sin(2 * np.pi * t / 168) + rng.normal(0, 40, len(t))
    m = build_model("seasonal:pairs=1", 1)
    post, _ = m.exact_update(m.exact_init(), m.featurize(torch.from_numpy(y[:, None])))
    probs = m.period_probabilities(post)
    assert probs[(168.0, 24.0)] > 0.9 and probs[24.0] < 1e-30, probs
    assert m.frame_info(post)["periods"]["168+24"] == probs[(168.0, 24.0)]


@pytest.mark.parametrize("spec", ["seasonal", "seasonal:harmonics=30,trend=1"])  # 30: the five have 25 at most
def test_a_seasonal_state_saved_with_the_five_calendar_periods_goes_on_with_them(monkeypatch, spec):
    """A stream whose ``seasonal`` state was saved before the operational periods joined (five
    components) goes on with those five after the upgrade: the same evidence, row predictives and
    period probabilities, bit for bit, as the five-period model, its restarts and level shifts
    included; a new state has all ten; a state of neither layout is refused naming the model."""
    legacy = 5
    from models import timeseries

    rng = np.random.default_rng(3)
    y = torch.from_numpy(500 + 80 * np.sin(2 * np.pi * np.arange(120) / 12) + rng.normal(0, 10, 120))[:, None]

    def run(m, post):
        out = []
        for lo in range(0, 120, 17):
            out.append(m.exact_row_log_predictive(post, y[lo:lo + 17]) if lo else None)
            post, lp = m.exact_update(post, y[lo:lo + 17])
            out.append(lp)
        restarted, _ = m.exact_update(m.exact_restart(post), y[:9])
        shifted, _ = m.exact_update(m.exact_shift(post), y[:9])
        kinked = [m.exact_update(m.exact_kink(post, jump=j), y[:9])[0] for j in (False, True)] if m.trend else []
        return post, out, [restarted, shifted, *kinked], m.period_probabilities(post)

    m = build_model(spec, 1)
    with monkeypatch.context() as mp:
        mp.setattr(timeseries, "AUTO_PERIODS", timeseries.AUTO_PERIODS[:legacy])
        mp.setattr(timeseries, "AUTO_PAIRS", ())
        old_post, _ = m.exact_update(m.exact_init(), y[:30])
        want = run(m, old_post)
    assert old_post.numel() == m._size(5) != m._size(10) == m.exact_init().numel()
    got = run(m, old_post)
    assert torch.equal(got[0], want[0]) and got[3] == want[3] and len(got[3]) == legacy
    assert all(torch.equal(a, b) if torch.is_tensor(a) else a == b for a, b in zip(got[1], want[1]))
    assert all(torch.equal(a, b) for a, b in zip(got[2], want[2]))
    with pytest.raises(ModelError, match="seasonal: a state of"):
        m.exact_update(old_post[:-1], y[:3])


@pytest.mark.parametrize("spec,message", [
    ("seasonal:period=1", "period"), ("seasonal:harmonics=0", "harmonics"), ("ar:order=-1", "order"),
    ("trend:trend=2", "trend must be"), ("level:warmup=1", "warmup"),
    ("seasonal:period=4,harmonics=3", "harmonics"), ("level:coef_scale=0", "coef_scale"), ("ar:sampler=sgais", "exact method only"),
    ("poisson:beta0=-1", "beta0"), ("seasonal:pairs=2", "pairs must be 0 or 1"),
    ("seasonal:period=24,pairs=1", "takes no period"),
    # priors in the frame (standardised units) beyond [1e-6, 1e6]: NaN or digits lost (issue review)
    ("level:coef_scale=1e-309", "coef_scale is in the series' standardised units"),
    ("student-t:alpha0=1e300", "alpha0 is in the series' standardised units"), ("ar:beta0=1e7", "beta0"),
    # the family's settings that would make a model another one (level:trend=1 was trend's evidence)
    ("level:trend=1", "no setting 'trend' .that is `trend`"), ("level:harmonics=3", "no setting 'harmonics'"),
    ("ar:period=12", "no setting 'period' .that is `seasonal`"), ("trend:period=7", "that is `seasonal:trend=1`"),
    # ... and are not listed as its own (a new user read 'period' among level's settings)
    ("level:foo=1", "its settings: alpha0, beta0, coef_scale, sampler, warmup$"),
])
def test_bad_settings_name_the_problem(spec, message):
    with pytest.raises(ModelError, match=message):
        build_model(spec, 1)


def test_values_that_are_not_finite_are_refused_by_the_model_itself():
    """The service and ``cusp.Detector`` refuse NaN and infinities before a model sees them; a
    model used directly refuses them too (before: a NaN evidence and posterior, silently)."""
    for spec in ("level", "ar", "seasonal", "student-t"):
        m = build_model(spec, 1)
        for bad in (float("nan"), float("inf")):
            with pytest.raises(ModelError, match="row 2, column 0"):
                m.featurize(torch.tensor([[1.0], [2.0], [bad]], dtype=torch.float64))


def test_univariate_models_refuse_several_columns():
    with pytest.raises(ModelError, match="one column"):
        build_model("ar", 2)


def detect(spec: str, y: np.ndarray, chunk: int) -> list[int]:
    run = OfflineRun(build_sampler(build_model(spec, 1), SGAISConfig()), 0, DetectorConfig())
    found = []
    for lo in range(0, len(y), chunk):
        found += run.step(torch.from_numpy(np.asarray(y[lo : lo + chunk], dtype=float)[:, None]))[1]
    return [e.location for e in found]


def test_a_steady_trend_is_not_a_change_for_a_trend_model():
    """A population-like series rising by 350 a step (noise 200) for 600 steps: `level` restarts
    every ~25 steps, as it must; `trend` and `ar` report nothing."""
    rng = np.random.default_rng(0)
    y = 1e5 + 350 * np.arange(600) + rng.normal(0, 200, 600)
    assert len(detect("level", y, 1)) > 10
    assert detect("trend", y, 1) == [] and detect("ar", y, 1) == []


def test_a_season_is_not_a_change_for_a_seasonal_model():
    rng = np.random.default_rng(1)
    t = np.arange(720)
    y = 500 + 80 * np.sin(2 * np.pi * t / 24) + rng.normal(0, 10, 720)
    assert detect("seasonal:period=24", y, 1) == []
    assert detect("seasonal", y, 1) == []  # the period unknown: averaged over the calendar's


def test_the_default_portfolio_finds_a_level_shift_in_a_season():
    """Hourly readings with a daily cycle (amplitude 80, noise 10) and +40 at 300 of 480, point by
    point: the stream's answer is the shift, within 2 rows, and nothing else (measured on data
    seeds 11-13: at 300 on all three; without `seasonal` in the portfolio, nothing is found)."""
    from service.detect import detect_stream

    rng = np.random.default_rng(11)
    t = np.arange(480)
    y = 500 + 80 * np.sin(2 * np.pi * t / 24) + rng.normal(0, 10, 480)
    y[300:] += 40
    _, stream = detect_stream(y, chunk_size=1, seed=0)
    assert len(stream) == 1 and abs(stream[0].location - 300) <= 2, [(c.location, c.confidence) for c in stream]


@pytest.mark.parametrize("seed", [3, 8])
def test_a_step_in_hourly_traffic_with_a_daily_and_a_weekly_cycle_is_one_change(seed):
    """Five weeks of hourly traffic, 1000 + 300 sin(2 pi t / 24) + 150 sin(2 pi t / 168) + N(0,
    40^2), +250 at 600 of 840, in chunks of 4 (``POST /v1/detect``'s default for 840 rows), the
    default portfolio with ``seasonal:pairs=1``: the step within 5 rows and nothing else. No single
    calendar period holds both cycles: with the default `seasonal` these two data seeds give 15 and
    8 stream changes (the step missed on the second); with the pairs of cycles one, at 600, on 8 of
    8 seeds. The pairs do not change a restart's training rows (7) or the stream's resolution."""
    from service.detect import DetectorConfig, detect_stream
    from service.detect.detector import training_rows

    assert training_rows(build_model("seasonal:pairs=1", 1), DetectorConfig()) == 7
    rng = np.random.default_rng(seed)
    t = np.arange(840)
    y = 1000 + 300 * np.sin(2 * np.pi * t / 24) + 150 * np.sin(2 * np.pi * t / 168) + rng.normal(0, 40, 840)
    y[600:] += 250
    _, stream = detect_stream(y, ["level", "ar", "trend", "student-t", "seasonal:pairs=1"], chunk_size=4)
    assert len(stream) == 1 and abs(stream[0].location - 600) <= 5, [(c.location, c.detected_at) for c in stream]


@pytest.mark.parametrize("loc,scale", [(0.0, 1.0), (250.0, 20.0), (3e4, 50.0), (1e6, 1e-4), (0.002, 1e-4)])
def test_a_shift_is_found_in_any_units(loc, scale):
    """A 3 sd shift at 300 of 600, chunks of 10: `level` finds it at the chunk in every unit (the
    `gaussian` model's fixed prior misses it from 3e4 +- 50 on)."""
    rng = np.random.default_rng(2)
    y = np.concatenate([rng.normal(loc, scale, 300), rng.normal(loc + 3 * scale, scale, 300)])
    assert detect("level", y, 10) == [300]


def test_a_count_rate_change_is_found():
    rng = np.random.default_rng(3)
    y = np.concatenate([rng.poisson(20, 300), rng.poisson(30, 300)])
    assert detect("poisson", y, 10) == [300]


def test_a_restart_keeps_the_incumbents_scale_centred_where_it_expected_the_next_row():
    m = build_model("ar", 1)
    y = torch.from_numpy(series(30)[:, None])
    early, _ = m.exact_update(m.exact_init(), m.featurize(y[:3]))
    assert torch.equal(m.exact_restart(early), m.exact_init())  # no frame yet: the prior, with a warm-up
    post, _ = m.exact_update(m.exact_init(), m.featurize(y))
    fresh = m.exact_restart(post)
    (centre, scale), mean = m.frame(post), m._next_mean(post)
    # the old scale, centred where the incumbent expected the next row (by hand: c + phi lag)
    coef = torch.linalg.solve_triangular(m._parts(post)["r"][0], m._parts(post)["z"][0][:, None], upper=True)[:, 0]
    lag = float(m._parts(post)["lags"][0])
    assert mean == pytest.approx(float(coef[0] + coef[1] * lag), abs=1e-12)
    assert m.frame(fresh) == pytest.approx((centre + mean * scale, scale), rel=1e-15) and m.exact_conditioned(fresh, 10) == 0
    assert float(m._parts(fresh)["lags"][0]) == pytest.approx(lag - mean, abs=1e-12)  # the last row, in the moved frame
    lags = slice(3 + m.warmup, 3 + m.warmup + m.order)
    prior = m.exact_init()
    assert torch.equal(fresh[3:lags.start], prior[3:lags.start]) and torch.equal(fresh[lags.stop:], prior[lags.stop:])
    p = build_model("poisson", 1)
    counts = torch.full((20, 1), 30.0, dtype=torch.float64)
    post, _ = p.exact_update(p.exact_init(), counts)
    fresh = p.exact_restart(post)
    assert p.exact_conditioned(fresh, 5) == 0 and float(fresh[1] / fresh[2]) == pytest.approx(float(post[1] / post[2]))


@pytest.mark.parametrize("spec", ["trend", "ar", "seasonal", "local-trend", "local-seasonal:period=24"])
def test_a_restart_far_from_the_warm_ups_centre_predicts_as_a_fresh_model_does(spec):
    """A rising series (+350 a step, noise 200, around 1e5) with a level shift of +1,500 at 200:
    by then the series is about 140 of its warm-up's sds from the frame's centre. The restart at
    200, fed the rows from 200, predicts rows 210-319 about as well as the same model started
    afresh on them (its own warm-up at 200-204). Measured, the sum over those 110 rows, restart
    less fresh, seeds 0-7: trend -2.2..+4.7, ar -16.4..+3.9, seasonal -10.6..+5.6 nats (seeds 0-3:
    local-trend -2.3..+1.6, local-seasonal -0.2..+6.8); with the restart's prior centred at the
    warm-up's centre, as before 2026-12-07, -94 to -330 on every seed (local-trend -105..-130,
    local-seasonal -39..-63: the intercept's prior conflict paid in the noise variance,
    ``exact_restart``). Bound -30."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        t = np.arange(320)
        y = 1e5 + 350 * t + rng.normal(0, 200, 320)
        y[200:] += 1500
        rows = torch.from_numpy(y[:, None])
        m = build_model(spec, 1)
        post, _ = m.exact_update(m.exact_init(), rows[:200])
        restarted = m.exact_update(m.exact_update(m.exact_restart(post), rows[200:210])[0], rows[210:])[1]
        fresh = m.exact_update(m.exact_update(m.exact_init(), rows[200:210])[0], rows[210:])[1]
        assert restarted - fresh > -30.0, (seed, restarted - fresh)


def restart_against_reference(spec: str, y: np.ndarray, tau: int, redesign, restart):
    """(the model, the dense reference of log p(y after the warm-up) for the design
    ``redesign(phi, t)``, the model's: the rows before tau, then ``restart(model, posterior)``
    fed the rows from tau)."""
    m, k, scale, z = standardised(spec, y)
    full = redesign(design(spec, z), np.arange(len(y), dtype=float))
    ref = float(nig_log_marginal(full, z, m.coef_scale, m.alpha0, m.beta0)
                - nig_log_marginal(full[:k], z[:k], m.coef_scale, m.alpha0, m.beta0)) - (len(y) - k) * math.log(scale)
    rows = torch.from_numpy(y[:, None])
    post, before = m.exact_update(m.exact_init(), rows[:tau])
    _, since = m.exact_update(restart(m, post), rows[tau:])
    return m, ref, before + since


@pytest.mark.parametrize("spec", ["level", "ar", "trend:order=1", "seasonal:period=7,harmonics=3,trend=1,order=2"])
def test_a_level_shift_restart_is_the_exact_model_with_two_levels(spec):
    """``exact_shift`` at tau: the rows before tau under the model, then the rows from tau under its
    posterior with a jump of the intercept, together are the evidence of the model whose level
    jumps at tau by an independent amount with the intercept's prior (the dense 60-digit reference
    with a column 1{t >= tau}; 1e-9 relative as above). Far from the frame's centre too (the
    series moved by 40 of its warm-up's sds before tau, where a new level drawn around the centre
    conflicted with the data)."""
    y, tau = series(40), 23

    def two_levels(phi, t):
        return np.concatenate([phi, (t >= tau).astype(float)[:, None]], axis=1)

    for moved in (y, y + 40 * np.std(y[:5], ddof=1) * (np.arange(len(y)) >= 10)):
        m, ref, got = restart_against_reference(spec, moved, tau, two_levels, lambda m, post: m.exact_shift(post))
        assert abs(got - ref) <= 1e-9 * abs(ref), (got, ref)
    early, _ = m.exact_update(m.exact_init(), torch.from_numpy(y[: m.warmup - 1, None]))
    assert m.exact_shift(early) is None  # no frame yet


@pytest.mark.parametrize("jump", [False, True])
@pytest.mark.parametrize("spec", ["trend", "trend:order=1", "seasonal:period=7,harmonics=3,trend=1,order=2"])
def test_a_slope_change_restart_is_the_exact_model_with_a_kink(spec, jump):
    """``exact_kink`` at tau: the rows before tau under the model, then the rows from tau under its
    posterior with a new slope from the level reached, are the evidence of the model whose time
    column is min(t, tau) plus a new column max(t - tau, 0) with an independent coefficient of the
    same prior (a continuous kink at tau); with ``jump`` also a column 1{t >= tau} (a level jump
    there, the same prior). The dense 60-digit reference; 1e-9 relative as above."""
    y, tau = series(40), 23

    def kinked(phi, t):
        out = phi.copy()
        out[:, 1] = np.minimum(t, tau)
        extra = [np.maximum(t - tau, 0)[:, None]] + ([(t >= tau).astype(float)[:, None]] if jump else [])
        return np.concatenate([out] + extra, axis=1)

    m, ref, got = restart_against_reference(spec, y, tau, kinked, lambda m, post: m.exact_kink(post, jump))
    assert abs(got - ref) <= 1e-9 * abs(ref), (got, ref)
    early, _ = m.exact_update(m.exact_init(), torch.from_numpy(y[: m.warmup - 1, None]))
    assert m.exact_kink(early) is None  # no frame yet
    assert build_model("level", 1).exact_kink(early) is None  # no slope


def local_trend_reference(z, d: float, m, tau: int | None = None, drop: tuple[int, ...] = ()) -> mpmath.mpf:
    """log p(z) under ``local-trend`` with discount d, dense (60 digits): given s2, the model is a
    Gaussian process. The filter's scale-free covariances (C, R = G C G^T / d) do not depend on
    the values, so W_t = G C_{t-1} G^T (1 / d - 1) is a fixed sequence; each state is a linear map
    of independent sources (the prior state, each W_t's innovation, with ``tau`` the level jump
    of variance coef_scale^2 added before row tau, as ``exact_shift`` does), z_t its level plus
    unit noise, and p(z) the multivariate t of that covariance times s2 ~ IG(alpha0, beta0).
    ``drop``: rows not observed (missing): the process runs through them, its covariances as
    without the row's update, and p(z) is of the other rows."""
    with mpmath.workdps(60):
        n, c = len(z), mpmath.mpf(m.coef_scale)
        c2, dd = c * c, mpmath.mpf(d)
        srcs = 2 + 2 * n + 1
        theta = [[mpmath.mpf(0)] * srcs for _ in range(2)]
        theta[0][0], theta[1][1] = c, c
        cov = [[c2, mpmath.mpf(0)], [mpmath.mpf(0), c2]]  # the filter's C (scale-free)
        level = []
        for t in range(n):
            if tau is not None and t == tau:
                theta[0][srcs - 1] = c
                cov[0][0] += c2
            gc = [[cov[0][0] + 2 * cov[0][1] + cov[1][1], cov[0][1] + cov[1][1]], [cov[0][1] + cov[1][1], cov[1][1]]]
            theta = [[theta[0][j] + theta[1][j] for j in range(srcs)], list(theta[1])]
            if d < 1:  # the innovation W_t = gc (1/d - 1), through its Cholesky factor
                f = 1 / dd - 1
                l00 = mpmath.sqrt(gc[0][0] * f)
                l10 = gc[1][0] * f / l00
                l11 = mpmath.sqrt(max(gc[1][1] * f - l10 * l10, mpmath.mpf(0)))
                theta[0][2 + 2 * t] += l00
                theta[1][2 + 2 * t] += l10
                theta[1][3 + 2 * t] += l11
            r = [[gc[i][j] / dd for j in range(2)] for i in range(2)]
            if t in drop:  # missing: no update
                cov = r
                continue
            q = r[0][0] + 1
            k0, k1 = r[0][0] / q, r[1][0] / q
            cov = [[r[0][0] - k0 * r[0][0], r[0][1] - k0 * r[0][1]], [r[1][0] - k1 * r[0][0], r[1][1] - k1 * r[0][1]]]
            level.append(list(theta[0]))
        z = [v for t, v in enumerate(z) if t not in drop]
        n = len(z)
        big = mpmath.matrix(n, n)
        for i in range(n):
            for j in range(i + 1):
                v = mpmath.fsum(a * b for a, b in zip(level[i], level[j])) + (1 if i == j else 0)
                big[i, j] = big[j, i] = v
        chol = mpmath.cholesky(big)
        w = mpmath.lu_solve(chol, mpmath.matrix([mpmath.mpf(float(v)) for v in z]))
        quad = mpmath.fsum(t * t for t in w)
        logdet = 2 * mpmath.fsum(mpmath.log(chol[i, i]) for i in range(n))
        a0, b0 = mpmath.mpf(m.alpha0), mpmath.mpf(m.beta0)
        an = a0 + mpmath.mpf(n) / 2
        return (mpmath.loggamma(an) - mpmath.loggamma(a0) + a0 * mpmath.log(b0) - an * mpmath.log(b0 + quad / 2)
                - logdet / 2 - n * mpmath.log(2 * mpmath.pi) / 2)


@pytest.mark.parametrize("spec", ["local-trend:discount=0.95", "local-trend:discount=1", "local-trend"])
def test_local_trend_evidence_matches_the_dense_gaussian_process(spec):
    """The filter's evidence of the rows after the warm-up, in raw units (around 250, scale 20),
    against the dense 60-digit reference (``local_trend_reference``): one discount, a straight
    line (discount 1), and the default mixture over ``AUTO_DISCOUNTS`` (equal weights after the
    warm-up: log mean_k p_k(z after | z warm-up)); 1e-9 relative as above. Then the level-shift
    restart (``exact_shift`` before row 17) the same way, and the chunking makes no difference."""
    y = series(30)
    m, k, scale, z = standardised(spec, y)

    def ref(tau=None):
        parts = [local_trend_reference(z, d, m, tau) - local_trend_reference(z[:k], d, m) for d in m.discounts]
        top = max(parts)
        return float(top + mpmath.log(mpmath.fsum(mpmath.exp(p - top) for p in parts) / len(parts))) - (len(y) - k) * math.log(scale)

    # (the mixture's shift keeps the weights: not one Gaussian process each)
    filter_matches_reference(m, y, ref, shift=len(m.discounts) == 1)


def filter_matches_reference(m, y: np.ndarray, ref, shift: bool):
    """A filtered model's evidence of ``y`` against ``ref()`` to 1e-9 relative, in chunks of 7 the
    same to 1e-12, and with ``shift`` the level-shift restart before row 17 against ``ref(17)``;
    returns the posterior after 17 rows (None without ``shift``)."""
    rows = torch.from_numpy(y[:, None])
    _, whole = m.exact_update(m.exact_init(), rows)
    want = ref()
    assert abs(whole - want) <= 1e-9 * abs(want), (whole, want)
    post, chunked = m.exact_init(), 0.0
    for lo in range(0, len(y), 7):
        post, lp = m.exact_update(post, rows[lo : lo + 7])
        chunked += lp
    assert abs(chunked - whole) <= 1e-12 * abs(whole)
    if not shift:
        return None
    head, before = m.exact_update(m.exact_init(), rows[:17])
    _, since = m.exact_update(m.exact_shift(head), rows[17:])
    want = ref(17)
    assert abs(before + since - want) <= 1e-9 * abs(want), (before + since, want)
    return head


@pytest.mark.parametrize("spec", ["local-trend:discount=0.95", "local-trend", "local-seasonal:period=12,discount=0.95,order=0",
                                  "local-seasonal:period=7,harmonics=2,discount=0.9,season_discount=0.98,order=0"])
def test_a_skipped_row_is_a_missing_observation(spec):
    """``exact_skip`` (the detector's outliers, ``Detector._watch``): the rows after skipped rows 14
    and 20-21 are scored as the dense reference scores the series without those rows (the state
    runs through them, nothing learned from them), for one discount, the default mixture of
    discounts (the weights stay), and ``local-seasonal`` without its AR term; 1e-9 relative as
    above. Inside the warm-up nothing is skipped."""
    y = series(30)
    y[14], y[20], y[21] = 900.0, -400.0, 1200.0  # wild: had they been learned, far from the reference
    m, k, scale, z = standardised(spec, y)
    drop = (14, 20, 21)
    if m.name == "local-trend":
        parts = [local_trend_reference(z, d, m, drop=drop) - local_trend_reference(z[:k], d, m) for d in m.discounts]
    else:
        parts = [local_seasonal_reference(z, p, h, d, m.season_discount, m.order, m, drop=drop)
                 - local_seasonal_reference(z[:k], p, h, d, m.season_discount, m.order, m) for p, h, d in m.components]
    top = max(parts)
    want = float(top + mpmath.log(mpmath.fsum(mpmath.exp(p - top) for p in parts) / len(parts))) - (len(y) - k - 3) * math.log(scale)
    rows = torch.from_numpy(y[:, None])
    post, got = m.exact_init(), 0.0
    for lo, hi in [(0, 14), (14, 15), (15, 20), (20, 22), (22, 30)]:
        if lo in drop:
            post = m.exact_skip(post, rows[lo:hi])
        else:
            post, lp = m.exact_update(post, rows[lo:hi])
            got += lp
    assert abs(got - want) <= 1e-9 * abs(want), (got, want)
    assert int(post[0]) == 30
    # the last rows after the wild ones learned: worse (the skip is not the same update)
    learned = m.exact_update(m.exact_update(m.exact_init(), rows[:22])[0], rows[22:])[1]
    assert learned < lp - 1.0, (learned, lp)
    assert m.exact_skip(m.exact_init(), rows[:1]) is None
    assert m.exact_skip(m.exact_update(m.exact_init(), rows[: k - 1])[0], rows[k - 1 : k]) is None


def test_local_trend_follows_a_curved_rise_and_finds_a_jump_in_it():
    """A rise that bends (250 + 0.5 t + 0.001 t^2, noise 5, point by point), 4 data seeds: no
    report from ``local-trend`` (``trend``, whose slope is fixed, reports the bend); with +25
    (5 sd) from 200, reported at 200 on each. Measured: as asserted, ``trend`` 1-2 reports each."""
    for seed in range(4):
        r = np.random.default_rng(seed)
        t = np.arange(300)
        y = 250 + 0.5 * t + 0.001 * t**2 + r.normal(0, 5, 300)
        assert detect("local-trend", y, 1) == [], seed
        y[200:] += 25
        assert detect("local-trend", y, 1) == [200], seed
    assert detect("trend", 250 + 0.5 * t + 0.001 * t**2 + np.random.default_rng(0).normal(0, 5, 300), 1) != []


def test_a_level_shift_on_a_trend_is_placed_at_its_row():
    """A series rising by 350 a step (noise 200) that jumps by 1,500 at 200 of 320, point by point,
    six data seeds: the `trend` model reports the jump at 200 on every seed. A restart from the
    prior must learn the slope and the noise again from a few rows, and the restart that wins
    first is placed a few rows late (measured without level shifts: 202, 200, 201, 200, 203,
    200); the level-shift restart (``exact_shift``) keeps the slope and the noise."""
    for seed in range(6):
        r = np.random.default_rng([seed, 61])
        y = 1e5 + 350 * np.arange(320) + r.normal(0, 200, 320)
        y[200:] += 1500
        assert detect("trend", y, 1) == [200], seed


def test_a_change_of_slope_is_one_change_for_a_trend_model(monkeypatch):
    """A series rising by 5 a step (noise 20) whose rise triples at 150 of 300, point by point,
    8 data seeds, ``trend``. A restart that keeps the slope (a level shift) wins first, a few rows
    after the kink, and then the next one a few rows later, and so on: measured without slope
    changes, 82 reports on the 8 seeds (up to 18 on one). With them (the winning shift placed where
    a level shift or a slope change, ``exact_kink``, is most probable, and restarted there with
    both free: the level reached plus a jump, and a new slope): one report on every seed, 7 of
    them within 5 rows of 150 (154, 154, 156, 151, 151, 147, 154, 153)."""
    import models.timeseries as ts

    def run():
        located = []
        for seed in range(8):
            r = np.random.default_rng([seed, 5])
            t = np.arange(300.0)
            y = 1000 + 5 * t + 10 * np.maximum(t - 150, 0) + r.normal(0, 20, 300)
            located.append(detect("trend", y, 1))
        return located

    located = run()
    assert sum(map(len, located)) <= 10, located
    assert sum(any(abs(x - 150) <= 5 for x in found) for found in located) >= 6, located
    monkeypatch.setattr(ts.TimeSeriesRegression, "exact_kink", None)
    assert sum(map(len, run())) >= 30


def test_open_challengers_are_passed_on_before_their_model_reports():
    """``Step.pending``: after a jump, while the `level` model's challengers build up evidence, each
    chunk passes on their place and posterior probability, between ``PENDING_FLOOR`` and the
    threshold, rising towards the report; after the report (challengers cleared) nothing."""
    from service.detect.detector import PENDING_FLOOR

    r = np.random.default_rng([0, 99])
    y = 1e4 + 50 * r.standard_normal(40)
    y[20:] += 200
    run = OfflineRun(build_sampler(build_model("level", 1), SGAISConfig()), 0, DetectorConfig())
    seen, reported = [], None
    for i in range(40):
        _, events = run.step(torch.from_numpy(y[i : i + 1, None]))
        if events and reported is None:
            reported = i
            assert run.pending == [] and [e.location for e in events] == [20]
        elif reported is None:
            seen += [q for at, q in run.pending if abs(at - 20) <= 2]
            assert all(PENDING_FLOOR <= q < 0.99 for _, q in run.pending), run.pending
    assert reported is not None and seen and seen[-1] > seen[0], seen


@pytest.mark.parametrize("seed", range(5))
def test_the_default_portfolio_finds_a_jump_in_a_short_series(seed):
    """40 yearly values (1e4 +- 50) with a jump of 4 sd at 20, point by point: the stream's
    model-averaged answer is the jump, at its index, on every data seed (measured: 8 of 8 seeds
    exact; with 30 values and the jump at 15, 6 of 8; with 20 and 10, none yet)."""
    from service.detect import detect_stream

    r = np.random.default_rng([seed, 99])
    y = 1e4 + 50 * r.standard_normal(40)
    y[20:] += 200
    per_model, stream = detect_stream(y, chunk_size=1, seed=0)
    assert sorted(per_model) == ["ar", "level", "seasonal", "student-t", "trend"]
    assert [c.location for c in stream] == [20], [(c.location, c.confidence) for c in stream]


@pytest.mark.parametrize("seed", [0] + [pytest.param(s, marks=pytest.mark.slow) for s in (1, 2)])
def test_a_single_spike_is_not_a_change_but_a_shift_of_its_size_is(seed):
    """Latencies (250 +- 20 ms, 300 rows, point by point) with one reading of 450 at 150: no
    model of the default portfolio reports a change, so neither does the stream; the same
    series with every reading from 150 on 200 higher: the stream's change at 150, found at the
    second shifted row. Measured on 5 data seeds: before the outlier alternative
    (``Detector._log_odds``) the spike was a change at 150 with confidence 1.0 on all 5 (level
    on 5, ar on 4, trend on 2; ar also at 152 on 3); now none. The shift: at 150, found at 152
    on 5 of 5 (before: at 151; at 149 on one). Seeds 1 and 2 run with ``-m slow`` (about 22 s each)."""
    from service.detect import detect_stream

    r = np.random.default_rng(seed + 7)
    y = 250 + 20 * r.standard_normal(300)
    spike = y.copy()
    spike[150] = 450.0
    per_model, stream = detect_stream(spike, chunk_size=1, seed=0)
    assert stream == [] and all(ev == [] for ev in per_model.values()), per_model
    y[150:] += 200.0
    _, stream = detect_stream(y, chunk_size=1, seed=0)
    assert [(c.location, c.detected_at) for c in stream] == [(150, 152)]


@pytest.mark.parametrize("chunk", [10, 25])
def test_a_spike_inside_a_chunk_is_no_models_change(chunk):
    """The series of the test above (data seed 7) in chunks of 10 or 25: the spike at 150 is no
    change for any model of the default portfolio, and the shift of its size is the stream's change
    at 150, found at the end of its first chunk. Measured before the row-by-row outlier alternative
    (``Challenger.top_row`` in ``Detector._log_odds``): the spike was a change at 150 with
    confidence 0.997-1.0 for level, ar, trend and seasonal at both sizes (a short-memory restart at
    the spike's chunk scored its one outlier 20 nats better than the incumbent, its predictive being
    vaguer), and on other series false changes followed it; the stream answer, with student-t's
    probability, reported nothing. Now no model reports it, and shifts are found where they were
    (a +60 shift on 3 data seeds, chunks of 1, 10 and 25: the same stream changes as before)."""
    from service.detect import detect_stream

    r = np.random.default_rng(7)
    y = 250 + 20 * r.standard_normal(300)
    spike = y.copy()
    spike[150] = 450.0
    per_model, stream = detect_stream(spike, chunk_size=chunk, seed=0)
    assert stream == [] and all(ev == [] for ev in per_model.values()), per_model
    y[150:] += 200.0
    per_model, stream = detect_stream(y, chunk_size=chunk, seed=0)
    assert [(c.location, c.detected_at) for c in stream] == [(150, 150 + chunk)], stream
    assert [e.location for e in per_model["level"]] == [150], per_model


@pytest.mark.parametrize("spec", ["level", "ar", "trend", "seasonal:period=12"])
def test_one_wild_reading_is_no_change_and_a_shift_after_it_is_one(spec):
    """A new user's finding (2026-11-28): one reading 20-70 sd out in 300 of N(10, 1), point by
    point, was two changes for every regression: the incumbent absorbed it (its noise variance
    inflated), a restart after it beat that incumbent a nat or two a row and was reported 15-120
    rows later (placed at the spike), and once adopted it held the spike and was beaten the same
    way again. ``Detector._log_odds`` now weighs "that row was an outlier" (the incumbent without
    it), and ``_refine`` places a change after such a row with that incumbent. Measured before, on
    data seeds 0-2 for ``level``: 40 sd, at 150 found at 224-270 and again 16-30 rows later; 70 sd,
    at 150 found at 165-170 and again 13-14 rows later; now none (none either at 10 and 20 sd, for
    all four models and seeds). A +3 sd shift 100 rows after a 40-sd spike, the four models on seeds
    0-2: before, the spike and 0-2 more events each, the shift at 200-202 on 10 of 12 (``trend``
    212 and 217); now the shift alone, at 200, found at 208-220."""
    from service.detect import detect_stream

    for size in (40.0, 70.0):
        y = 10 + np.random.default_rng(0).standard_normal(300)
        y[150] += size
        per_model, _ = detect_stream(y, [spec], chunk_size=1, seed=0)
        assert per_model[spec] == [], (size, per_model)
    y = 10 + np.random.default_rng(0).standard_normal(300)
    y[100] += 40.0
    y[200:] += 3.0
    per_model, stream = detect_stream(y, [spec], chunk_size=1, seed=0)
    assert [c.location for c in stream] == [200], stream
    assert 200 < stream[0].detected_at <= 225, stream


def test_the_unit_of_a_flat_warm_up_is_the_step_its_values_are_recorded_in():
    from models.timeseries import _resolution, flat_unit

    assert [_resolution(v) for v in ([5.0] * 5, [1000.0], [0.0], [2.5, 2.5], [0.25], [3.14159], [1e-4])] == \
        [1.0, 1.0, 1.0, 0.1, 0.01, 1e-5, 1e-4]
    assert _resolution([math.pi]) == 0.0 and _resolution([1e14 + 0.5]) == 0.0  # more digits than 1e-12, or than float64 has
    assert _resolution([0.1 + 0.2]) == 0.1  # 0.30000000000000004: float noise, not a digit
    assert flat_unit(5.0, [5.0] * 5) == 1.0 and flat_unit(86400.0, [86400.0] * 5) == 1.0  # the integers' step
    assert flat_unit(-2000.0, [-2000.0] * 5) == 1.0 and flat_unit(0.0, [0.0] * 5) == 1.0
    assert flat_unit(0.25, [0.25] * 5) == 0.01 and flat_unit(0.5, [0.5] * 5) == pytest.approx(0.1, rel=1e-12)
    assert flat_unit(math.pi, [math.pi] * 5) == pytest.approx(0.1 * math.pi, rel=1e-12)  # no step to read: a tenth
    assert _resolution([3e-7]) == pytest.approx(1e-7, rel=1e-9) and flat_unit(3e-7, [3e-7] * 5) == pytest.approx(1e-7, rel=1e-9)  # not 1: within 1e-6 of 0
    tiny = [1e-170, 2e-170, 1e-170]  # not equal, but their squared deviations underflow: sd 0
    assert flat_unit(float(np.mean(tiny)), tiny) == pytest.approx(0.1 * float(np.mean(tiny)), rel=1e-9, abs=0)  # no step resolved
    for spec in ("level", "student-t"):
        sampler = build_sampler(build_model(spec, 1), SGAISConfig())
        [(state, _, _)] = list(sampler.run(torch.full((5, 1), 45.0, dtype=torch.float64), 5, 0))
        assert sampler.model.frame(state.post) == (45.0, 1.0), spec


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_steps_on_a_flat_gauge_are_found_and_flickers_after_a_flat_warm_up_are_not(seed):
    """Two new users' findings (2026-11-28): a gauge flat at 5 that steps to 6 was not found (its unit
    was |5|, the step 0.2 units, inside the prior's noise), while 1000 -> 2000 was; with a tenth of
    the value as the unit, 86400 -> 86401 and 1000 -> 1001 were not. With the default portfolio,
    point by point and in chunks of 10: a pod count 5 -> 6 -> 5 is two changes, 86400 -> 86401
    one; integer readings flat for the warm-up and then 45 +- 0.7 (rounded) are none, and a +3
    shift in them is one (missed on every seed with |45| as the unit: the noise was taken for 7x
    too large); small integers flat at 2 and then flickering 1-3 are none (a tenth of 2 as the
    unit gave a change at the first flicker on 2 of 6 data seeds)."""
    from service.detect import detect_stream

    pods = np.r_[np.full(100, 5.0), np.full(50, 6.0), np.full(100, 5.0)]
    _, stream = detect_stream(pods, chunk_size=1, seed=seed)
    assert [c.location for c in stream] == [100, 150], stream
    _, stream = detect_stream(np.r_[np.full(100, 86400.0), np.full(30, 86401.0)], chunk_size=1, seed=seed)
    assert [c.location for c in stream] == [100], stream
    _, stream = detect_stream(pods[:150], chunk_size=10, seed=seed)
    assert [c.location for c in stream] == [100], stream
    rng = np.random.default_rng(seed)
    q = np.r_[np.full(5, 45.0), np.round(45 + 0.7 * rng.normal(size=295))]
    assert detect_stream(q, chunk_size=1, seed=0)[1] == []
    q[150:] += 3
    _, stream = detect_stream(q, chunk_size=1, seed=0)
    assert [c.location for c in stream] == [150], stream
    flicker = np.r_[np.full(5, 2.0), np.round(2 + 0.45 * rng.normal(size=295))]
    assert detect_stream(flicker, chunk_size=1, seed=0)[1] == []


@pytest.mark.parametrize("seed", [6, 7, 8])
def test_a_stuck_sensor_is_found_within_twenty_rows(seed):
    """A sensor (10 +- 0.5, two decimals) that sticks at its last reading for rows 250-349, posted in
    chunks of 3: the stream's answer is two changes, the stick placed within 5 rows of 250 and
    reported within 20 rows of it, and the end at 350. A stuck value near the mean makes each row
    only slowly more likely than before, so the log predictive nominated it late: reported at 294
    (seed 6) and at 279 after a false change at 262 (seed 8) before the flat-run signal
    (``signals.FlatRun``), which nominates the run's first row once three equal readings are as rare
    as a 3-sd z-score. Measured with it: reported at 267, 255 and 261 (seeds 6-8), placed 249-251."""
    from service.detect import detect_stream

    y = (10 + np.random.default_rng(seed).normal(0, 0.5, 500)).round(2)
    y[250:350] = y[249]
    _, stream = detect_stream(y, chunk_size=3, seed=0)
    assert len(stream) == 2, stream
    assert abs(stream[0].location - 250) <= 5 and stream[0].detected_at <= 270, stream
    assert abs(stream[1].location - 350) <= 5, stream


def test_a_spike_posted_alone_after_chunks_is_no_change_but_a_shift_is():
    """A stream posted in chunks of 10 (a backfill), then row by row (live): one wild row (N(120, 5),
    then 1.0) is no model's change, and the stream's answer has none; a shift of 4 sd posted the
    same way is the stream's change at its first row. Found by a new user: before a chunk of one
    row counted as its own most telling row (``Detector._feed``), a challenger that began in the
    chunks of 10 compared the lone row with nothing subtracted (log BF 138, all of it that row) and
    ``trend`` and ``seasonal`` reported it, and the stream, with confidence 0.999999, for good."""
    r = np.random.default_rng(5)
    y = r.normal(120, 5, 600)
    after = r.normal(120, 5, 30)

    def posted(tail):
        chunks = [y[i:i + 10] for i in range(0, 600, 10)] + [[v] for v in tail]
        det = cusp.Detector()
        for c in chunks:
            det.update(np.asarray(c, float).reshape(-1, 1))
        return det

    det = posted(np.concatenate([[1.0], after]))
    assert det.changepoints == [] and all(ev == [] for ev in det.events.values()), det.events
    det = posted(after + 20.0)
    assert [c.location for c in det.changepoints] == [600], det.changepoints


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("chunk", [5, 50])
def test_placement_does_not_depend_on_the_chunk_size(chunk, seed):
    """Latencies (250 +- 20 ms) with shifts at 437 (+60) and 761 (-80), not on chunk boundaries:
    with chunks of 5 or 50 the default portfolio's stream answer places both within 5
    observations on 5 data seeds (measured: 436-437 and 761), as point by point; before the
    exact method's in-chunk placement (Detector._refine) they snapped to chunk starts: 435 and 760
    with chunks of 5, 400 and 750 with chunks of 50."""
    from service.detect import detect_stream

    r = np.random.default_rng([seed, 5])
    y = 250 + 20 * r.standard_normal(1000)
    y[437:] += 60
    y[761:] -= 80
    _, stream = detect_stream(y, chunk_size=chunk, seed=0)
    locs = [c.location for c in stream]
    assert len(locs) == 2 and abs(locs[0] - 437) <= 5 and abs(locs[1] - 761) <= 5, (chunk, seed, locs)


@pytest.mark.parametrize("spec", ["level", "ar", "trend", "seasonal"])
def test_a_shift_in_the_second_chunk_is_placed_at_its_row(spec):
    """Noise (0 +- 1) with +5 from a row of a stream's second chunk (chunks of 150): the winning
    level shift's placement (``Detector._refine``) spans that chunk and the first, whose first rows
    are the incumbent's warm-up, where no level shift can start. It once gave up on the whole span
    there, so every such shift was reported at the chunk's first row, 150 (a new user's finding,
    3 seeds, ``level``; in a 60,000-row /v1/detect the restart at the wrong row then raised false
    alarms thousands of rows later); now each is at its row (or the one before: the first row of a
    new regime may be read either way), as one in a later chunk always was. ``trend`` read the jump
    inside a chunk this large partly as slope, and its restarts from the chunk's first row lost:
    it reported these at 305-308 or not at all, until restarts could start inside a chunk
    (``Detector._split``)."""
    from service.detect import detect_series

    for seed, cp in ((0, 165), (1, 199), (2, 225), (0, 270), (2, 250)):
        y = np.random.default_rng(seed).standard_normal(600)
        y[cp:] += 5
        found = [e.location for e in detect_series(y[:, None], spec, chunk_size=150, seed=0)]
        assert len(found) == 1 and cp - 1 <= found[0] <= cp, (spec, seed, cp, found)


def test_a_restart_inside_a_chunk_is_saved_and_restored_bit_for_bit():
    """A challenger that starts inside its first chunk (``Detector._split``) keeps how many of that
    chunk's rows it skips; a worker that restores it re-reads the chunk and drops them, and goes on
    with the same numbers and events as without the cut."""
    from service.detect.state import MAGIC_SKIP, DetectorState
    from tests.test_detect import _restores

    y = np.random.default_rng(2).standard_normal(600)
    y[225:] += 5
    sampler = build_sampler(build_model("trend", 1), SGAISConfig())
    x = torch.from_numpy(y[:, None])
    run = OfflineRun(sampler, 4, DetectorConfig())
    for i in range(2):
        run.step(x[150 * i : 150 * i + 150])
    assert any(c.skip == 75 for c in run.dstate.challengers), [(c.start, c.skip) for c in run.dstate.challengers]
    raw = run.dstate.to_bytes()
    assert json.loads(raw)["magic"] == MAGIC_SKIP  # a version before skips refuses it by name
    assert [c.skip for c in DetectorState.from_bytes(raw).challengers] == [c.skip for c in run.dstate.challengers]
    full, alive = _restores(sampler, DetectorConfig(), x, 150, 4, (2,))
    assert alive > 0
    assert [e["location"] for _, evs in full for e in evs] == [225]


def local_seasonal_reference(z: np.ndarray, period: float, harmonics: int, d: float, sd: float, order: int, m,
                             tau: int | None = None, drop: tuple[int, ...] = ()) -> float:
    """log p(z) under one component of ``local-seasonal`` (trend discount d, season discount sd),
    dense: each state is a linear map of independent unit sources (the prior state, each W_t's
    innovation, with ``tau`` the level jump of variance coef_scale^2 added before row tau), z_t =
    F_t . x_t plus unit noise, F_t's AR entry the row before (0 before the first: the regressors
    are known one step ahead, so the prediction-error decomposition is the dense Gaussian with F_t
    fixed at the observed values); given s2 a Gaussian, so p(z) is the multivariate t of that
    covariance times s2 ~ IG(alpha0, beta0). W_t = blockdiag((1/d - 1) P_trend, (1/sd - 1) P_season)
    with P = G C_{t-1} G^T from the scale-free filter covariances, run here on their own. ``drop``:
    rows not observed (``order`` 0 only: with the AR term a missing row is a missing regressor)."""
    assert not (drop and order)
    n, c2 = len(z), float(m.coef_scale) ** 2
    p = 2 + 2 * harmonics + order
    g = np.zeros((p, p))
    g[0, 0] = g[0, 1] = g[1, 1] = 1.0
    for j in range(1, harmonics + 1):
        w = 2 * math.pi * j / period
        g[2 * j : 2 * j + 2, 2 * j : 2 * j + 2] = [[math.cos(w), math.sin(w)], [-math.sin(w), math.cos(w)]]
    if order:
        g[-1, -1] = 1.0
    srcs = p + p * n + 1
    a = np.zeros((p, srcs))
    a[:, :p] = np.sqrt(c2) * np.eye(p)  # x_0 = c I xi
    cov = c2 * np.eye(p)
    rows = []
    for t in range(n):
        f = np.zeros(p)
        f[0] = 1.0
        f[2 : 2 + 2 * harmonics : 2] = 1.0
        if order:
            f[-1] = z[t - 1] if t else 0.0
        if tau is not None and t == tau:
            a[0, -1] += math.sqrt(c2)
            cov[0, 0] += c2
        pm = g @ cov @ g.T
        wt = np.zeros((p, p))
        wt[:2, :2] = (1 / d - 1) * pm[:2, :2]
        wt[2 : 2 + 2 * harmonics, 2 : 2 + 2 * harmonics] = (1 / sd - 1) * pm[2 : 2 + 2 * harmonics, 2 : 2 + 2 * harmonics]
        a = g @ a
        if np.any(wt):
            ev, vec = np.linalg.eigh(wt)
            a[:, p + p * t : p + p * (t + 1)] = vec * np.sqrt(np.maximum(ev, 0.0))
        r = pm + wt
        if t in drop:  # missing: no update
            cov = r
            continue
        q = f @ r @ f + 1.0
        k = r @ f / q
        cov = r - np.outer(k, k) * q
        rows.append(f @ a)
    z = np.delete(z, list(drop))
    n = len(z)
    lmat = np.array(rows)
    big = lmat @ lmat.T + np.eye(n)
    chol = np.linalg.cholesky(big)
    w = np.linalg.solve(chol, z)
    an = m.alpha0 + n / 2
    return (math.lgamma(an) - math.lgamma(m.alpha0) + m.alpha0 * math.log(m.beta0)
            - an * math.log(m.beta0 + w @ w / 2) - np.log(np.diag(chol)).sum() - n * math.log(2 * math.pi) / 2)


@pytest.mark.parametrize("spec", ["local-seasonal:period=12,discount=0.95,order=0",
                                  "local-seasonal:period=7,harmonics=2,discount=0.9,season_discount=0.98",
                                  "local-seasonal:period=12,discount=1", "local-seasonal"])
def test_local_seasonal_evidence_matches_the_dense_reference(spec):
    """The filter's evidence of the rows after the warm-up, in raw units (around 250, scale 20, a
    yearly season), against ``local_seasonal_reference`` for every component (the default mixes 5
    periods x 5 discounts with equal weights after the warm-up): 1e-9 relative; then the level-shift
    restart (``exact_shift`` before row 17) for one component, and chunks of 7 give the same.
    Measured: within 2e-12 relative (the reference is float64); the season's discount applied to
    the AR coefficient as well (a slip this test caught) was 0.35 nats off."""
    y = series(30)
    m, k, scale, z = standardised(spec, y)

    def ref(tau=None):
        parts = [local_seasonal_reference(z, p, h, d, m.season_discount, m.order, m, tau)
                 - local_seasonal_reference(z[:k], p, h, d, m.season_discount, m.order, m) for p, h, d in m.components]
        top = max(parts)
        return top + math.log(sum(math.exp(v - top) for v in parts) / len(parts)) - (len(y) - k) * math.log(scale)

    head = filter_matches_reference(m, y, ref, shift=len(m.components) == 1)
    if head is not None:
        rows = torch.from_numpy(y[:, None])
        # each row's predictive from a posterior alone: the first row's is the chunk's evidence
        got = m.exact_row_log_predictive(head, rows[17:18])
        _, one = m.exact_update(head, rows[17:18])
        assert abs(float(got[0]) - one) <= 1e-12 * abs(one)


def test_growth_with_a_season_and_a_shift_is_found_by_local_seasonal():
    """Hourly traffic growing 1.5 a step with a daily cycle (amplitude 60, noise 25) and +100 from
    420 of 600, point by point, 3 data seeds: `local-seasonal` reports 420 and nothing else;
    `seasonal` (a level held by an AR(1) term) and `trend` (no season) do not get it right on every
    seed. Measured: as asserted; `seasonal` 0-13 reports a seed, missing or drowning 420."""
    wrong = 0
    for seed in range(3):
        r = np.random.default_rng([seed, 16])
        t = np.arange(600)
        y = 4000 + 1.5 * t + 60 * np.sin(2 * np.pi * t / 24) + r.normal(0, 25, 600)
        y[420:] += 100
        assert detect("local-seasonal", y, 1) == [420], seed
        wrong += detect("seasonal", y, 1) != [420]
    assert wrong > 0


def test_local_seasonal_refuses_bad_settings():
    for spec, word in [("local-seasonal:period=2", "period"), ("local-seasonal:period=12,harmonics=6", "harmonics"),
                       ("local-seasonal:season_discount=0.3", "season_discount"), ("local-seasonal:order=2", "order"),
                       ("local-seasonal:discount=1.5", "discount"), ("local-seasonal:harmonics=0", "harmonics")]:
        with pytest.raises(ModelError, match=word):
            build_model(spec, 1)

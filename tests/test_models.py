"""Contract suite over every registered model, plus the priors' distributions and spec parsing."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from models import REGISTRY, ModelError, build_model, parse_spec
from models.base import Model
from tests.test_native import _f32_close

COLUMNS = {"linear-regression": 4, "logistic-regression": 4, "gmm": 2, "gaussian": 3}
SPECS = {
    "linear-regression": "linear-regression:noise=0.5,prior_scale=2",
    "logistic-regression": "logistic-regression:classes=3",
    "gmm": "gmm:components=3",
    "gaussian": "gaussian:mu0=0.5,kappa0=2,alpha0=2,beta0=1.5",
}


def make(name):
    return build_model(SPECS[name], COLUMNS[name])


def data_for(name, b, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, COLUMNS[name], generator=g, dtype=torch.float64)
    if name == "logistic-regression":
        x[:, -1] = torch.randint(0, 3, (b,), generator=g).double()
    return x


def test_registry_covers_the_issue_models():
    assert set(REGISTRY) == {"linear-regression", "logistic-regression", "gmm", "gaussian",
                             "level", "ar", "trend", "local-trend", "local-seasonal", "seasonal", "poisson", "negbin", "negative-binomial",
                             "student-t"}
    # the time-series, count and heavy-tail models have no particle form: the contract below is
    # SGAIS's; theirs is in tests/test_timeseries.py, tests/test_counts.py and tests/test_heavy.py
    assert {n for n, cls in REGISTRY.items() if cls.exact_only} == {"level", "ar", "trend", "local-trend", "local-seasonal", "seasonal", "poisson",
                                                                     "negbin", "negative-binomial", "student-t"}


@pytest.fixture(params=sorted(n for n, cls in REGISTRY.items() if not cls.exact_only))
def name(request):
    return request.param


def test_shapes(name):
    m = make(name)
    g = torch.Generator().manual_seed(0)
    th = m.sample_prior(g, 7)
    rows = m.featurize(data_for(name, 11))
    assert th.shape == (7, m.dim) and th.dtype == torch.float64
    assert rows.shape == (11, m.feature_width)
    assert m.log_prior(th).shape == (7,)
    assert m.log_likelihood(th, rows).shape == (7, 11)
    assert m.grad_log_likelihood(th, rows, torch.ones(11, dtype=torch.float64)).shape == (7, m.dim)
    assert m.grad_log_prior(th).shape == (7, m.dim)
    assert len(m.parameter_names()) == m.dim


def test_minibatch_sums_equal_full_batch(name):
    m = make(name)
    th = m.sample_prior(torch.Generator().manual_seed(1), 5)
    rows = m.featurize(data_for(name, 40))
    w = torch.rand(40, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    full = m.log_likelihood(th, rows).sum(1)
    parts = m.log_likelihood(th, rows[:13]).sum(1) + m.log_likelihood(th, rows[13:]).sum(1)
    assert torch.allclose(full, parts, rtol=1e-12, atol=1e-9)
    gfull = m.grad_log_likelihood(th, rows, w)
    gparts = m.grad_log_likelihood(th, rows[:13], w[:13]) + m.grad_log_likelihood(th, rows[13:], w[13:])
    assert torch.allclose(gfull, gparts, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("rows", [7, 8, 9, 30])
def test_total_log_likelihood_in_blocks_equals_the_summed_rows(name, rows, monkeypatch):
    # blocks of 8 rows: 7 rows is one partial block, 8 exactly one, 9 and 30 several with a remainder
    m = make(name)
    monkeypatch.setattr(type(m), "TOTAL_BLOCK_ROWS", 8)
    if name == "gmm":  # its native total is one float32 call, held to a float64 reference in test_native
        from models import mixture
        monkeypatch.setattr(mixture, "kernels", lambda: None)
    th = m.sample_prior(torch.Generator().manual_seed(3), 5)
    x = m.featurize(data_for(name, rows, seed=4))
    total = m.total_log_likelihood(th, x)
    assert total.shape == (5,)
    # rounding only: the blocks are summed in another order (1e-12 relative, 200x float64's epsilon)
    assert torch.allclose(total, m.log_likelihood(th, x).sum(1), rtol=1e-12, atol=1e-9)


def test_closed_form_gradients_match_autograd(name):
    m = make(name)
    th = m.sample_prior(torch.Generator().manual_seed(3), 6)
    rows = m.featurize(data_for(name, 30, seed=4))
    w = torch.rand(30, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 3
    g = m.grad_log_likelihood(th, rows, w)
    assert torch.isfinite(g).all()
    assert torch.allclose(g, Model.grad_log_likelihood(m, th, rows, w), rtol=1e-9, atol=1e-9)
    assert torch.allclose(m.grad_log_prior(th), Model.grad_log_prior(m, th), rtol=1e-9, atol=1e-9)
    if m.has_stats:
        assert torch.allclose(m.grad_from_stats(th, m.stats(rows, w)), g, rtol=1e-9, atol=1e-9)
        # batched statistics equal per-batch statistics
        batched = m.stats(torch.stack([rows, rows.flip(0)]), w)
        assert torch.allclose(batched[1], m.stats(rows.flip(0), w))


def test_run_gradients_equal_the_per_evaluation_gradients(name):
    # the engine's hot path (one SGHMC run's prepared gradient) against the plain model functions
    m = make(name)
    th = m.sample_prior(torch.Generator().manual_seed(6), 5)
    rows = m.featurize(data_for(name, 24, seed=7))
    runs = torch.stack([rows, rows.flip(0), rows.roll(5, 0)])  # [E=3, B, F]
    w = torch.rand(24, generator=torch.Generator().manual_seed(8), dtype=torch.float64) * 4
    expect = [m.grad_log_likelihood(th, runs[i], w) + m.grad_log_prior(th) for i in range(3)]
    th0 = th.clone()
    grad = m.run_gradient(runs, w)
    for i in (2, 0, 1):
        assert torch.allclose(grad(th, i), expect[i], rtol=1e-10, atol=1e-9)
    if m.has_stats:
        by_stats = m.stats_gradient(m.stats(runs, w))
        for i in range(3):
            assert torch.allclose(by_stats(th, i), expect[i], rtol=1e-10, atol=1e-9)
        assert torch.allclose(m.stats(runs), m.stats(runs, torch.ones(24, dtype=torch.float64)))
    assert torch.equal(th, th0)


def test_sampled_run_gradients_equal_the_gradients_on_the_gathered_rows(name):
    # the engine's form: the chunk at weight lam plus mini-batch pool[idx[i]] at the pool's
    # weight (the GMM gathers inside its native kernel; the others use the base class's gather)
    m = make(name)
    th = m.sample_prior(torch.Generator().manual_seed(6), 5)
    chunk = m.featurize(data_for(name, 9, seed=7))
    pool = m.featurize(data_for(name, 30, seed=8))
    idx = torch.randint(0, 30, (3, 7), generator=torch.Generator().manual_seed(9))
    w = torch.tensor([0.3] * 9 + [30 / 7] * 7, dtype=torch.float64)
    grad = m.sampled_run_gradient(chunk, 0.3, pool, idx, 30 / 7)
    assert m.run_precision in ("float64", "float32")

    def close(got, want):  # float32: the bounds derived in tests/test_native.py
        if m.run_precision == "float32":
            return _f32_close(got, want)
        return torch.allclose(got, want, rtol=1e-10, atol=1e-9)

    for i in (2, 0, 1):
        rows = torch.cat([chunk, pool[idx[i]]])
        expect = m.grad_log_likelihood(th, rows, w) + m.grad_log_prior(th)
        assert close(grad(th, i), expect), i
    no_pool = m.sampled_run_gradient(chunk, 1.0, pool[:0], idx[:, :0], 0.0)  # the first chunk: no history
    ones = torch.ones(9, dtype=torch.float64)
    assert close(no_pool(th, 1), m.grad_log_likelihood(th, chunk, ones) + m.grad_log_prior(th))


def test_same_seed_same_draws(name):
    m = make(name)
    a = m.sample_prior(torch.Generator().manual_seed(9), 4)
    b = m.sample_prior(torch.Generator().manual_seed(9), 4)
    c = m.sample_prior(torch.Generator().manual_seed(10), 4)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_inputs_not_mutated(name):
    m = make(name)
    th = m.sample_prior(torch.Generator().manual_seed(0), 3)
    raw = data_for(name, 9)
    raw0, th0 = raw.clone(), th.clone()
    rows = m.featurize(raw)
    rows0 = rows.clone()
    m.log_likelihood(th, rows), m.grad_log_likelihood(th, rows, torch.ones(9, dtype=torch.float64)), m.log_prior(th)
    assert torch.equal(raw, raw0) and torch.equal(th, th0) and torch.equal(rows, rows0)


def test_wrong_width_is_a_model_error(name):
    m = make(name)
    with pytest.raises(ModelError, match="columns"):
        m.featurize(torch.zeros(3, COLUMNS[name] + 1, dtype=torch.float64))


def _grid_integral(model, lo, hi, n):
    axes = [torch.linspace(a, b, n, dtype=torch.float64) for a, b in zip(lo, hi)]
    mesh = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(lo))
    vol = math.prod((b - a) / (n - 1) for a, b in zip(lo, hi))
    return float(torch.exp(model.log_prior(mesh)).sum() * vol)


def test_log_priors_are_normalised_densities():
    # the log-Jacobians are right iff the unconstrained densities integrate to one
    assert _grid_integral(build_model("gaussian:kappa0=2,alpha0=2,beta0=1.5", 1), [-8, -6], [8, 5], 801) == pytest.approx(1, abs=2e-3)
    # gmm with K = d = 1, theta = (z, mu, s): integrate over (z, s, u) with mu = 2 e^{s/2} u
    # (Jacobian 2 e^{s/2}) so that the grid follows the prior's scale of mu
    m = build_model("gmm:components=1", 1)
    n = 161
    z, s_, u = (torch.linspace(a, b, n, dtype=torch.float64) for a, b in ((-12, 3), (-9, 14), (-8, 8)))
    zz, ss, uu = torch.meshgrid(z, s_, u, indexing="ij")
    scale = 2 * torch.exp(ss / 2)
    theta = torch.stack([zz, uu * scale, ss], -1).reshape(-1, 3)
    vol = (15 / (n - 1)) * (23 / (n - 1)) * (16 / (n - 1))
    total = float((torch.exp(m.log_prior(theta)) * scale.reshape(-1)).sum() * vol)
    assert total == pytest.approx(1, abs=2e-3)
    assert _grid_integral(build_model("linear-regression:prior_scale=2", 2), [-12, -12], [12, 12], 401) == pytest.approx(1, abs=1e-3)


def test_gmm_prior_draws_match_the_paper_prior():
    m = build_model("gmm:components=4", 2)
    th = m.sample_prior(torch.Generator().manual_seed(0), 4000)
    z, mu, s = m._split(th)
    weights = torch.softmax(z, -1)
    var = torch.exp(s)
    assert stats.kstest(weights[:, 0].numpy(), stats.beta(1, 3).cdf).pvalue > 1e-3  # Dirichlet(1) marginal
    assert stats.kstest((1 / var[:, 0, 0]).numpy(), stats.expon.cdf).pvalue > 1e-3  # InvGamma(1, 1)
    assert stats.kstest((mu / (2 * var.sqrt()))[:, 1, 1].numpy(), stats.norm.cdf).pvalue > 1e-3  # N(0, 4 var)


def test_gaussian_prior_draws_match_nig():
    m = build_model("gaussian:mu0=1,kappa0=4,alpha0=3,beta0=2", 1)
    th = m.sample_prior(torch.Generator().manual_seed(0), 4000)
    var = torch.exp(th[:, 1])
    assert stats.kstest((1 / var).numpy(), stats.gamma(3, scale=1 / 2).cdf).pvalue > 1e-3
    assert stats.kstest(((th[:, 0] - 1) * (4 / var).sqrt()).numpy(), stats.norm.cdf).pvalue > 1e-3


def test_exact_evidence_matches_direct_formulas():
    g = torch.Generator().manual_seed(0)
    m = build_model("linear-regression:noise=0.7,prior_scale=1.3", 3)
    raw = torch.randn(25, 3, generator=g, dtype=torch.float64)
    rows = m.featurize(raw)
    xa, y = rows[:, :3], rows[:, 3]
    cov = 0.49 * torch.eye(25, dtype=torch.float64) + 1.69 * xa @ xa.T
    direct = torch.distributions.MultivariateNormal(torch.zeros(25, dtype=torch.float64), cov).log_prob(y)
    assert m.exact_log_evidence(rows) == pytest.approx(float(direct), rel=1e-10)
    # gaussian: chain rule of Student-t predictives
    m = build_model("gaussian:mu0=0.3,kappa0=2,alpha0=1.5,beta0=0.8", 1)
    y = torch.randn(15, 1, generator=g, dtype=torch.float64)
    total, k, a, b, mu = 0.0, 2.0, 1.5, 0.8, 0.3
    for v in y[:, 0].tolist():
        scale = math.sqrt(b * (k + 1) / (a * k))
        total += stats.t(2 * a, loc=mu, scale=scale).logpdf(v)
        k, mu, a, b = k + 1, (k * mu + v) / (k + 1), a + 0.5, b + k * (v - mu) ** 2 / (2 * (k + 1))
    assert m.exact_log_evidence(m.featurize(y)) == pytest.approx(total, rel=1e-10)


def test_logistic_labels_are_checked():
    m = build_model("logistic-regression:classes=3", 3)
    with pytest.raises(ModelError, match="class label"):
        m.featurize(torch.tensor([[0.1, 0.2, 3.0]], dtype=torch.float64))
    with pytest.raises(ModelError, match="class label"):
        m.featurize(torch.tensor([[0.1, 0.2, 0.5]], dtype=torch.float64))


@pytest.mark.parametrize(
    "spec,cols,message",
    [
        ("nope", 2, "unknown model"),
        ("gmm:components=0", 2, "components"),
        ("gmm:components=two", 2, "not a valid int"),
        ("gmm:colour=red", 2, "has no setting 'colour'"),
        ("gaussian:kappa0=-1", 1, "kappa0"),
        ("gaussian:mu0=nan", 1, "not a valid float"),
        ("linear-regression:noise=0", 3, "noise"),
        ("linear-regression", 1, "at least 2 columns"),
        ("gmm:components=2,components=3", 2, "given twice"),
        ("gmm:components", 2, "key=value"),
        ("", 2, "non-empty"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec, cols, message):
    with pytest.raises(ModelError, match=message):
        build_model(spec, cols)


def test_spec_round_trip():
    m = build_model("gmm:components=3", 2)
    assert parse_spec(m.spec()) == ("gmm", {"components": "3", "warmup": "0"})
    assert build_model(m.spec(), 2) == m


def test_kmeanspp_draws_the_starts_rng_choice_drew():
    """``_kmeanspp`` draws each next start as ``rng.choice(len(y), p=d2 / total)`` did before it
    (2026-11-28: the same cumulative sum, normalisation and one ``random()``, without choice's
    checks of p), so the mixture's fits, and with them its paths, stay bit for bit: rows of 1 to 5
    columns, duplicated rows, tiny and huge scales, all rows equal."""
    from models.mixture import _kmeanspp

    def before(y, k, rng):
        centres = [y[rng.integers(len(y))]]
        d2 = None
        for _ in range(1, k):
            new = ((y - centres[-1]) ** 2).sum(-1)
            d2 = new if d2 is None else np.minimum(d2, new)
            total = d2.sum()
            centres.append(y[rng.choice(len(y), p=d2 / total)] if total > 0 else y[rng.integers(len(y))])
        return np.array(centres)

    gen = np.random.default_rng(3)
    for trial in range(200):
        n, d, k = int(gen.integers(2, 3000)), int(gen.integers(1, 6)), int(gen.integers(1, 9))
        y = gen.normal(size=(n, d)) * 10.0 ** gen.integers(-150, 150)
        if trial % 7 == 0:
            y[: n // 2] = y[0]
        if trial % 11 == 0:
            y[:] = 1.5
        seed = int(gen.integers(2**31))
        assert np.array_equal(_kmeanspp(y, k, np.random.default_rng(seed)), before(y, k, np.random.default_rng(seed))), trial


def test_gmm_component_shares_are_mean_responsibilities_at_any_offset():
    """``component_shares`` (the change detector's view of a mixture's weights): each particle's
    mean responsibilities, as the direct per-component densities give them; the same (to 1e-10)
    with the rows and the means moved by (1e6, -3e5): it centres on the rows before its one matrix
    product of raw moments (measured: 8.5e-12)."""
    model = build_model("gmm:components=4", 2)
    theta = model.sample_prior(torch.Generator().manual_seed(3), 6)
    y = torch.randn(300, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 3.0
    z, mu, s = model._split(theta)
    u2 = ((y[None, None] - mu[:, :, None]).square() * torch.exp(-s)[:, :, None]).sum(-1)  # [M, K, B]
    direct = torch.softmax(torch.log_softmax(z, -1)[:, :, None] - 0.5 * s.sum(-1)[:, :, None] - 0.5 * u2, 1).mean(-1)
    shares = model.component_shares(theta, model.featurize(y))
    assert shares.shape == (6, 4)
    assert torch.allclose(shares, direct, rtol=0, atol=1e-14)
    assert torch.allclose(shares.sum(-1), torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-14)
    off = torch.tensor([1e6, -3e5], dtype=torch.float64)
    moved = theta.clone()
    moved[:, 4:12] = (mu + off).reshape(6, -1)
    assert torch.allclose(model.component_shares(moved, model.featurize(y + off)), direct, rtol=0, atol=1e-10)
    # runs of rows: each run's shares, as for the run alone (3 runs of 100)
    runs = model.component_shares(theta, model.featurize(y), blocks=3)
    assert runs.shape == (6, 3, 4)
    for j in range(3):
        assert torch.allclose(runs[:, j], model.component_shares(theta, model.featurize(y[100 * j:100 * (j + 1)])),
                              rtol=0, atol=1e-14)

"""The native kernels (models/_native.c: the mixture's, the Student-t quadrature's) against the numpy/torch path they replace.

`make test` installs with a C compiler, so the kernels must be built here: a silent fallback
would leave the GMM 2x slower with every test still green. Each instruction set the machine
has (AVX-512, AVX2+FMA, baseline) is checked in its own process (the choice is made once per
process, capped by CUSP_NATIVE_ISA).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from models import build_model, mixture, native

CASES = [  # (components, dims, rows): blocks of 64 rows, with and without a tail; one row
    (5, 2, 1000), (1, 1, 1), (3, 4, 64), (7, 3, 65), (2, 1, 130),
]


def _problem(k: int, d: int, b: int, seed: int, spread: float = 1.0):
    m = build_model(f"gmm:components={k}", n_columns=d)
    g = torch.Generator().manual_seed(seed)
    theta = m.sample_prior(g, 6)
    y = 3.0 * torch.randn(3, b, d, generator=g, dtype=torch.float64) * spread
    rows = torch.stack([m.featurize(y[i]) for i in range(3)])  # [E=3, B, 2d]
    w = torch.rand(b, generator=g, dtype=torch.float64) * 7
    return m, theta, rows, w


def _reference(monkeypatch, m, theta, rows, w):
    with monkeypatch.context() as mp:
        mp.setattr(mixture, "kernels", lambda: None)
        grad = m.run_gradient(rows, w)
        return [grad(theta, i) for i in range(rows.shape[0])], m.log_likelihood(theta, rows[0])


def test_the_kernels_are_built():
    assert native.kernels() is not None, (
        f"{native.status()}: install with a C compiler (pip install -e .) so that models/_native.c is built")


@pytest.mark.parametrize("k,d,b", CASES)
def test_native_mixture_equals_the_numpy_path(monkeypatch, k, d, b):
    m, theta, rows, w = _problem(k, d, b, seed=k * 100 + d * 10 + b)
    want_grads, want_ll = _reference(monkeypatch, m, theta, rows, w)
    grad = m.run_gradient(rows, w)
    for i in (2, 0, 1):
        got = grad(theta, i)
        scale = want_grads[i].abs().max()
        assert torch.allclose(got, want_grads[i], rtol=1e-10, atol=1e-11 * float(scale)), (i, (got - want_grads[i]).abs().max())
    got_ll = m.log_likelihood(theta, rows[0])
    assert got_ll.shape == want_ll.shape
    assert torch.allclose(got_ll, want_ll, rtol=1e-12, atol=1e-10)


def test_far_components_underflow_to_zero_responsibility(monkeypatch):
    # log-joints a thousand nats apart: exp's clamp at -708 must act as zero, as torch's softmax does
    m, theta, rows, w = _problem(4, 2, 200, seed=3, spread=300.0)
    want_grads, want_ll = _reference(monkeypatch, m, theta, rows, w)
    grad = m.run_gradient(rows, w)
    for i in range(3):
        scale = float(want_grads[i].abs().max())
        assert torch.allclose(grad(theta, i), want_grads[i], rtol=1e-10, atol=1e-11 * scale)
    assert torch.allclose(m.log_likelihood(theta, rows[0]), want_ll, rtol=1e-12)


def test_same_inputs_same_bits_and_inputs_untouched():
    m, theta, rows, w = _problem(5, 2, 777, seed=11)
    theta0, rows0, w0 = theta.clone(), rows.clone(), w.clone()
    a = m.run_gradient(rows, w)(theta, 1)
    w.fill_(0.0)  # the engine rewrites its weights between runs: a prepared run must not see it
    b = m.run_gradient(rows, w0)(theta, 1)
    assert torch.equal(a, b)
    assert torch.equal(theta, theta0) and torch.equal(rows, rows0)


def test_bad_arguments_are_refused_not_read():
    k = native.kernels()
    grad = k.gmm_grad_run(3, np.zeros((2, 10, 2)), np.ones(10))
    with pytest.raises(ValueError):
        grad(np.zeros((4, 9)), 2)  # evaluation index out of the run
    with pytest.raises(ValueError):
        grad(np.zeros((9, 4)).T, 0)  # not C-contiguous
    with pytest.raises(ValueError):
        k.gmm_grad_run(3, np.zeros((2, 10, 2)), np.ones(9))


def _sampled(k: int, d: int, seed: int):
    """A run as the engine prepares it: chunk rows at weight lam, mini-batches from a pool."""
    m, theta, rows, _ = _problem(k, d, 130, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    pool = m.featurize(3.0 * torch.randn(300, d, generator=g, dtype=torch.float64))
    idx = torch.randint(0, 300, (4, 70), generator=g)
    return m, theta, rows[0], pool, idx, g


# The engine's run gradient (sampled_run_gradient, models/_native.c grad_core32) is computed in
# float32 on centred, scaled rows. Its error against the float64 reference is bounded by the
# float32 sums: per-lane partial sums of at most B / 16 terms, each term's rounding about
# 2^-24 of it, so |error| <= B * 2^-24 * max|term| <~ 6e-8 * B * (sum w) * |per-row gradient|.
# Measured on these problems: 4e-8 to 6e-8 of max |gradient| and at most 3e-6 of any entry
# (entries near 0 relative to the largest); the tolerances below take 20x that.
F32_RTOL, F32_ATOL = 1e-5, 1e-6  # atol: relative to max |gradient| of the evaluation


def _f32_close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.allclose(got, want, rtol=F32_RTOL, atol=F32_ATOL * float(want.abs().max()))


def _sampled_reference(monkeypatch, m, chunk, pool, idx, lam=0.4, wp=300 / 70):
    with monkeypatch.context() as mp:
        mp.setattr(mixture, "kernels", lambda: None)
        return m.sampled_run_gradient(chunk, lam, pool, idx, wp)


@pytest.mark.parametrize("k,d", [(5, 2), (3, 1), (2, 3), (7, 4)])
def test_the_float32_run_gradient_is_the_float64_gradient_to_float32_rounding(monkeypatch, k, d):
    m, theta, chunk, pool, idx, g = _sampled(k, d, seed=k + 10 * d)
    fused = m.sampled_run_gradient(chunk, 0.4, pool, idx, 300 / 70)
    plain = _sampled_reference(monkeypatch, m, chunk, pool, idx)
    got = torch.stack([fused(theta, i) for i in range(idx.shape[0])])
    want = torch.stack([plain(theta, i) for i in range(idx.shape[0])])
    for i in range(idx.shape[0]):
        assert _f32_close(got[i], want[i]), (i, float((got[i] - want[i]).abs().max() / want[i].abs().max()))
    # and float32 is not what moves the particles: its error is far under the mini-batch noise,
    # the spread of the gradient between evaluations (different mini-batches, same theta)
    noise = want.std(dim=0)
    assert float(((got - want).abs().max(dim=0).values / noise).max()) < 1e-3


def test_the_float32_run_gradient_holds_far_from_zero(monkeypatch):
    # raw moments in float32 would cancel here (y ~ 1e4, sigma ~ 1); centred rows do not
    m = build_model("gmm:components=3", n_columns=2)
    g = torch.Generator().manual_seed(5)
    theta = m.sample_prior(g, 4)
    theta[:, 3:9] += 1.0e4  # means near the data
    theta[:, 9:] = 0.0  # unit variances
    chunk = m.featurize(1.0e4 + torch.randn(200, 2, generator=g, dtype=torch.float64))
    pool = m.featurize(1.0e4 + torch.randn(300, 2, generator=g, dtype=torch.float64))
    idx = torch.randint(0, 300, (3, 50), generator=g)
    fused = m.sampled_run_gradient(chunk, 0.7, pool, idx, 6.0)
    plain = _sampled_reference(monkeypatch, m, chunk, pool, idx, lam=0.7, wp=6.0)
    for i in range(3):
        assert _f32_close(fused(theta, i), plain(theta, i)), i


@pytest.mark.parametrize("offset,unit", [(1.0e6, 1.0e-2), (-3.0e4, 1.0e-4), (1.0e3, 1.0e-4)])
def test_the_float32_run_gradient_holds_in_raw_units(offset, unit):
    """Data at 1e6 in steps of 1e-2 (|y| / sigma 1e8): the rows are centred on the chunk's mean in
    float64 before the float32 cast. Cast raw, y / sigma - mu / sigma was noise past |y| / sigma of
    about 1e6 (float32's step at 1e6 is 0.06, six sigmas). The reference: autograd of the weighted
    log-likelihood, lam x chunk + wp x mini-batch, on torch's centred float64 terms (the float64
    gradient's raw moments cancel here too); the prior's gradient, which dominates at such means,
    is taken off both (the kernel adds it in float64: its rounding, 2^-52 of it, up to 0.3 where
    mu^2 / 8 sigma^2 is 1e15, is added to the float32 tolerance)."""
    m = build_model("gmm:components=3", n_columns=2)
    g = torch.Generator().manual_seed(7)
    y = offset + unit * (torch.randn(500, 2, generator=g, dtype=torch.float64) + torch.tensor([[2.0, 0.0]]) * torch.randint(
        0, 3, (500, 1), generator=g))
    chunk, pool = m.featurize(y[:200]), m.featurize(y[200:])
    idx = torch.randint(0, 300, (3, 50), generator=g)
    theta = torch.cat([torch.zeros(4, 3, dtype=torch.float64),
                       (offset + unit * 2.0 * torch.arange(3, dtype=torch.float64)).repeat_interleave(2).repeat(4, 1)
                       + unit * 0.3 * torch.randn(4, 6, generator=g, dtype=torch.float64),
                       2 * math.log(unit) + 0.2 * torch.randn(4, 6, generator=g, dtype=torch.float64)], 1)
    fused = m.sampled_run_gradient(chunk, 0.7, pool, idx, 6.0)
    for i in range(3):
        t = theta.clone().requires_grad_(True)
        lik = 0.7 * m.log_likelihood(t, chunk).sum(1) + 6.0 * m.log_likelihood(t, pool[idx[i]]).sum(1)
        want = torch.autograd.grad(lik.sum(), t)[0]
        prior = m.grad_log_prior(theta)
        got = fused(theta, i) - prior
        tol = F32_RTOL * want.abs() + F32_ATOL * want.abs().max() + 8 * 2.0 ** -52 * prior.abs()
        assert bool(((got - want).abs() <= tol).all()), (i, float(((got - want).abs() / tol).max()))


def test_the_float32_run_gradient_stays_finite_where_float32_overflows(monkeypatch):
    # tiny variances put u^2 = ((y - mu) / sigma)^2 past float32's 3e38 for some components
    # (their responsibility must be exactly 0, not a floor times u^2) and for a whole row
    m = build_model("gmm:components=3", n_columns=1)
    theta = torch.tensor([[0.0, 0.0, 0.0, -1.0, 0.0, 1e7, -60.0, 0.0, -60.0]], dtype=torch.float64)
    chunk = torch.tensor([[-1.0, 1.0], [0.5, 0.25], [1e25, 1e50]], dtype=torch.float64)
    pool = chunk[:2].clone()
    idx = torch.tensor([[0, 1]])
    got = m.sampled_run_gradient(chunk, 1.0, pool, idx, 1.0)(theta, 0)
    assert torch.isfinite(got).all(), got
    # without the row no component reaches, the float64 reference agrees to float32 rounding
    got2 = m.sampled_run_gradient(chunk[:2], 1.0, pool, idx, 1.0)(theta, 0)
    want2 = _sampled_reference(monkeypatch, m, chunk[:2], pool, idx, lam=1.0, wp=1.0)(theta, 0)
    assert _f32_close(got2, want2)


@pytest.mark.parametrize("k,d", [(5, 2), (3, 1), (2, 3)])
def test_the_fused_euler_run_equals_steps_on_its_gradient(monkeypatch, k, d):
    # the whole SGHMC run inside the kernel (mini-batches gathered there, no Python between
    # steps) against service.sgais.kernel.euler stepping on the same kernel's gradient
    from service.sgais.kernel import euler

    m, theta, chunk, pool, idx, g = _sampled(k, d, seed=k + 10 * d)
    v = 1e-3 * torch.randn(theta.shape, generator=g, dtype=torch.float64)
    state = g.get_state()
    fused = m.sampled_run_gradient(chunk, 0.4, pool, idx, 300 / 70)
    assert fused.euler is not None
    t1, v1 = euler(g, theta, v, fused, 1e-4, 0.2, 0.0, 4)
    stepped = lambda th, i: fused(th, i)  # noqa: E731 - the same gradient, without its fused run
    g.set_state(state)
    t2, v2 = euler(g, theta, v, stepped, 1e-4, 0.2, 0.0, 4)
    assert torch.allclose(v1, v2, rtol=1e-9, atol=1e-13) and torch.allclose(t1, t2, rtol=1e-12, atol=1e-13)
    assert not torch.equal(t1, theta)  # it moved, and theta and v themselves are untouched
    g.set_state(state)
    t3, v3 = euler(g, theta, v, m.sampled_run_gradient(chunk, 0.4, pool, idx, 300 / 70), 1e-4, 0.2, 0.0, 4)
    assert torch.equal(t1, t3) and torch.equal(v1, v3)
    # and the float64 path's run lands on the same particles up to the gradient's float32 rounding
    g.set_state(state)
    plain = _sampled_reference(monkeypatch, m, chunk, pool, idx)
    t4, v4 = euler(g, theta, v, plain, 1e-4, 0.2, 0.0, 4)
    # step s's velocity error is at most the sum of eta * (gradient error) so far, and theta sums
    # the velocities: 1 + 2 + 3 + 4 = 10 gradient errors, each <= (rtol + atol) max |gradient|
    bound = 10 * 1e-4 * (F32_RTOL + F32_ATOL) * float(plain(theta, 0).abs().max()) * 1.5
    assert float((t1 - t4).abs().max()) <= bound and not torch.equal(v1, v4)


def test_the_fused_affine_euler_run_equals_steps_on_addmm(monkeypatch):
    # linear regression's run (gradient affine in theta) in one foreign call, against
    # service.sgais.kernel.euler stepping on its addmm gradient
    from service.sgais.kernel import euler

    m = build_model("linear-regression", n_columns=4)
    g = torch.Generator().manual_seed(5)
    theta = m.sample_prior(g, 7)
    rows = m.featurize(torch.randn(3, 300, 4, generator=g, dtype=torch.float64).view(-1, 4)).view(3, 300, -1)
    stats = m.stats(rows, torch.full((300,), 2.5, dtype=torch.float64))
    v = 1e-3 * torch.randn(theta.shape, generator=g, dtype=torch.float64)
    state = g.get_state()
    fused = m.stats_gradient(stats)
    assert fused.euler is not None
    t1, v1 = euler(g, theta, v, fused, 1e-4, 0.2, 0.0, 3)
    with monkeypatch.context() as mp:
        mp.setattr("models.linear.kernels", lambda: None)
        plain = m.stats_gradient(stats)
        assert getattr(plain, "euler", None) is None
        g.set_state(state)
        t2, v2 = euler(g, theta, v, plain, 1e-4, 0.2, 0.0, 3)
    assert torch.allclose(v1, v2, rtol=1e-10, atol=1e-14) and torch.allclose(t1, t2, rtol=1e-12, atol=1e-14)
    assert not torch.equal(t1, theta)
    k = native.kernels()
    run = k.affine_euler(np.zeros((3, 5, 5)), np.zeros((3, 5)))
    with pytest.raises(ValueError):
        run(np.zeros((4, 6)), np.zeros((4, 6)), None, 1e-3, 0.8, 3)  # D does not fit
    with pytest.raises(ValueError, match="noise"):
        run(np.zeros((4, 5)), np.zeros((4, 5)), np.zeros((2, 4, 5)), 1e-3, 0.8, 3)
    with pytest.raises(ValueError, match="2 steps"):
        run(np.zeros((4, 5)), np.zeros((4, 5)), None, 1e-3, 0.8, 2)  # the run was prepared for 3
    with pytest.raises(ValueError, match="do not fit"):
        k.affine_euler(np.zeros((3, 5, 4)), np.zeros((3, 5)))


def test_bad_run_arguments_are_refused_not_read():
    k = native.kernels()
    chunk, pool = np.zeros((10, 4)), np.zeros((20, 4))
    with pytest.raises(ValueError, match="outside the pool"):
        k.gmm_run(3, chunk, 1.0, pool, np.array([[0, 20]]), 1.0)
    with pytest.raises(ValueError, match="outside the pool"):
        k.gmm_run(3, chunk, 1.0, pool, np.array([[-1, 2]]), 1.0)
    with pytest.raises(ValueError, match="do not fit"):
        k.gmm_run(3, chunk, 1.0, np.zeros((20, 3)), np.array([[0, 2]]), 1.0)
    run = k.gmm_run(3, chunk, 1.0, pool, np.array([[0, 2], [3, 4]]), 1.0)
    with pytest.raises(ValueError):
        run(np.zeros((4, 15)), 2)  # evaluation index out of the run
    with pytest.raises(ValueError, match="noise"):
        run.euler(np.zeros((4, 15)), np.zeros((4, 15)), np.zeros((3, 4, 15)), 1e-3, 0.8, 2)
    with pytest.raises(ValueError):
        run.euler(np.zeros((4, 15)), np.zeros((3, 15)), None, 1e-3, 0.8, 2)
    with pytest.raises(ValueError, match="3 steps"):
        run.euler(np.zeros((4, 15)), np.zeros((4, 15)), None, 1e-3, 0.8, 3)  # prepared for 2 evaluations


@pytest.mark.parametrize("f,bm", [(7, 500), (1, 1), (8, 7), (9, 33), (12, 500), (3, 0)])
def test_gather_gram_equals_the_gathered_rows_product(f, bm):
    # linear regression's mini-batch statistics straight from the reservoir: registers up to 8
    # columns, per-column dot products beyond
    g = torch.Generator().manual_seed(f * 1000 + bm)
    pool = torch.randn(400, f, generator=g, dtype=torch.float64) * 3 + 1
    idx = torch.randint(0, 400, (5, bm), generator=g)
    got = torch.from_numpy(native.kernels().gather_gram(pool.numpy(), idx.numpy()))
    rows = pool[idx]
    want = rows.transpose(-1, -2) @ rows
    assert got.shape == (5, f, f)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12 * max(1.0, float(want.abs().max())))
    assert torch.equal(got, got.transpose(-1, -2))  # exactly symmetric


def test_the_linear_model_reads_its_mini_batch_statistics_natively(monkeypatch):
    m = build_model("linear-regression", n_columns=6)
    g = torch.Generator().manual_seed(2)
    pool = m.featurize(torch.randn(300, 6, generator=g, dtype=torch.float64))
    idx = torch.randint(0, 300, (20, 50), generator=g)
    got = m.sampled_stats(pool, idx)
    with monkeypatch.context() as mp:
        from models import linear
        mp.setattr(linear, "kernels", lambda: None)
        want = m.sampled_stats(pool, idx)
    assert got.shape == want.shape == (20, 49)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-10)


def test_bad_gather_gram_arguments_are_refused_not_read():
    k = native.kernels()
    with pytest.raises(ValueError, match="outside the pool"):
        k.gather_gram(np.zeros((10, 7)), np.array([[0, 10]]))
    with pytest.raises(ValueError, match="outside the pool"):
        k.gather_gram(np.zeros((10, 7)), np.array([[-1, 0]]))
    with pytest.raises(ValueError, match="2-D"):
        k.gather_gram(np.zeros(10), np.array([[0, 1]]))


def _em_problem(k: int, d: int, b: int, seed: int, spread: float = 1.0):
    """Rows y [b, d], a mixture (w [K], mu [K, d], var [K, d]), particles' mu, s [6, K, d] and row weights."""
    rng = np.random.default_rng(seed)
    y = rng.normal(size=(b, d)) * 3.0 * spread
    w = rng.dirichlet(np.ones(k))
    mu, var = rng.normal(size=(k, d)) * 2.0 * spread, rng.uniform(0.2, 3.0, size=(k, d)) * spread**2
    pmu, ps = rng.normal(size=(6, k, d)) * 2.0 * spread, rng.normal(size=(6, k, d)) + 2.0 * math.log(spread)
    return y, w, mu, var, pmu, ps, rng.uniform(0.0, 5.0, size=b)


@pytest.mark.parametrize("k,d,b", CASES)
@pytest.mark.parametrize("spread", [1.0, 300.0])
def test_the_em_kernels_equal_the_numpy_path(k, d, b, spread):
    """The E step's sums (``_em_matrix``, ``_map_em``) and the weights' EM (``_particle_counts``), native
    against numpy, with blocks of 64 rows with and without a tail, one row, and components a thousand
    nats apart (exp's clamp must act as zero)."""
    y, w, mu, var, pmu, ps, wts = _em_problem(k, d, b, seed=k * 100 + d * 10 + b, spread=spread)
    kern = native.kernels()
    feats = np.concatenate([np.ones((b, 1)), y, y * y], axis=1)
    want = mixture._responsibilities(feats, w, mu, var) @ feats
    got = kern.em_stats(y, w, mu, var)
    assert np.allclose(got, want, rtol=1e-11, atol=1e-11 * np.abs(want).max())
    start = np.random.default_rng(1).dirichlet(np.ones(k), size=6)
    for sweeps in (1, 3, mixture.WEIGHT_SWEEPS):
        want_c = mixture._weight_em(np.exp(mixture._component_log_densities(y, pmu, ps)), wts, start, sweeps)
        got_c, _ = kern.weight_em(y, wts, pmu, ps, start, sweeps, mixture.WEIGHT_TOL)
        assert np.allclose(got_c, want_c, rtol=1e-9, atol=1e-12 * np.abs(want_c).max()), (sweeps, np.abs(got_c - want_c).max())


def test_the_fits_are_the_same_with_and_without_the_em_kernels(monkeypatch):
    """``_em_matrix`` end to end (k-means++ start, 25 steps, responsibilities) and ``_particle_counts``:
    the kernels change the fits by rounding only."""
    rng = np.random.default_rng(4)
    y = np.concatenate([rng.normal(size=(700, 2)) * 0.5 + c for c in ((0, 0), (4, 1), (-3, 3))])
    means = mixture._kmeanspp(y, 4, np.random.default_rng(2))
    got = mixture._em_matrix(y, means, 25, responsibilities=True)
    m = build_model("gmm:components=4", n_columns=2)
    theta = m.sample_prior(torch.Generator().manual_seed(3), 5).numpy()
    mu, s = theta[:, 4:12].reshape(5, 4, 2), theta[:, 12:].reshape(5, 4, 2)
    cands = m.assignment_rows(torch.from_numpy(y), torch.from_numpy(y[:100]), 2100, torch.Generator().manual_seed(5))
    got_counts = m._particle_counts(mu, s, cands, 0.5, 100)
    monkeypatch.setattr(mixture, "kernels", lambda: None)
    want = mixture._em_matrix(y, means, 25, responsibilities=True)
    for a, b in zip(got, want):
        assert np.allclose(a, b, rtol=1e-9, atol=1e-12)
    assert np.allclose(got_counts, m._particle_counts(mu, s, cands, 0.5, 100), rtol=1e-9)



def test_a_component_without_rows_stays_put_on_both_paths(monkeypatch):
    """A component 5 sd away with variance 1e-6 explains none of 200 rows: numpy's responsibilities
    are exactly 0 there, and so must the native E step's be (its exp once floored at 3e-308, so
    the component had a positive sum and the M step moved it to about 0); both keep its mean."""
    y = np.random.default_rng(0).normal(size=(200, 1))
    start = (np.array([0.5, 0.5]), np.array([[0.0], [5.0]]), np.array([[1.0], [1e-6]]))
    native_fit = mixture._em_matrix(y, start[1], 1, start=start)
    monkeypatch.setattr(mixture, "kernels", lambda: None)
    numpy_fit = mixture._em_matrix(y, start[1], 1, start=start)
    assert native_fit[1][1, 0] == numpy_fit[1][1, 0] == 5.0
    assert native.kernels().em_stats(y, *start)[1].tolist() == [0.0, 0.0, 0.0]
    for a, b in zip(native_fit[:3], numpy_fit[:3]):
        assert np.allclose(a, b, rtol=1e-9, atol=1e-12)


def test_a_non_finite_parameter_gives_a_non_finite_log_likelihood():
    """A NaN or infinite mean in any component: NaN rows, as torch's path gives (the vectorised log
    read NaN's exponent bits as a number: about +710 a row, which would have taken every weight)."""
    rows = np.array([[0.1], [0.5]])
    for k in (0, 1):
        for bad in (np.nan, np.inf):
            theta = np.zeros((1, 6))  # K = 2, d = 1: z [2], mu [2], log sigma^2 [2]
            theta[0, 2 + k] = bad
            assert np.isnan(native.kernels().gmm_loglik(theta, 2, rows)).all(), (k, bad)


# The mixture's summed log-likelihood (gmm_total32: importance draws, Metropolis-Hastings ratios,
# mode checks) takes its terms in float32 on rows centred in float64. Its error against the
# float64 sum grows with the rows and with |u|^2 = ((y - mu) / sigma)^2 of the rows' nearest
# component, mostly the same way in every row of a component (its constants rounded to float32).
# Measured on these problems (up to 20,000 rows): 1e-7 to 6e-7 nats a row, and at most 7e-8 of
# the sum of |row values|; the tolerances below take about 15x.
TOTAL32_ATOL_PER_ROW, TOTAL32_RTOL = 1e-5, 1e-6


def _total_close(got: np.ndarray, want: np.ndarray, rows: int, scale: np.ndarray) -> bool:
    return bool(np.all(np.abs(got - want) <= TOTAL32_ATOL_PER_ROW * rows + TOTAL32_RTOL * scale))


def _total_problem(k: int, d: int, b: int, seed: int, offset: float = 0.0, unit: float = 1.0):
    """Particles from the prior moved near the data (means from rows, variances around the
    data's), so the terms are those a posterior's draws see, in units of ``unit`` around ``offset``."""
    m = build_model(f"gmm:components={k}", n_columns=d)
    g = torch.Generator().manual_seed(seed)
    centres = offset + unit * 10.0 * torch.randn(k, d, generator=g, dtype=torch.float64)
    pick = torch.randint(0, k, (b,), generator=g)
    y = centres[pick] + unit * torch.randn(b, d, generator=g, dtype=torch.float64)
    theta = m.sample_prior(g, 8)
    theta[:, k:k + k * d] = (centres.reshape(-1) + unit * torch.randn(8, k * d, generator=g, dtype=torch.float64))
    theta[:, k + k * d:] = 2.0 * math.log(unit) + 0.5 * torch.randn(8, k * d, generator=g, dtype=torch.float64)
    return m, theta, m.featurize(y), y


def _total_reference(theta: torch.Tensor, k: int, y: torch.Tensor) -> np.ndarray:
    """log p(y_b | theta_m) [M, B] in float64 from (y - mu) / sigma directly, in numpy (gmm_loglik
    and the torch path once expanded the square into raw moments, mu y / sigma^2 - y^2 / (2
    sigma^2), which cancel in float64 once |y| / sigma passes about 1e7: data at 1e6 in steps of
    1e-4 were thousands of nats off; both now centre each component's term)."""
    t, y = theta.numpy(), y.numpy()
    m, d = t.shape[0], y.shape[1]
    z, mu, ls = t[:, :k], t[:, k:k + k * d].reshape(m, k, d), t[:, k + k * d:].reshape(m, k, d)
    logw = z - np.logaddexp.reduce(z, axis=1, keepdims=True)
    u = (y[None, None, :, :] - mu[:, :, None, :]) * np.exp(-0.5 * ls)[:, :, None, :]  # [M, K, B, d]
    lj = logw[:, :, None] - 0.5 * (d * math.log(2 * math.pi) + ls.sum(-1))[:, :, None] - 0.5 * (u * u).sum(-1)
    return np.logaddexp.reduce(lj, axis=1)


@pytest.mark.parametrize("k,d,b,offset,unit", [
    (5, 2, 1000, 0.0, 1.0), (1, 1, 1, 0.0, 1.0), (7, 3, 65, 0.0, 1.0), (3, 4, 20_000, 0.0, 1.0),
    (5, 2, 20_000, 1.0e6, 1.0e-4), (3, 1, 5000, -3.0e4, 1.0e4), (7, 2, 9999, 250.0, 20.0),
])
def test_the_float32_total_log_likelihood_is_the_float64_sum_to_float32_rounding(k, d, b, offset, unit):
    m, theta, rows, y = _total_problem(k, d, b, seed=k + 10 * d + b, offset=offset, unit=unit)
    per_row = _total_reference(theta, k, y)
    want = per_row.sum(1)
    got = m.total_log_likelihood(theta, rows).numpy()
    assert got.dtype == np.float64 and got.shape == want.shape
    assert _total_close(got, want, b, np.abs(per_row).sum(1)), (np.abs(got - want).max(), np.abs(got - want).max() / b)
    # the float64 terms (the evidence's: the native kernel, and torch's path, taken with a gradient)
    # agree at every location, raw units at 1e6 in steps of 1e-4 included
    assert np.allclose(native.kernels().gmm_loglik(theta.numpy(), k, rows.numpy()), per_row, rtol=1e-12, atol=1e-10)
    assert np.allclose(m.log_likelihood(theta.clone().requires_grad_(True), rows).detach().numpy(), per_row,
                       rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("case", ["clusters 1e5 sigma apart", "one reading at 1e11", "log variance -200"])
def test_the_total_is_taken_in_float64_where_float32_would_not_hold(case):
    # float32's (y - c) / sigma is off by about 6e-8 of the rows' reach in sigmas: two clusters
    # 1e5 sigma apart were 5 nats off over 1e5 rows, one wild reading among N(0, 1) rows (the
    # centre follows it) 17, and a log variance of -200 overflowed float32 (NaN). Those particles
    # are summed in float64 (the base class's blocks, as before the float32 kernel, with each
    # component's term centred on its mean), the others in the same call in float32.
    g = torch.Generator().manual_seed(1)
    if case == "log variance -200":
        m = build_model("gmm:components=2", n_columns=1)
        theta = torch.tensor([[0.0, 0.0, 0.0, 0.0, -200.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
        y = torch.zeros(2, 1, dtype=torch.float64)
    else:
        m = build_model("gmm:components=2", n_columns=1)
        y = torch.randn(20_000, 1, generator=g, dtype=torch.float64)
        if case == "one reading at 1e11":
            y[7] = 1e11
            theta = torch.tensor([[0.0, -30.0, 0.0, 1e11, 0.0, 0.0], [0.0, 0.0, 0.0, 0.5, 0.0, 1.0]], dtype=torch.float64)
        else:
            y[::2] += 1e5
            theta = torch.tensor([[0.0, 0.0, 0.0, 1e5, 0.0, 0.0], [0.0, 0.0, 0.0, 1e5, 2 * math.log(1e3), 2 * math.log(1e3)]],
                                 dtype=torch.float64)
    rows = m.featurize(y)
    got = m.total_log_likelihood(theta, rows).numpy()
    assert np.isfinite(got).all(), got
    f64 = native.kernels().gmm_loglik(theta.numpy(), 2, rows.numpy()).sum(1)
    f32, _ = native.kernels().gmm_total32(theta.numpy(), 2, rows.numpy())
    far = np.array([True, case == "one reading at 1e11"])  # the wild reading is 1e11 sigma from the centre for both
    assert np.array_equal(native.kernels().gmm_total32(theta.numpy(), 2, rows.numpy(), m.TOTAL32_REACH)[1], far)
    assert np.array_equal(got[far], f64[far])  # the float64 path, as before the float32 kernel
    assert np.array_equal(got[~far], f32[~far])  # a near particle in float32
    # the float64 path's terms are centred on each component: the reference agrees, the wild reading too
    # (with raw moments, 1e11 sigma out, it was 31 nats off)
    ref = _total_reference(theta, 2, y).sum(1)
    assert np.allclose(got[far], ref[far], rtol=1e-12, atol=1e-9)
    assert np.allclose(got, ref, rtol=1e-12, atol=1e-6 * len(y))  # a near one to float32's rounding


def test_the_float32_total_puts_unreachable_rows_at_minus_infinity_and_leaves_nan_parameters_out():
    # one component with a tiny variance: u^2 past float32's range for a row far away is -inf,
    # as float64 gives a finite but hopeless value there (-1e42 and so on); NaN or infinite
    # parameters give NaN
    k = native.kernels()
    theta = np.array([[0.0, 0.0, 0.0, 1.0, -60.0, -60.0]])  # K = 2, d = 1
    assert k.gmm_total32(theta, 2, np.array([[0.0], [1.0]]))[0][0] > -100.0
    assert k.gmm_total32(theta, 2, np.array([[0.0], [1.0e25]]))[0][0] == -math.inf  # (no reach given: computed)
    for bad in (np.nan, np.inf):
        t = theta.copy()
        t[0, 2] = bad
        out, far = k.gmm_total32(t, 2, np.array([[0.1], [0.5]]))
        assert np.isnan(out[0]), bad  # a mean: NaN here; a NaN or infinite log variance: left to the float64 path (far)
        t = theta.copy()
        t[0, 4] = -bad  # NaN, or -inf: 1 / sigma infinite
        out, far = k.gmm_total32(t, 2, np.array([[0.1], [0.5]]))
        assert np.isnan(out[0]) and far[0], bad
    with pytest.raises(ValueError, match="gmm_total32"):
        k.gmm_total32(np.zeros((1, 10)), 2, np.zeros((3, 1)))  # d = 2 from theta, rows of width 1
    assert k.gmm_total32(theta, 2, np.zeros((0, 1)))[0][0] == 0.0  # no rows: an empty sum


def test_bad_em_arguments_are_refused_not_read():
    k = native.kernels()
    with pytest.raises(ValueError, match="em_stats"):
        k.em_stats(np.zeros((10, 3)), np.ones(2) / 2, np.zeros((2, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="em_stats"):
        k.em_stats(np.zeros((10, 2)), np.ones(3) / 3, np.zeros((2, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="weight_em"):
        k.weight_em(np.zeros((10, 2)), np.ones(9), np.zeros((4, 2, 2)), np.zeros((4, 2, 2)), np.ones((4, 2)) / 2, 3, 1e-10)
    with pytest.raises(ValueError, match="weight_em"):
        k.weight_em(np.zeros((10, 2)), np.ones(10), np.zeros((4, 2, 2)), np.zeros((4, 2, 3)), np.ones((4, 2)) / 2, 3, 1e-10)


def _t_problem(b: int, seed: int, v: int = 3, g: int = 10):
    """Random inputs of the Student-t kernels: rows z [b] (a few far outliers), per nu v an anchor,
    node factors er, sr [v, g], half [v] and node bases [v, g, g] (about -60 to 0, as log weights)."""
    r = np.random.default_rng(seed)
    z = r.standard_t(2, b) * 3.0
    z[:: max(1, b // 3)] *= 1e4
    return (z, r.normal(0, 1, v), np.exp(r.normal(0, 1, (v, g))), r.normal(0, 3, (v, g)), r.uniform(0.5, 17, v),
            -r.uniform(0, 60, (v, g, g)))


def _t_reference(z, m, er, sr, half, base):
    """The kernels' sums in plain numpy: [v, g, g] sums of log1p(q^2), and the rows' log-sum-exps [b]."""
    q = (z[:, None, None] - m[None, :, None]) * er[None]  # [b, v, g (j)]
    q = q[:, :, None, :] - sr[None, :, :, None]  # [b, v, g (i), g (j)]
    terms = np.log1p(q * q)
    t = base[None] - half[None, :, None, None] * terms
    top = t.reshape(len(z), -1).max(1)
    return terms.sum(0), top + np.log(np.exp(t.reshape(len(z), -1) - top[:, None]).sum(1))


@pytest.mark.parametrize("b", [1, 7, 8, 9, 500])
def test_the_student_t_kernels_equal_numpy(b):
    z, m, er, sr, half, base = _t_problem(b, seed=b)
    want_sums, want_lse = _t_reference(z, m, er, sr, half, base)
    k = native.kernels()
    assert np.allclose(k.t_loglik(z, m, er, sr), want_sums, rtol=1e-13, atol=1e-12)
    assert np.allclose(k.t_row_lse(z, m, er, sr, half, base), want_lse, rtol=1e-13, atol=1e-12)
    again = k.t_row_lse(z, m, er, sr, half, base)
    assert np.array_equal(again, k.t_row_lse(z, m, er, sr, half, base))  # same inputs, same bits
    base[:] = -np.inf
    assert (k.t_row_lse(z, m, er, sr, half, base) == -np.inf).all()  # no node has mass: -inf, not NaN
    base[0, 1, 2] = np.nan
    assert np.isnan(k.t_row_lse(z, m, er, sr, half, base)).all()  # a NaN node: NaN, as torch's logsumexp gives


def test_the_student_t_model_is_the_same_with_and_without_the_kernels(monkeypatch):
    """Evidence and row predictives of ``student-t`` through a stream in raw units, while its rows
    are kept and after (the grids updated incrementally), native against torch: the same to 1e-9
    nats (the kernel's log differs from log1p by about 1e-16 a term)."""
    from models import heavy
    from service.sgais import SGAISConfig, build_sampler

    def run(native_on: bool):
        with monkeypatch.context() as mp:
            if not native_on:
                mp.setattr(heavy, "kernels", lambda: None)
            m = build_model("student-t", 1)
            s = build_sampler(m, SGAISConfig())
            st, res = s.init(0), s.new_reservoir()
            x = torch.as_tensor(np.random.default_rng(3).standard_t(3, 400) * 1e-3 + 5e3)[:, None]
            x[250] += 0.5  # an outlier of 500 scales
            out = []
            for lo in range(0, 400, 23):
                if lo:
                    out += s.row_fits(st, m.featurize(x[lo:lo + 23])).tolist()
                st, r, w = s.update(st, x[lo:lo + 23], res)
                res.apply(w)
                out.append(r.log_evidence)
            return np.array(out)

    native_run, torch_run = run(True), run(False)
    assert np.allclose(native_run, torch_run, rtol=0, atol=1e-9), np.abs(native_run - torch_run).max()


@pytest.mark.parametrize("spec", ["level", "ar:order=3", "trend", "seasonal", "seasonal:period=24,harmonics=3,trend=1"])
@pytest.mark.parametrize("b", [1, 7, 200])
def test_the_regressions_update_equals_the_stacked_qr(spec, b):
    """``nig_update`` (Givens rotations) against the QR of the stacked [R z; phi y]
    (``_srif_nig_torch``), in raw units (1e3 + 1e-2 noise): R' up to the signs of its rows
    (compared as R'^T R' and R'^T z'), (a, b) and the log predictive to rounding (measured at most
    2.3e-13 nats on these cases)."""
    from models import timeseries

    rng = np.random.default_rng(b)
    m = build_model(spec, 1)
    y = torch.from_numpy((1e3 + 1e-2 * rng.standard_normal(300) + 1e-2 * np.sin(np.arange(300)))[:, None])
    post, _ = m.exact_update(m.exact_init(), y[:50])
    parts = m._parts(post)
    z = (y[50 : 50 + b, 0] - float(post[1])) / float(post[2])
    phi, _ = m._design(z, parts["lags"], 50, len(parts["ab"]))
    got = timeseries._srif_nig(parts["r"], parts["z"], parts["ab"], phi, z)
    want = timeseries._srif_nig_torch(parts["r"], parts["z"], parts["ab"], phi, z)
    assert torch.allclose(got[3], want[3], rtol=1e-13, atol=1e-12)
    assert torch.allclose(got[2], want[2], rtol=1e-13, atol=0)
    gram = lambda r, v: (r.transpose(-1, -2) @ r, (r.transpose(-1, -2) @ v[..., None])[..., 0])  # noqa: E731
    for a, c in zip(gram(got[0], got[1]), gram(want[0], want[1])):
        assert torch.allclose(a, c, rtol=1e-12, atol=1e-12 * float(c.abs().max()))
    diag = torch.diagonal(got[0], dim1=-2, dim2=-1)
    assert bool((diag >= 0).all()) and bool((got[0].tril(-1) == 0).all())  # upper triangular, diagonal kept >= 0


def test_the_regressions_are_the_same_with_and_without_the_kernel(monkeypatch):
    """``level``, ``ar``, ``trend`` and ``seasonal`` with their detectors on a level shift in raw
    units, native against torch: every chunk's log-evidence to 1e-9 nats (measured at most 4.6e-13)
    and the same change points."""
    from models import timeseries
    from service.detect.offline import detect_series

    x = 5e3 + 1e-3 * np.random.default_rng(4).standard_normal(300)
    x[180:] += 4e-3

    def run(native_on: bool):
        with monkeypatch.context() as mp:
            if not native_on:
                mp.setattr(timeseries, "kernels", lambda: None)
            out = {}
            for spec in ("level", "ar", "trend", "seasonal"):
                evidence: list[float] = []
                events = detect_series(x[:, None], spec, chunk_size=7, seed=0,
                                       on_chunk=lambda r, _e: evidence.append(r.log_evidence))
                out[spec] = (np.array(evidence), [e.location for e in events])
            return out

    on, off = run(True), run(False)
    for spec in on:
        assert np.allclose(on[spec][0], off[spec][0], rtol=0, atol=1e-9), (spec, np.abs(on[spec][0] - off[spec][0]).max())
        assert on[spec][1] == off[spec][1] and on[spec][1], spec


def test_bad_regression_arguments_are_refused_not_read():
    k = native.kernels()
    r, z, ab = np.eye(3)[None].repeat(2, 0), np.zeros((2, 3)), np.ones((2, 2))
    phi, y = np.ones((2, 4, 3)), np.zeros(4)
    with pytest.raises(ValueError, match="nig_update"):
        k.nig_update(r[:1], z, ab, phi, y)
    with pytest.raises(ValueError, match="nig_update"):
        k.nig_update(r, z, ab, phi[:, :3], y)
    with pytest.raises(ValueError, match="nig_update"):
        k.nig_update(r, z, ab, phi[:, :0], y[:0])
    with pytest.raises(ValueError, match="nig_update"):
        k.nig_update(r, z[0], ab, phi, y)  # z of one dimension
    with pytest.raises(ValueError, match="nig_update"):
        k.nig_update(r, z, ab, phi, y[:, None])


def test_bad_student_t_arguments_are_refused_not_read():
    k = native.kernels()
    z, m, er, sr, half, base = _t_problem(5, seed=1)
    with pytest.raises(ValueError, match="t_loglik"):
        k.t_loglik(z, m[:2], er, sr)
    with pytest.raises(ValueError, match="t_loglik"):
        k.t_loglik(z[:, None], m, er, sr)
    with pytest.raises(ValueError, match="t_row_lse"):
        k.t_row_lse(z, m, er, sr, half, base[:, :, :4])
    with pytest.raises(ValueError, match="t_row_lse"):
        k.t_row_lse(z, m, er, sr[:, :4], half, base)
    with pytest.raises(ValueError, match="at most 4096 nodes"):
        k.t_loglik(z, m[:1], np.ones((1, 5000)), np.ones((1, 5000)))


_ISA_SCRIPT = r"""
import json, sys, torch
import numpy as np
sys.path.insert(0, sys.argv[1])
from models import native
from tests.test_native import CASES, _problem, _sampled
out = {"isa": native.kernels().isa, "cases": []}
for k, d, b in CASES:
    m, theta, rows, w = _problem(k, d, b, seed=k * 100 + d * 10 + b)
    g = m.run_gradient(rows, w)(theta, 1)
    out["cases"].append([g.tolist(), m.log_likelihood(theta, rows[0]).tolist()])
m, theta, chunk, pool, idx, _ = _sampled(5, 2, seed=25)
out["sampled"] = m.sampled_run_gradient(chunk, 0.4, pool, idx, 300 / 70)(theta, 3).tolist()
gp = torch.randn(200, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
gi = torch.randint(0, 200, (3, 90), generator=torch.Generator().manual_seed(2))
out["gram"] = [native.kernels().gather_gram(gp.numpy(), gi.numpy()).tolist(),
               native.kernels().gather_gram(torch.cat([gp, gp[:, :3]], 1).numpy(), gi.numpy()).tolist()]
from tests.test_native import _em_problem
y, w, mu, var, pmu, ps, wts = _em_problem(5, 2, 1000, seed=7)
out["em"] = [native.kernels().em_stats(y, w, mu, var).tolist(),
             native.kernels().weight_em(y, wts, pmu, ps, np.full((6, 5), 0.2), 20, 1e-10)[0].tolist()]
from tests.test_native import _t_problem
z, m, er, sr, half, base = _t_problem(37, seed=4)
out["t"] = [native.kernels().t_loglik(z, m, er, sr).tolist(), native.kernels().t_row_lse(z, m, er, sr, half, base).tolist()]
from tests.test_native import _total_problem
m, theta, rows, _ = _total_problem(5, 2, 3001, seed=9, offset=1.0e6, unit=1.0e-4)
out["total"] = m.total_log_likelihood(theta, rows).tolist()
print(json.dumps(out))
"""


def test_every_instruction_set_agrees(monkeypatch):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs, sampled, grams, ems, ts, totals = {}, {}, {}, {}, {}, {}
    for cap in ("2", "1", "0"):
        env = dict(os.environ, CUSP_NATIVE_ISA=cap)
        done = subprocess.run([sys.executable, "-c", _ISA_SCRIPT, root], env=env, capture_output=True, text=True,
                              timeout=120, cwd=root)
        assert done.returncode == 0, done.stderr[-2000:]
        r = json.loads(done.stdout)
        runs[r["isa"]] = r["cases"]
        sampled[r["isa"]] = torch.tensor(r["sampled"], dtype=torch.float64)
        grams[r["isa"]] = r["gram"]
        ems[r["isa"]] = r["em"]
        ts[r["isa"]] = r["t"]
        totals[r["isa"]] = r["total"]
    assert "baseline" in runs  # the cap reaches the baseline build on any x86 machine
    for j, (k, d, b) in enumerate(CASES):
        m, theta, rows, w = _problem(k, d, b, seed=k * 100 + d * 10 + b)
        want_grads, want_ll = _reference(monkeypatch, m, theta, rows, w)
        for isa, cases in runs.items():
            g, ll = torch.tensor(cases[j][0], dtype=torch.float64), torch.tensor(cases[j][1], dtype=torch.float64)
            scale = float(want_grads[1].abs().max())
            assert torch.allclose(g, want_grads[1], rtol=1e-10, atol=1e-11 * scale), (isa, k, d, b)
            assert torch.allclose(ll, want_ll, rtol=1e-12, atol=1e-10), (isa, k, d, b)
    m, theta, chunk, pool, idx, _ = _sampled(5, 2, seed=25)
    want = _sampled_reference(monkeypatch, m, chunk, pool, idx)(theta, 3)
    for isa, got in sampled.items():
        assert _f32_close(got, want), isa
    gp = torch.randn(200, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    gi = torch.randint(0, 200, (3, 90), generator=torch.Generator().manual_seed(2))
    for j, pool_g in enumerate((gp, torch.cat([gp, gp[:, :3]], 1))):  # 7 columns (registers), 10 (dot products)
        want_g = pool_g[gi].transpose(-1, -2) @ pool_g[gi]
        for isa, got in grams.items():
            assert torch.allclose(torch.tensor(got[j], dtype=torch.float64), want_g, rtol=1e-12, atol=1e-11), (isa, j)
    y, w, mu, var, pmu, ps, wts = _em_problem(5, 2, 1000, seed=7)
    feats = np.concatenate([np.ones((1000, 1)), y, y * y], axis=1)
    want_em = (mixture._responsibilities(feats, w, mu, var) @ feats,
               mixture._weight_em(np.exp(mixture._component_log_densities(y, pmu, ps)), wts, np.full((6, 5), 0.2), 20))
    for isa, got in ems.items():
        for g, want_e in zip(got, want_em):
            assert np.allclose(np.array(g), want_e, rtol=1e-9, atol=1e-12 * np.abs(want_e).max()), isa
    want_t = _t_reference(*_t_problem(37, seed=4))
    for isa, got in ts.items():
        for g, want_e in zip(got, want_t):
            assert np.allclose(np.array(g), want_e, rtol=1e-13, atol=1e-12), isa
    m, theta, rows, y = _total_problem(5, 2, 3001, seed=9, offset=1.0e6, unit=1.0e-4)
    per_row = _total_reference(theta, 5, y)
    for isa, got in totals.items():  # float32 lanes of 8 or 16: each its own rounding, all within the bound
        assert _total_close(np.array(got), per_row.sum(1), 3001, np.abs(per_row).sum(1)), isa


@pytest.mark.parametrize("var,value", [("CUSP_NATIVE", "maybe"), ("CUSP_NATIVE_ISA", "3"), ("CUSP_NATIVE_ISA", "avx")])
def test_bad_native_settings_stop_start_up_naming_the_variable(monkeypatch, var, value):
    from service.settings import load_settings

    monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as exc:
        load_settings()
    assert var in str(exc.value)


def test_the_library_reads_the_same_switch(monkeypatch):
    monkeypatch.setenv("CUSP_NATIVE", "off")
    assert native._enabled() is False  # kernels() reads it once per process (cached)
    monkeypatch.setenv("CUSP_NATIVE", "maybe")
    with pytest.raises(ValueError, match="CUSP_NATIVE"):
        native._enabled()


@pytest.mark.parametrize("k,d,b", CASES + [(3, 2, mixture.LAPLACE_BLOCK + 904)])
def test_the_laplace_and_map_kernels_equal_the_numpy_path(k, d, b, monkeypatch):
    """``_laplace_pass`` (the observed information: the rows' scores by ``laplace_rows``, blocks of
    ``LAPLACE_BLOCK`` rows with and without a tail) and ``_map_em`` (steps by ``em_run``), native against
    numpy: the same up to rounding."""
    y, w, mu, var, *_ = _em_problem(k, d, b, seed=k * 100 + d * 10 + b)
    got_info = mixture._laplace_pass(y, 2.5, w, mu, var)
    got_map = mixture._map_em(y, w, mu, var, 7, weight=1.5)
    monkeypatch.setattr(mixture, "kernels", lambda: None)
    want_info = mixture._laplace_pass(y, 2.5, w, mu, var)
    assert np.allclose(got_info, want_info, rtol=1e-10, atol=1e-11 * np.abs(want_info).max())
    for a, c in zip(got_map, mixture._map_em(y, w, mu, var, 7, weight=1.5)):
        assert np.allclose(a, c, rtol=1e-9, atol=1e-12)


def test_bad_laplace_and_em_run_arguments_are_refused_not_read():
    k = native.kernels()
    w, mu, var = np.ones(2) / 2, np.zeros((2, 2)), np.ones((2, 2))
    with pytest.raises(ValueError, match="em_run"):
        k.em_run(np.zeros((10, 3)), w, mu, var, None, 3)
    with pytest.raises(ValueError, match="em_run"):
        k.em_run(np.zeros((10, 2)), w, mu, var, np.zeros((3, 2)), 3)
    with pytest.raises(ValueError, match="laplace_rows"):
        k.laplace_rows(np.zeros((10, 2)), w, mu, var, np.zeros(2), np.zeros((2, 4)), np.zeros((2, 4, 3)))
    with pytest.raises(ValueError, match="laplace_rows"):
        k.laplace_rows(np.zeros((10, 2)), w, mu, var, np.zeros(2), np.zeros((2, 4), dtype=np.float32), np.zeros((2, 4, 4)))


@pytest.mark.parametrize("spec", ["level", "ar:order=3", "trend:order=1", "seasonal", "seasonal:period=12,trend=1"])
def test_the_framed_update_in_numpy_equals_the_torch_path(spec, monkeypatch):
    """``TimeSeriesRegression._update_framed`` (numpy around ``nig_update``, once the frame is fixed)
    against the torch path: the states and every chunk's log predictive, one row at a time and in
    chunks of 5, to rounding."""
    from models import timeseries

    m = build_model(spec, 1)
    y = torch.from_numpy(300.0 + 20.0 * np.random.default_rng(7).standard_normal((60, 1)))

    def run(native_on: bool, size: int):
        with monkeypatch.context() as mp:
            if not native_on:
                mp.setattr(timeseries, "kernels", lambda: None)
            post, lps = m.exact_init(), []
            for lo in range(0, 60, size):
                post, lp = m.exact_update(post, y[lo : lo + size])
                lps.append(lp)
            return post, np.array(lps)

    for size in (1, 5):
        (got, got_lp), (want, want_lp) = run(True, size), run(False, size)
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12), (size, (got - want).abs().max())
        assert np.allclose(got_lp, want_lp, rtol=0, atol=1e-9), (size, np.abs(got_lp - want_lp).max())


def test_bad_nig_update_into_arguments_are_refused_not_read():
    k = native.kernels()
    state, phi, y = np.zeros(20), np.ones((1, 1, 2)), np.zeros(1)
    with pytest.raises(ValueError, match="nig_update_into"):  # R runs past the state's end
        k.nig_update_into(state, (18, 0, 4), phi, y, np.zeros(20), np.zeros(1))
    with pytest.raises(ValueError, match="nig_update_into"):  # another layout to write into
        k.nig_update_into(state, (0, 4, 6), phi, y, np.zeros(21), np.zeros(1))
    with pytest.raises(ValueError, match="nig_update_into"):
        k.nig_update_into(state, (0, 4, 6), phi, np.zeros(2), np.zeros(20), np.zeros(1))
    with pytest.raises(ValueError, match="nig_update_into"):
        k.nig_update_into(state, (-1, 4, 6), phi, y, np.zeros(20), np.zeros(1))

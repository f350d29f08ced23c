"""The native kernels (models/_native.c), loaded with ctypes, or ``None`` when they are not
built (no C compiler at install time) or are turned off with ``CUSP_NATIVE=0``.

Callers keep their numpy/torch path as the fallback and as the reference the native result
is tested against (tests/test_native.py). ``status()`` says which path runs, for logs and the
benchmark report.
"""

from __future__ import annotations

import ctypes
import math
import importlib.util
import os
from collections.abc import Callable
from functools import cache

import numpy as np


#: the most grid nodes per coordinate the Student-t kernels take (``t_loglik`` keeps a row of them
#: on the C stack)
MAX_NODES = 4096


def _gmm_arguments(name: str, theta: np.ndarray, components: int, rows: np.ndarray):
    """theta [M, D] and rows [B, >= d] as contiguous float64, with M, d, B and the rows' width."""
    theta = np.ascontiguousarray(theta, dtype=np.float64)
    rows = np.ascontiguousarray(rows, dtype=np.float64)
    m, dim = theta.shape
    d = (dim // components - 1) // 2
    b, f = rows.shape
    if f < d:
        raise ValueError(f"{name}: rows of width {f} for {d} dimensions")
    return theta, rows, m, d, b, f


class NativeKernels:
    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i, L, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_double
        self._gmm_grad = lib.cusp_gmm_grad
        self._gmm_grad.argtypes = [i, i, i, L, p, p, L, p, f, p]
        self._gmm_grad.restype = i
        self._gmm_loglik = lib.cusp_gmm_loglik
        self._gmm_loglik.argtypes = [i, i, i, L, p, p, L, p]
        self._gmm_loglik.restype = i
        self._gmm_total32 = lib.cusp_gmm_total32
        self._gmm_total32.argtypes = [i, i, i, L, p, p, L, f, p, p]
        self._gmm_total32.restype = i
        self._gmm_run = lib.cusp_gmm_run
        self._gmm_run.argtypes = [i, i, i, L, p, L, f, L, p, L, p, f, i, f, f, p, p, p, p]
        self._gmm_run.restype = i
        self._affine_euler = lib.cusp_affine_euler
        self._affine_euler.argtypes = [i, i, i, p, p, f, f, p, p, p]
        self._affine_euler.restype = None
        self._gather_gram = lib.cusp_gather_gram
        self._gather_gram.argtypes = [i, L, i, p, L, p, p]
        self._gather_gram.restype = i
        self._em_stats = lib.cusp_em_stats
        self._em_stats.argtypes = [i, i, L, p, L, p, p, p, p]
        self._em_stats.restype = i
        self._weight_em = lib.cusp_weight_em
        self._weight_em.argtypes = [i, i, i, L, p, L, p, p, p, i, f, p, p]
        self._weight_em.restype = i
        self._em_run = lib.cusp_em_run
        self._em_run.argtypes = [i, i, L, p, L, p, p, p, p, i, f, i, f]
        self._em_run.restype = i
        self._laplace_rows = lib.cusp_laplace_rows
        self._laplace_rows.argtypes = [i, i, L, p, L, p, p, p, p, p, p, p]
        self._laplace_rows.restype = i
        self._t_loglik = lib.cusp_t_loglik
        self._t_loglik.argtypes = [i, i, L, p, p, p, p, p]
        self._t_loglik.restype = i
        self._t_row_lse = lib.cusp_t_row_lse
        self._t_row_lse.argtypes = [i, i, L, p, p, p, p, p, p, p]
        self._t_row_lse.restype = i
        self._nig_update = lib.cusp_nig_update
        self._nig_update.argtypes = [i, i, L, p, p, p, p, p, p, p, p, p]
        self._nig_update.restype = i
        lib.cusp_isa.restype = i
        self.isa = ("baseline", "avx2+fma", "avx512")[lib.cusp_isa()]

    def gmm_grad_run(self, components: int, rows: np.ndarray, weights: np.ndarray) -> Callable[[np.ndarray, int], np.ndarray]:
        """The mixture's gradient for one SGHMC run: ``rows [E, B, >= d]`` float64 (y in the
        first d columns; E evaluations), ``weights [B]``. Returns ``grad(theta [M, D], i) -> [M, D]``,
        D = K(1 + 2d), at evaluation i's rows. The arguments that do not change within the run
        are checked and converted once here: an evaluation is one foreign call."""
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        weights = np.array(weights, dtype=np.float64)  # a copy: callers may rewrite theirs
        e, b, f = rows.shape
        if weights.shape != (b,):
            raise ValueError(f"gmm_grad: weights of shape {weights.shape} for {b} rows")
        k = components
        w_total, w_ptr = float(weights.sum()), weights.ctypes.data
        base, step = rows.ctypes.data, rows.strides[0]
        fn = self._gmm_grad

        def grad(theta: np.ndarray, i: int) -> np.ndarray:
            m, dim = theta.shape
            if not (theta.flags.c_contiguous and theta.dtype == np.float64 and 0 <= i < e):
                raise ValueError("gmm_grad: theta must be C-contiguous float64 and i a row set of this run")
            d = (dim // k - 1) // 2
            out = np.empty((m, dim))
            if fn(m, k, d, b, theta.ctypes.data, base + i * step, f, w_ptr, w_total, out.ctypes.data):
                raise MemoryError("gmm_grad: scratch allocation failed")
            return out

        grad.keep = (rows, weights)  # the pointers above stay valid while grad lives
        return grad

    def gmm_run(self, components: int, chunk: np.ndarray, lam: float, pool: np.ndarray, idx: np.ndarray,
                pool_weight: float) -> "GmmRun":
        """The mixture's gradient for one SGHMC run whose evaluation i sees the chunk ``[Bc, >= d]``
        with weight ``lam`` plus the mini-batch ``pool[idx[i]]`` (``idx [E, Bm]`` int64) with
        weight ``pool_weight``, gathered inside the kernel. Checked once here."""
        return GmmRun(self._gmm_run, components, chunk, lam, pool, idx, pool_weight)

    def affine_euler(self, a: np.ndarray, c: np.ndarray) -> Callable[..., None]:
        """For a log target whose gradient at evaluation i is ``c[i] + theta @ a[i]`` (``a [E, D, D]``,
        ``c [E, D]`` float64): ``euler(theta, v, noise, eta, decay, steps)``, the run's E Euler steps in
        place on ``theta`` and ``v [M, D]`` (the protocol of service/sgais/kernel.py)."""
        a = np.ascontiguousarray(a, dtype=np.float64)
        c = np.ascontiguousarray(c, dtype=np.float64)
        e, dim = c.shape
        if a.shape != (e, dim, dim):
            raise ValueError(f"affine_euler: a {a.shape} and c {c.shape} do not fit")
        fn = self._affine_euler

        def euler(theta: np.ndarray, v: np.ndarray, noise: np.ndarray | None, eta: float, decay: float, steps: int) -> None:
            _check_euler("affine_euler", theta, v, noise, e, steps, dim)
            m = theta.shape[0]
            fn(m, dim, e, a.ctypes.data, c.ctypes.data, float(eta), float(decay),
               None if noise is None else noise.ctypes.data, theta.ctypes.data, v.ctypes.data)

        euler.keep = (a, c)
        return euler

    def gather_gram(self, pool: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """``out [E, F, F]``, ``out[i] = pool[idx[i]].T @ pool[idx[i]]`` for ``pool [R, F]`` float64 and
        ``idx [E, Bm]`` int64 indices into it, without gathering the rows first."""
        pool = np.ascontiguousarray(pool, dtype=np.float64)
        idx = np.ascontiguousarray(idx, dtype=np.int64)
        if pool.ndim != 2 or idx.ndim != 2:
            raise ValueError(f"gather_gram: pool {pool.shape} and idx {idx.shape} must be 2-D")
        _check_indices("gather_gram", idx, pool.shape[0])
        e, bm = idx.shape
        f = pool.shape[1]
        out = np.empty((e, f, f))
        if self._gather_gram(e, bm, f, pool.ctypes.data, f, idx.ctypes.data, out.ctypes.data):
            raise MemoryError("gather_gram: scratch allocation failed")
        return out

    def gmm_loglik(self, theta: np.ndarray, components: int, rows: np.ndarray) -> np.ndarray:
        """log p(y_b | theta_m) ``[M, B]`` for ``rows [B, >= d]`` (y in the first d columns)."""
        theta, rows, m, d, b, f = _gmm_arguments("gmm_loglik", theta, components, rows)
        out = np.empty((m, b))
        if self._gmm_loglik(m, components, d, b, theta.ctypes.data, rows.ctypes.data, f, out.ctypes.data):
            raise MemoryError("gmm_loglik: scratch allocation failed")
        return out

    def gmm_total32(self, theta: np.ndarray, components: int, rows: np.ndarray,
                    reach: float = math.inf) -> tuple[np.ndarray, np.ndarray]:
        """sum_b log p(y_b | theta_m) ``[M]`` for ``rows [B, >= d]`` (y in the first d columns), the
        terms in float32 on rows centred in float64 (models/_native.c, gmm_total32: what it costs
        in accuracy), and which particles it left out ``[M]`` bool (NaN there): those whose
        narrowest sigma puts the farthest row beyond ``reach`` sigmas, or with NaN parameters."""
        theta, rows, m, d, b, f = _gmm_arguments("gmm_total32", theta, components, rows)
        out, far = np.empty(m), np.empty(m, dtype=np.int8)
        if self._gmm_total32(m, components, d, b, theta.ctypes.data, rows.ctypes.data, f, float(reach),
                             out.ctypes.data, far.ctypes.data):
            raise MemoryError("gmm_total32: scratch allocation failed")
        return out, far.astype(bool)


    def em_stats(self, y: np.ndarray, w: np.ndarray, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
        """The E step of a diagonal Gaussian mixture and its sums: ``[K, 1 + 2d]`` = sum over the rows
        ``y [n, d]`` of the responsibilities under (``w [K]``, ``mu [K, d]``, ``var [K, d]``) times
        (1, y, y^2) (models/mixture.py, ``_em_stats``)."""
        y = np.ascontiguousarray(y, dtype=np.float64)
        k, d = mu.shape
        w, mu, var = (np.ascontiguousarray(a, dtype=np.float64) for a in (w, mu, var))
        if y.ndim != 2 or y.shape[1] != d or w.shape != (k,) or var.shape != (k, d):
            raise ValueError(f"em_stats: y {y.shape}, w {w.shape}, mu {mu.shape} and var {var.shape} do not fit")
        out = np.empty((k, 1 + 2 * d))
        if self._em_stats(k, d, y.shape[0], y.ctypes.data, d, w.ctypes.data, mu.ctypes.data, var.ctypes.data, out.ctypes.data):
            raise MemoryError("em_stats: scratch allocation failed")
        return out

    def em_run(self, y: np.ndarray, w: np.ndarray, mu: np.ndarray, var: np.ndarray, means: np.ndarray | None,
               iterations: int, floor: float = 0.0, map_weight: float | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``iterations`` EM steps (E, then M) on the rows ``y [n, d]`` from (``w [K]``, ``mu [K, d]``,
        ``var [K, d]``): models/mixture.py's ``_em_matrix`` steps (``means [K, d]``: where a component
        has no rows, ``floor`` its variances' floor), or with ``map_weight`` (each row standing for
        that many) ``_map_em``'s. Returns the new (w, mu, var)."""
        y = np.ascontiguousarray(y, dtype=np.float64)
        k, d = np.shape(mu)
        w, mu, var = (np.array(a, dtype=np.float64, order="C") for a in (w, mu, var))  # copies: overwritten
        means = np.ascontiguousarray(mu if means is None else means, dtype=np.float64)
        if y.ndim != 2 or y.shape[1] != d or w.shape != (k,) or var.shape != (k, d) or means.shape != (k, d):
            raise ValueError(f"em_run: y {y.shape}, w {w.shape}, mu {mu.shape}, var {var.shape} and means "
                             f"{means.shape} do not fit")
        if self._em_run(k, d, y.shape[0], y.ctypes.data, d, w.ctypes.data, mu.ctypes.data, var.ctypes.data,
                        means.ctypes.data, int(iterations), float(floor), int(map_weight is not None),
                        float(map_weight or 1.0)):
            raise MemoryError("em_run: scratch allocation failed")
        return w, mu, var

    def laplace_rows(self, y: np.ndarray, w: np.ndarray, mu: np.ndarray, var: np.ndarray, big_n: np.ndarray,
                     rb: np.ndarray, rbb: np.ndarray) -> np.ndarray:
        """The rows' part of models/mixture.py's ``_laplace_pass`` for ``y [n, d]`` under (``w [K]``,
        ``mu [K, d]``, ``var [K, d]``): returns the rows' scores ``[n, K - 1 + 2Kd]`` and adds their
        responsibilities' sums to ``big_n [K]``, ``rb [K, 2d]`` and ``rbb [K, 2d, 2d]`` (C-contiguous
        float64, updated in place)."""
        y = np.ascontiguousarray(y, dtype=np.float64)
        k, d = np.shape(mu)
        w, mu, var = (np.ascontiguousarray(a, dtype=np.float64) for a in (w, mu, var))
        if (y.ndim != 2 or y.shape[1] != d or w.shape != (k,) or var.shape != (k, d) or big_n.shape != (k,)
                or rb.shape != (k, 2 * d) or rbb.shape != (k, 2 * d, 2 * d)
                or not all(a.dtype == np.float64 and a.flags.c_contiguous for a in (big_n, rb, rbb))):
            raise ValueError(f"laplace_rows: y {y.shape}, w {w.shape}, mu {mu.shape}, var {var.shape}, big_n "
                             f"{big_n.shape}, rb {rb.shape} and rbb {rbb.shape} do not fit")
        sc = np.empty((y.shape[0], k - 1 + 2 * k * d))
        if self._laplace_rows(k, d, y.shape[0], y.ctypes.data, d, w.ctypes.data, mu.ctypes.data, var.ctypes.data,
                              sc.ctypes.data, big_n.ctypes.data, rb.ctypes.data, rbb.ctypes.data):
            raise MemoryError("laplace_rows: scratch allocation failed")
        return sc

    def weight_em(self, y: np.ndarray, wts: np.ndarray, mu: np.ndarray, s: np.ndarray, w: np.ndarray, sweeps: int,
                  tol: float) -> tuple[np.ndarray, np.ndarray]:
        """The weights' EM of models/mixture.py's ``_particle_counts`` for rows ``y [R, d]`` with weights
        ``wts [R]``, particles' means ``mu [M, K, d]`` and log variances ``s [M, K, d]``, from the
        normalised weights ``w [M, K]``: (counts [M, K], the last weights [M, K])."""
        y, wts, mu, s = (np.ascontiguousarray(a, dtype=np.float64) for a in (y, wts, mu, s))
        w = np.array(w, dtype=np.float64, order="C")  # a copy: the kernel overwrites it
        m, k, d = mu.shape
        if y.ndim != 2 or y.shape[1] != d or wts.shape != (y.shape[0],) or s.shape != mu.shape or w.shape != (m, k):
            raise ValueError(f"weight_em: y {y.shape}, wts {wts.shape}, mu {mu.shape}, s {s.shape} and w {w.shape} do not fit")
        counts = np.zeros((m, k))
        if self._weight_em(m, k, d, y.shape[0], y.ctypes.data, d, wts.ctypes.data, mu.ctypes.data, s.ctypes.data,
                           int(sweeps), float(tol), w.ctypes.data, counts.ctypes.data):
            raise MemoryError("weight_em: scratch allocation failed")
        return counts, w


    def t_loglik(self, z: np.ndarray, m: np.ndarray, er: np.ndarray, sr: np.ndarray) -> np.ndarray:
        """``[V, G, G]``: sum over the rows ``z [B]`` of log1p(q^2), q = (z - m_v) er_vj - sr_vi at
        the nodes (v, i, j) of models/heavy.py's Student-t grids (``m [V]``, ``er``, ``sr [V, G]``)."""
        z, m, er, sr = (np.ascontiguousarray(a, dtype=np.float64) for a in (z, m, er, sr))
        v, g = er.shape
        if z.ndim != 1 or m.shape != (v,) or sr.shape != (v, g) or not 1 <= g <= MAX_NODES:
            raise ValueError(f"t_loglik: z {z.shape}, m {m.shape}, er {er.shape} and sr {sr.shape} do not fit "
                             f"(at most {MAX_NODES} nodes a coordinate)")
        out = np.empty((v, g, g))
        if self._t_loglik(v, g, z.shape[0], z.ctypes.data, m.ctypes.data, er.ctypes.data, sr.ctypes.data,
                          out.ctypes.data):
            raise MemoryError("t_loglik: scratch allocation failed")
        return out

    def t_row_lse(self, z: np.ndarray, m: np.ndarray, er: np.ndarray, sr: np.ndarray, half: np.ndarray,
                  base: np.ndarray) -> np.ndarray:
        """``[B]``: for each row of ``z [B]``, log sum over the nodes (v, i, j) of exp(base_vij - half_v
        log1p(q^2)) (q as in ``t_loglik``; ``half [V]``, ``base [V, G, G]`` indexed [v, i, j])."""
        z, m, er, sr, half = (np.ascontiguousarray(a, dtype=np.float64) for a in (z, m, er, sr, half))
        v, g = er.shape
        if z.ndim != 1 or m.shape != (v,) or sr.shape != (v, g) or half.shape != (v,) or base.shape != (v, g, g):
            raise ValueError(f"t_row_lse: z {z.shape}, m {m.shape}, er {er.shape}, sr {sr.shape}, half {half.shape} "
                             f"and base {base.shape} do not fit")
        base_ji = np.ascontiguousarray(np.asarray(base, dtype=np.float64).transpose(0, 2, 1))  # the kernel's layout
        out = np.empty(z.shape[0])
        if self._t_row_lse(v, g, z.shape[0], z.ctypes.data, m.ctypes.data, er.ctypes.data, sr.ctypes.data,
                           half.ctypes.data, base_ji.ctypes.data, out.ctypes.data):
            raise MemoryError("t_row_lse: scratch allocation failed")
        return out

    def nig_update(self, r: np.ndarray, z: np.ndarray, ab: np.ndarray, phi: np.ndarray,
                   y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """models/timeseries.py's ``_srif_nig`` for K components: ``r [K, D, D]`` (upper triangular),
        ``z [K, D]``, ``ab [K, 2]``, ``phi [K, B, D]``, ``y [B]`` -> (R' [K, D, D], z' [K, D],
        ab' [K, 2], log p(y | past) [K]), by Givens rotations (models/_native.c)."""
        r, z, ab, phi, y = (np.ascontiguousarray(a, dtype=np.float64) for a in (r, z, ab, phi, y))
        k, d = z.shape if z.ndim == 2 else (-1, -1)
        b = y.shape[0] if y.ndim == 1 else 0
        if k < 1 or r.shape != (k, d, d) or ab.shape != (k, 2) or phi.shape != (k, b, d) or b < 1:
            raise ValueError(f"nig_update: r {r.shape}, z {z.shape}, ab {ab.shape}, phi {phi.shape} and y {y.shape} "
                             "do not fit")
        r2, z2, ab2, lp = np.empty((k, d, d)), np.empty((k, d)), np.empty((k, 2)), np.empty(k)
        if self._nig_update(k, d, b, r.ctypes.data, z.ctypes.data, ab.ctypes.data, phi.ctypes.data, y.ctypes.data,
                            r2.ctypes.data, z2.ctypes.data, ab2.ctypes.data, lp.ctypes.data):
            raise MemoryError("nig_update: scratch allocation failed")
        return r2, z2, ab2, lp

    def nig_update_into(self, src: np.ndarray, at: tuple[int, int, int], phi: np.ndarray, y: np.ndarray,
                        dst: np.ndarray, lp: np.ndarray) -> None:
        """``nig_update`` on a state laid out in one array: ``R [K, D, D]``, ``z [K, D]`` and ``ab [K, 2]``
        read at the element offsets ``at`` = (R's, z's, ab's) of ``src`` (C-contiguous float64), R', z',
        ab' written at the same offsets of ``dst`` (the same layout) and log p(y | past) into
        ``lp [K]``; K and D from ``phi [K, B, D]``. For models/timeseries.py's point-by-point updates:
        one foreign call, no copies of the state's parts."""
        phi = np.ascontiguousarray(phi, dtype=np.float64)
        y = np.ascontiguousarray(y, dtype=np.float64)
        k, b, d = phi.shape if phi.ndim == 3 else (0, 0, 0)
        o_r, o_z, o_ab = (int(o) for o in at)
        ends = (o_r + k * d * d, o_z + k * d, o_ab + 2 * k)
        if (k < 1 or b < 1 or y.shape != (b,) or lp.shape != (k,) or min(o_r, o_z, o_ab) < 0
                or any(not (a.dtype == np.float64 and a.flags.c_contiguous and a.ndim == 1) for a in (src, dst, lp))
                or src.shape != dst.shape or max(ends) > src.shape[0] or not dst.flags.writeable):
            raise ValueError(f"nig_update_into: a state of {src.shape}, offsets {at}, phi {phi.shape}, y {y.shape} "
                             f"and lp {lp.shape} do not fit")
        s, t = src.ctypes.data, dst.ctypes.data
        if self._nig_update(k, d, b, s + 8 * o_r, s + 8 * o_z, s + 8 * o_ab, phi.ctypes.data, y.ctypes.data,
                            t + 8 * o_r, t + 8 * o_z, t + 8 * o_ab, lp.ctypes.data):
            raise MemoryError("nig_update: scratch allocation failed")


def _check_indices(name: str, idx: np.ndarray, rows: int) -> None:
    """Row indices ``idx`` into a pool of ``rows`` rows, before C reads through them."""
    if idx.size and not (0 <= int(idx.min()) and int(idx.max()) < rows):
        raise ValueError(f"{name}: indices outside the pool of {rows} rows")


def _check_euler(name: str, theta: np.ndarray, v: np.ndarray, noise: np.ndarray | None, evaluations: int,
                 steps: int, dim: int | None = None) -> None:
    """The arguments of a fused Euler run (service/sgais/kernel.py's protocol), before C reads
    them: as many steps as the run has evaluations, theta and v C-contiguous float64 ``[M, D]``
    (D = ``dim`` when given), noise None or ``[evaluations, M, D]``."""
    if steps != evaluations:
        raise ValueError(f"{name}: {steps} steps asked of a run prepared for {evaluations} evaluations")
    shape = theta.shape if theta.ndim == 2 and (dim is None or theta.shape[1] == dim) else None
    for x in (theta, v):
        if shape is None or not (x.flags.c_contiguous and x.dtype == np.float64 and x.shape == shape):
            raise ValueError(f"{name}: theta and v must be C-contiguous float64 arrays of one shape [M, "
                             f"{'D' if dim is None else dim}], got {theta.shape} and {v.shape}")
    if noise is not None and not (noise.flags.c_contiguous and noise.dtype == np.float64
                                  and noise.shape == (evaluations, *shape)):
        raise ValueError(f"{name}: noise must be C-contiguous float64 of shape {(evaluations, *shape)}")


class GmmRun:
    """``grad(theta [M, D], i) -> [M, D]`` for one SGHMC run (``NativeKernels.gmm_run``), and
    ``euler``: the run's whole Euler integration in one foreign call (service/sgais/kernel.py)."""

    def __init__(self, fn, components: int, chunk: np.ndarray, lam: float, pool: np.ndarray, idx: np.ndarray,
                 pool_weight: float) -> None:
        chunk = np.ascontiguousarray(chunk, dtype=np.float64)
        pool = np.ascontiguousarray(pool, dtype=np.float64)
        idx = np.ascontiguousarray(idx, dtype=np.int64)
        if chunk.ndim != 2 or pool.ndim != 2 or idx.ndim != 2 or pool.shape[1] != chunk.shape[1]:
            raise ValueError(f"gmm_run: chunk {chunk.shape}, pool {pool.shape} and idx {idx.shape} do not fit")
        _check_indices("gmm_run", idx, pool.shape[0])
        self._fn, self.components = fn, components
        self._chunk, self._pool, self._idx = chunk, pool, idx  # the pointers below stay valid while self lives
        self._lam, self._wp = float(lam), float(pool_weight)
        self.evaluations = idx.shape[0]

    def _call(self, theta: np.ndarray, i: int, steps: int, eta: float, decay: float, noise, v, out) -> None:
        m, dim = theta.shape
        d = (dim // self.components - 1) // 2
        if self._chunk.shape[1] < d:
            raise ValueError(f"gmm_run: rows of width {self._chunk.shape[1]} for {d} dimensions")
        bc, bm = self._chunk.shape[0], self._idx.shape[1]
        err = self._fn(
            m, self.components, d, bc, self._chunk.ctypes.data, self._chunk.shape[1], self._lam,
            bm, self._pool.ctypes.data, self._pool.shape[1], self._idx.ctypes.data + i * bm * 8, self._wp,
            steps, eta, decay, noise, theta.ctypes.data, v, out.ctypes.data,
        )
        if err:
            raise MemoryError("gmm_run: scratch allocation failed")

    @staticmethod
    def _theta(theta: np.ndarray) -> np.ndarray:
        if not (theta.ndim == 2 and theta.flags.c_contiguous and theta.dtype == np.float64):
            raise ValueError("gmm_run: theta must be a C-contiguous float64 [M, D] array")
        return theta

    def __call__(self, theta: np.ndarray, i: int) -> np.ndarray:
        theta = self._theta(theta)
        if not 0 <= i < self.evaluations:
            raise ValueError(f"gmm_run: evaluation {i} of a run of {self.evaluations}")
        out = np.empty(theta.shape)
        self._call(theta, i, 0, 0.0, 0.0, None, None, out)
        return out

    def euler(self, theta: np.ndarray, v: np.ndarray, noise: np.ndarray | None, eta: float, decay: float, steps: int) -> None:
        """All E evaluations' Euler steps, in place on ``theta`` and ``v [M, D]``:
        v <- decay v + eta grad + noise[i] (``noise [E, M, D]`` or None), theta <- theta + v."""
        _check_euler("gmm_run", theta, v, noise, self.evaluations, steps)
        out = np.empty(theta.shape)
        self._call(theta, 0, self.evaluations, float(eta), float(decay),
                   None if noise is None else noise.ctypes.data, v.ctypes.data, out)


_ON = ("1", "true", "t", "yes", "y", "on")
_OFF = ("0", "false", "f", "no", "n", "off")


def _enabled() -> bool:
    raw = os.environ.get("CUSP_NATIVE", "1").strip().lower()
    if raw not in _ON + _OFF:
        raise ValueError(f"CUSP_NATIVE={raw!r}: expected one of {', '.join(_ON + _OFF)}")
    return raw in _ON


@cache
def kernels() -> NativeKernels | None:
    """The loaded kernels, or None (not built, or CUSP_NATIVE off). The service validates
    CUSP_NATIVE and CUSP_NATIVE_ISA at start-up (service/settings.py); the library accepts
    the same values."""
    if not _enabled():
        return None
    spec = importlib.util.find_spec("models._native")
    if spec is None or not spec.origin or not spec.origin.endswith((".so", ".pyd", ".dylib")):
        return None
    try:
        return NativeKernels(ctypes.CDLL(spec.origin))
    except (OSError, AttributeError):  # not loadable, or a stale build without this version's symbols
        return None


def status() -> str:
    k = kernels()
    if k is not None:
        return f"native ({k.isa})"
    if not _enabled():
        return "numpy/torch (native kernel off: CUSP_NATIVE)"
    return "numpy/torch (native kernel not built: install with a C compiler)"

"""The native kernels (models/_native.c), loaded with ctypes, or ``None`` when they are not
built (no C compiler at install time) or are turned off with ``CUSP_NATIVE=0``.

Callers keep their numpy/torch path as the fallback and as the reference the native result
is tested against (tests/test_native.py). ``status()`` says which path runs, for logs and the
benchmark report.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from collections.abc import Callable
from functools import cache

import numpy as np


class NativeKernels:
    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i, L, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_double
        self._gmm_grad = lib.cusp_gmm_grad
        self._gmm_grad.argtypes = [i, i, i, L, p, p, L, p, f, p]
        self._gmm_grad.restype = i
        self._gmm_loglik = lib.cusp_gmm_loglik
        self._gmm_loglik.argtypes = [i, i, i, L, p, p, L, p]
        self._gmm_loglik.restype = i
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

    def gmm_loglik(self, theta: np.ndarray, components: int, rows: np.ndarray) -> np.ndarray:
        """log p(y_b | theta_m) ``[M, B]`` for ``rows [B, >= d]`` (y in the first d columns)."""
        theta = np.ascontiguousarray(theta, dtype=np.float64)
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        m, dim = theta.shape
        d = (dim // components - 1) // 2
        b, f = rows.shape
        if f < d:
            raise ValueError(f"gmm_loglik: rows of width {f} for {d} dimensions")
        out = np.empty((m, b))
        if self._gmm_loglik(m, components, d, b, theta.ctypes.data, rows.ctypes.data, f, out.ctypes.data):
            raise MemoryError("gmm_loglik: scratch allocation failed")
        return out


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
    except OSError:
        return None


def status() -> str:
    k = kernels()
    if k is not None:
        return f"native ({k.isa})"
    if not _enabled():
        return "numpy/torch (native kernel off: CUSP_NATIVE)"
    return "numpy/torch (native kernel not built: install with a C compiler)"

"""Importance weights: log-normalisation, ESS, the adaptive temperature increment and resampling.

Conventions owned here (the engine relies on them):
- Log-weights are float64 numpy vectors ``[M]`` kept normalised (logsumexp = 0). The
  evidence is tracked separately as the sum of the increments returned by ``reweight``.
- Tempered reweighting: moving the chunk's temperature from lambda to lambda + delta
  multiplies particle i's weight by p(chunk | theta_i)^delta, i.e. adds ``delta * ll[i]``
  to its log-weight; the log-evidence increment is logsumexp(logw + delta * ll) - logsumexp(logw).
- The increment delta is chosen so that the ESS of the *new* weights (current weights
  included) falls to the target. If the current ESS is already at or below the target
  (possible only when resampling is off or its threshold lies below the target), the
  conditional ESS of the increment (Zhou, Johansen and Aston 2016) is used instead; with
  uniform current weights it equals the paper's ESS(delta) of Eq. (4.15).
"""

from __future__ import annotations

import numpy as np
import torch

NEG_INF = -np.inf


def log_normalise(logw: np.ndarray) -> tuple[np.ndarray, float]:
    """``logw [M]`` -> (normalised log-weights [M], logsumexp). -inf entries stay -inf; all -inf raises."""
    top = float(np.max(logw))
    if not np.isfinite(top):
        raise FloatingPointError("all particle weights are zero or not finite")
    lse = top + float(np.log(np.sum(np.exp(logw - top))))
    return logw - lse, lse


def ess(logw: np.ndarray) -> float:
    """Effective sample size (sum w)^2 / sum w^2 of (possibly unnormalised) log-weights ``[M]``.
    (``_ess_rows`` is the batched form; this one stays 1-D: numpy's row sums can differ from
    its 1-D sum in the last bit, and resampling decisions compare this value.)"""
    a = logw - np.max(logw)
    w = np.exp(a)
    return float(np.sum(w) ** 2 / np.sum(w * w))


def conditional_ess(logw: np.ndarray, incr: np.ndarray) -> float:
    """M (sum W w)^2 / sum W w^2 for normalised current weights W and incremental log-weights ``incr``."""
    return float(_conditional_ess_rows(logw, incr[None, :])[0])


def _ess_rows(x: np.ndarray) -> np.ndarray:
    """``ess`` of each row of unnormalised log-weights ``[G, M]``."""
    w = np.exp(x - x.max(axis=1, keepdims=True))
    return w.sum(axis=1) ** 2 / (w * w).sum(axis=1)


def _conditional_ess_rows(logw: np.ndarray, incr: np.ndarray) -> np.ndarray:
    """``conditional_ess`` of each row of increments ``[G, M]``."""
    W = np.exp(logw - np.max(logw))
    W /= W.sum()
    om = np.exp(incr - incr.max(axis=1, keepdims=True))
    return len(logw) * (om @ W) ** 2 / ((om * om) @ W)


#: sections per round of the bisection: six steps for one [63, M] evaluation instead of six [M] ones
_SECTIONS = 64


def choose_delta(logw: np.ndarray, ll: np.ndarray, max_delta: float, target: float, rtol: float = 1e-10) -> float:
    """The temperature increment in (0, max_delta]: max_delta if the ESS stays >= target there,
    else the root, returned from the side where the ESS is just below the target, within a
    relative bracket of ``rtol``.

    ``logw [M]`` normalised log-weights, ``ll [M]`` the chunk's log-likelihood per particle.
    Bisection, six steps per round: the ESS is evaluated at the 63 inner points of the
    bracket's 64 sections in one [63, M] call, then bisection walks those values.
    """
    finite = np.isfinite(ll)
    if np.any(np.isnan(ll)) or np.any(ll == np.inf):
        raise FloatingPointError("chunk log-likelihood is NaN or +inf for some particle")
    if not np.any(finite & np.isfinite(logw)):
        raise FloatingPointError("chunk log-likelihood is -inf for every weighted particle")
    use_full = ess(logw) > target * (1.0 + 1e-12)
    llf = np.where(finite, ll, 0.0)

    def f(d: np.ndarray) -> np.ndarray:
        inc = np.where(finite, d[:, None] * llf, NEG_INF)  # [G, M]
        return _ess_rows(logw + inc) if use_full else _conditional_ess_rows(logw, inc)

    if f(np.array([max_delta]))[0] >= target:
        return max_delta
    lo, hi = 0.0, max_delta
    grid = np.arange(1, _SECTIONS) / _SECTIONS
    for _ in range(40):
        pts = lo + (hi - lo) * grid
        ok = f(pts) >= target
        # bisection on the evaluated grid: the same midpoints, so the same root where the ESS
        # crosses the target more than once (it need not be monotone in delta)
        i_lo, i_hi = 0, _SECTIONS
        while i_hi - i_lo > 1:
            mid = (i_lo + i_hi) // 2
            if ok[mid - 1]:
                i_lo, lo = mid, float(pts[mid - 1])
            else:
                i_hi, hi = mid, float(pts[mid - 1])
            if hi - lo <= rtol * hi:
                return hi
    return hi


def reweight(logw: np.ndarray, ll: np.ndarray, delta: float) -> tuple[np.ndarray, float]:
    """Add ``delta * ll`` and renormalise: returns (new normalised log-weights, log-evidence increment)."""
    inc = np.where(np.isfinite(ll), delta * np.where(np.isfinite(ll), ll, 0.0), NEG_INF)
    return log_normalise(logw + inc)


def resample_indices(generator: torch.Generator, logw: np.ndarray, scheme: str, count: int | None = None) -> np.ndarray:
    """Ancestor indices ``[count]`` (None: as many as the weights, ``[M]``) drawn proportionally to the
    weights ``logw [M]``: 'systematic' (one uniform) or 'multinomial'."""
    n = len(logw)
    m = n if count is None else int(count)
    W = np.exp(logw - np.max(logw))
    cdf = np.cumsum(W / W.sum())
    cdf[-1] = 1.0
    if scheme == "systematic":
        u0 = float(torch.rand((), generator=generator, dtype=torch.float64))
        u = (u0 + np.arange(m)) / m
    elif scheme == "multinomial":
        u = np.sort(torch.rand(m, generator=generator, dtype=torch.float64).numpy())
    else:
        raise ValueError(f"unknown resampling scheme {scheme!r}")
    return np.minimum(np.searchsorted(cdf, u, side="right"), n - 1)

"""Synthetic data sets of papers/001 (section 6, Appendix B), reusable by the demo and the tests.

Every generator is deterministic given ``seed`` and *prefix-consistent*: ``f(n1, seed)`` is the
first ``n1`` rows of ``f(n2, seed)`` for ``n1 <= n2`` (rows are drawn in fixed blocks, each
from its own seeded stream), so a benchmark can run SGAIS once over the largest data set and
compare its intermediate estimates with references computed on the first ``n`` rows, as the
paper does. The generating parameters depend on ``seed`` only (not on ``n``).

All return float64 torch tensors with the stream's columns in order; for the supervised
models the target is the last column (what ``build_model`` assumes by default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 8192


def _param_rng(seed: int, tag: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), tag, 0xC05])


def _blocks(n: int, seed: int, tag: int, draw: Callable[[np.random.Generator, int], np.ndarray]) -> np.ndarray:
    """Concatenate ``draw(rng_i, rows)`` over fixed-size blocks i, each with its own stream."""
    if n < 0:
        raise ValueError("n must be non-negative")
    parts = []
    for i, start in enumerate(range(0, n, BLOCK)):
        # always a whole block, then cut: a block's rows do not depend on how many are kept
        rng = np.random.default_rng([int(seed), tag, 1, i])
        parts.append(draw(rng, BLOCK)[: min(BLOCK, n - start)])
    if not parts:
        return draw(np.random.default_rng([int(seed), tag, 1, 0]), 0)
    return np.concatenate(parts, axis=0)


# --- linear regression (Appendix B.1) ----------------------------------------------------------
def linear_regression_params(seed: int = 0, features: int = 5) -> tuple[np.ndarray, float]:
    """(w [features], b): drawn from the model's N(0, 1) prior."""
    rng = _param_rng(seed, 1)
    w = rng.standard_normal(features)
    return w, float(rng.standard_normal())


def linear_regression_data(n: int, seed: int = 0, features: int = 5, noise: float = 1.0) -> torch.Tensor:
    """``[n, features + 1]``: x ~ N(0, I), y = w.x + b + N(0, noise^2); y is the last column."""
    w, b = linear_regression_params(seed, features)

    def draw(rng: np.random.Generator, m: int) -> np.ndarray:
        z = rng.standard_normal((m, features + 1))
        x = z[:, :features]
        y = x @ w + b + noise * z[:, features]
        return np.column_stack([x, y])

    return torch.from_numpy(_blocks(n, seed, 1, draw))


# --- logistic (softmax) regression (Appendix B.2) --------------------------------------------------
def logistic_regression_params(seed: int = 0, features: int = 10, classes: int = 4) -> np.ndarray:
    """``[classes, features + 1]`` weights then bias per class, from the N(0, 1) prior."""
    return _param_rng(seed, 2).standard_normal((classes, features + 1))


def logistic_regression_data(n: int, seed: int = 0, features: int = 10, classes: int = 4) -> torch.Tensor:
    """``[n, features + 1]``: x ~ N(0, I), label ~ softmax(W x + b) in 0..classes-1 (as float), last column."""
    wb = logistic_regression_params(seed, features, classes)

    def draw(rng: np.random.Generator, m: int) -> np.ndarray:
        x = rng.standard_normal((m, features))
        u = rng.random(m)
        logits = x @ wb[:, :features].T + wb[:, features]
        p = np.exp(logits - logits.max(1, keepdims=True))
        cdf = np.cumsum(p / p.sum(1, keepdims=True), axis=1)
        labels = np.minimum((u[:, None] > cdf).sum(1), classes - 1)
        return np.column_stack([x, labels.astype(np.float64)])

    return torch.from_numpy(_blocks(n, seed, 2, draw))


# --- Gaussian mixtures (Appendix B.3) ------------------------------------------------------------
@dataclass(frozen=True)
class Mixture:
    """Diagonal Gaussian mixture: weights [K], means [K, d], standard deviations [K, d]."""

    weights: np.ndarray
    means: np.ndarray
    sds: np.ndarray

    def sample(self, rng: np.random.Generator, m: int) -> np.ndarray:
        k, d = self.means.shape
        comp = np.minimum(np.searchsorted(np.cumsum(self.weights), rng.random(m), side="right"), k - 1)
        return self.means[comp] + self.sds[comp] * rng.standard_normal((m, d))


def gmm_params(seed: int = 0, components: int = 5, dims: int = 2) -> Mixture:
    """Weights ~ Dirichlet(2), means uniform in [-5, 5]^d, standard deviations uniform in [0.4, 1.2]."""
    rng = _param_rng(seed, 3)
    weights = rng.dirichlet(np.full(components, 2.0))
    means = rng.uniform(-5.0, 5.0, (components, dims))
    sds = rng.uniform(0.4, 1.2, (components, dims))
    return Mixture(weights, means, sds)


def gmm_data(n: int, seed: int = 0, components: int = 5, dims: int = 2) -> torch.Tensor:
    """``[n, dims]`` i.i.d. draws from ``gmm_params(seed, components, dims)``."""
    mix = gmm_params(seed, components, dims)
    return torch.from_numpy(_blocks(n, seed, 3, mix.sample))


#: the distribution-shift clusters (papers/001 section 6.2, Figure 1): 3, then 5 including the
#: first 3, then 7 including the 5. Each later phase adds one separate cluster and one that
#: partly overlaps an earlier one (cluster 4 overlaps 2, cluster 6 overlaps 0).
SHIFT_MEANS = np.array([
    [-4.0, -3.0], [4.0, -3.0], [0.0, 4.0],   # phase 1
    [-4.5, 3.0], [1.5, 4.5],                 # phase 2
    [4.0, 1.5], [-2.5, -1.5],                # phase 3
])
SHIFT_SDS = np.array([0.8, 0.8, 0.9, 0.8, 0.7, 0.8, 0.9])
SHIFT_PHASES = (3, 5, 7)
SHIFT_CHANGES = (1_000, 10_000)


def distribution_shift_data(n: int = 100_000, seed: int = 0,
                            changes: tuple[int, int] = SHIFT_CHANGES) -> tuple[torch.Tensor, list[int]]:
    """The paper's non-stationary stream: rows ``[0, changes[0])`` from 3 equally weighted 2-D
    Gaussian clusters, ``[changes[0], changes[1])`` from 5 (the 3 plus 2 more), the rest from 7.
    Returns (data ``[n, 2]`` float64, the change indices that fall inside ``n``)."""
    c1, c2 = changes
    if not 0 < c1 < c2:
        raise ValueError("changes must be increasing positive indices")

    # one block-seeded stream per row range keeps the generator prefix-consistent
    z = _blocks(n, seed, 4, lambda rng, m: np.column_stack([rng.standard_normal((m, 2)), rng.random(m)]))
    idx = np.arange(n)
    active = np.where(idx < c1, SHIFT_PHASES[0], np.where(idx < c2, SHIFT_PHASES[1], SHIFT_PHASES[2]))
    comp = np.minimum((z[:, 2] * active).astype(np.int64), active - 1)
    out = SHIFT_MEANS[comp] + SHIFT_SDS[comp, None] * z[:, :2]
    return torch.from_numpy(out), [c for c in changes if c < n]


def shuffled(data: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """A seeded row permutation (the stationary control of papers/001 section 7.2)."""
    perm = np.random.default_rng([int(seed), 0x5EF]).permutation(data.shape[0])
    return data[torch.from_numpy(perm)]

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


# the distribution-shift clusters (papers/001 section 6.2, Figure 1): the service's demo data,
# defined once in service/demo.py (the service must not import the benchmarks)
from service.demo import SHIFT_CHANGES, SHIFT_MEANS, SHIFT_PHASES, SHIFT_SDS, distribution_shift_data  # noqa: E402,F401


def shuffled(data: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """A seeded row permutation (the stationary control of papers/001 section 7.2)."""
    perm = np.random.default_rng([int(seed), 0x5EF]).permutation(data.shape[0])
    return data[torch.from_numpy(perm)]

"""The demo stream's data (``cusp serve --demo``, ``cusp feed-demo``): papers/001 section 6.2,
Figure 1: 2-D points from 3 Gaussian clusters, then 5 (the 3 plus 2 more), then 7.

Deterministic given ``seed`` and prefix-consistent: the first ``n1`` rows of
``distribution_shift_data(n2, seed)`` are ``distribution_shift_data(n1, seed)`` (rows are drawn
in fixed blocks, each from its own seeded stream). The same numbers as the benchmarks'
``bench.data.distribution_shift_data``, which the service does not import.
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 8192

#: the clusters: 3, then 5 including the first 3, then 7 including the 5. Each later phase adds
#: one separate cluster and one that partly overlaps an earlier one (4 overlaps 2, 6 overlaps 0).
SHIFT_MEANS = np.array([
    [-4.0, -3.0], [4.0, -3.0], [0.0, 4.0],   # phase 1
    [-4.5, 3.0], [1.5, 4.5],                 # phase 2
    [4.0, 1.5], [-2.5, -1.5],                # phase 3
])
SHIFT_SDS = np.array([0.8, 0.8, 0.9, 0.8, 0.7, 0.8, 0.9])
SHIFT_PHASES = (3, 5, 7)
SHIFT_CHANGES = (1_000, 10_000)


def _uniform_blocks(n: int, seed: int) -> np.ndarray:
    """``[n, 3]``: two standard normals and a uniform per row, block by block (block i from its own stream)."""
    parts = []
    for i, start in enumerate(range(0, n, BLOCK)):
        rng = np.random.default_rng([int(seed), 4, 1, i])  # always a whole block, then cut
        parts.append(np.column_stack([rng.standard_normal((BLOCK, 2)), rng.random(BLOCK)])[: min(BLOCK, n - start)])
    return np.concatenate(parts, axis=0) if parts else np.zeros((0, 3))


def distribution_shift_data(n: int = 100_000, seed: int = 0,
                            changes: tuple[int, int] = SHIFT_CHANGES) -> tuple[torch.Tensor, list[int]]:
    """Rows ``[0, changes[0])`` from 3 equally weighted clusters, ``[changes[0], changes[1])``
    from 5, the rest from 7. Returns (data ``[n, 2]`` float64, the change indices inside ``n``)."""
    if n < 0:
        raise ValueError("n must be non-negative")
    c1, c2 = changes
    if not 0 < c1 < c2:
        raise ValueError("changes must be increasing positive indices")
    z = _uniform_blocks(n, seed)
    idx = np.arange(n)
    active = np.where(idx < c1, SHIFT_PHASES[0], np.where(idx < c2, SHIFT_PHASES[1], SHIFT_PHASES[2]))
    comp = np.minimum((z[:, 2] * active).astype(np.int64), active - 1)
    out = SHIFT_MEANS[comp] + SHIFT_SDS[comp, None] * z[:, :2]
    return torch.from_numpy(out), [c for c in changes if c < n]

"""Random draws that torch.distributions cannot take an explicit generator for."""

from __future__ import annotations

import torch


def standard_gamma(generator: torch.Generator, shape: float, size: tuple[int, ...]) -> torch.Tensor:
    """Gamma(shape, rate=1) draws ``[*size]`` in float64 (Marsaglia-Tsang), deterministic given ``generator``."""
    if shape <= 0:
        raise ValueError("gamma shape must be positive")
    boost = shape < 1.0
    a = shape + 1.0 if boost else shape
    d = a - 1.0 / 3.0
    c = 1.0 / (9.0 * d) ** 0.5
    n = 1
    for s in size:
        n *= s
    out = torch.empty(n, dtype=torch.float64)
    filled = 0
    while filled < n:
        m = max(2 * (n - filled), 16)
        x = torch.randn(m, generator=generator, dtype=torch.float64)
        u = torch.rand(m, generator=generator, dtype=torch.float64)
        v = (1.0 + c * x) ** 3
        ok = (v > 0) & (torch.log(u) < 0.5 * x * x + d - d * v + d * torch.log(v.clamp_min(1e-300)))
        acc = (d * v)[ok][: n - filled]
        out[filled : filled + acc.numel()] = acc
        filled += acc.numel()
    if boost:
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        out = out * u.pow(1.0 / shape)
    return out.view(size)

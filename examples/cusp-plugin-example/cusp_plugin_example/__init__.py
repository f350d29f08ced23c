"""An example cusp model plug-in: each column is Laplace (double-exponential) with its own
location mu and scale b, a heavier-tailed alternative to the Gaussian for spiky metrics.

A plug-in gives only what a model is: its parameter count ``dim``, prior draws
``sample_prior``, the prior density ``log_prior`` and the per-observation ``log_likelihood``.
cusp's base class differentiates them with autograd (closed-form gradients are faster but
optional), and SGAIS computes the evidence. Settings are dataclass fields; a spec sets them:
``laplace:scale=5``.

Parameters live in an unconstrained space (models/base.py): theta = [mu_1..mu_C, log b_1..log b_C],
with priors mu ~ N(0, scale^2) and log b ~ N(0, 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from models import Model, ModelError

LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True)
class Laplace(Model):
    #: the spec name; it must equal the entry point's name in pyproject.toml
    name: ClassVar[str] = "laplace"
    #: prior standard deviation of each column's location
    scale: float = 10.0

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ModelError(f"model 'laplace': scale must be > 0, got {self.scale}")

    @property
    def dim(self) -> int:
        return 2 * self.n_columns

    def sample_prior(self, generator: torch.Generator, n: int) -> torch.Tensor:
        """``[n, 2C]``: locations from N(0, scale^2), log-scales from N(0, 1)."""
        z = torch.randn((n, self.dim), generator=generator, dtype=torch.float64)
        return torch.cat([z[:, : self.n_columns] * self.scale, z[:, self.n_columns :]], dim=1)

    def log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        """``theta [M, 2C]`` -> ``[M]``."""
        mu, log_b = theta[:, : self.n_columns], theta[:, self.n_columns :]
        lp_mu = -0.5 * (LOG_2PI + 2 * math.log(self.scale) + (mu / self.scale) ** 2)
        lp_b = -0.5 * (LOG_2PI + log_b**2)
        return lp_mu.sum(1) + lp_b.sum(1)

    def log_likelihood(self, theta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``theta [M, 2C]``, ``rows [B, C]`` -> ``[M, B]``: the sum over columns of log Laplace(y | mu, b)."""
        mu, log_b = theta[:, None, : self.n_columns], theta[:, None, self.n_columns :]
        return (-math.log(2.0) - log_b - (rows[None] - mu).abs() * torch.exp(-log_b)).sum(-1)

"""SGHMC transition kernels (papers/001 Eq. 3; thesis Algorithm 4) in the paper's scaled
variables: v = epsilon * velocity, learning rate eta = epsilon^2, momentum decay alpha =
gamma * epsilon. Stationary velocity variance is eta, so a run starts from v ~ N(0, eta).

- ``euler``: the paper's update. v <- (1 - alpha) v + eta * grad log f + N(0, 2 (alpha - beta_hat) eta),
  then theta <- theta + v (the position update uses the new velocity).
- ``baoab``: the BAOAB splitting (Leimkuhler and Matthews 2013) with the exact
  Ornstein-Uhlenbeck step c = exp(-alpha): half kick, half drift, friction and noise, half
  drift, half kick. Lower bias at the same step size; one gradient per step (the last
  half kick's gradient is reused by the next step's first).

``grad_fn(theta [M, D], i) -> [M, D]`` returns the gradient of the (stochastic) log target,
i.e. minus the potential gradient, at gradient evaluation ``i`` (0-based; a stochastic
gradient uses its i-th pre-drawn mini-batch). ``euler`` evaluates ``steps`` gradients,
``baoab`` ``steps + 1``. The injected noise of a whole run is drawn in one call. A gradient
that carries ``euler(theta, v, noise, eta, decay, steps)`` (``Model.sampled_run_gradient``) does the
whole Euler run in its own kernel, on the same draws, with no Python between steps.
Functions return new tensors and do not mutate inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

GradFn = Callable[[torch.Tensor, int], torch.Tensor]


def euler(
    generator: torch.Generator, theta: torch.Tensor, v: torch.Tensor, grad_fn: GradFn,
    eta: float, alpha: float, beta_hat: float, steps: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    theta, v = theta.clone(), v.clone()
    noise_sd = math.sqrt(max(2.0 * (alpha - beta_hat) * eta, 0.0))
    decay = 1.0 - alpha
    noise = torch.randn((steps, *v.shape), generator=generator, dtype=v.dtype).mul_(noise_sd) if noise_sd > 0.0 else None
    fused = getattr(grad_fn, "euler", None)
    if fused is not None:
        fused(theta.numpy(), v.numpy(), None if noise is None else noise.numpy(), eta, decay, steps)
        return theta, v
    for i in range(steps):
        g = grad_fn(theta, i)
        v.mul_(decay).add_(g, alpha=eta)
        if noise is not None:
            v.add_(noise[i])
        theta.add_(v)
    return theta, v


def baoab(
    generator: torch.Generator, theta: torch.Tensor, v: torch.Tensor, grad_fn: GradFn,
    eta: float, alpha: float, beta_hat: float, steps: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    theta, v = theta.clone(), v.clone()
    c = math.exp(-alpha)
    noise_sd = math.sqrt((1.0 - c * c) * eta)  # beta_hat does not apply: the OU step is exact
    half = 0.5 * eta
    noise = torch.randn((steps, *v.shape), generator=generator, dtype=v.dtype).mul_(noise_sd) if noise_sd > 0.0 else None
    g = grad_fn(theta, 0)
    for i in range(steps):
        v.add_(g, alpha=half)
        theta.add_(v, alpha=0.5)
        v.mul_(c)
        if noise is not None:
            v.add_(noise[i])
        theta.add_(v, alpha=0.5)
        g = grad_fn(theta, i + 1)
        v.add_(g, alpha=half)
    return theta, v


INTEGRATORS = {"euler": euler, "baoab": baoab}
#: gradient evaluations per run of ``steps`` steps
GRAD_EVALS = {"euler": lambda steps: steps, "baoab": lambda steps: steps + 1}

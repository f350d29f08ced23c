"""Integrators on a harmonic oscillator with noise and friction off: the orbit and the
(shadow) energy are known in closed form."""

import math

import numpy as np
import pytest
import torch

from service.sgais.kernel import baoab, euler

K = 2.0  # U = K theta^2 / 2, grad log target = -K theta


def grad_fn(theta, i):
    return -K * theta


def run(integrator, eta, steps, alpha):
    g = torch.Generator().manual_seed(0)
    theta = torch.tensor([[1.0]], dtype=torch.float64)
    v = torch.tensor([[0.0]], dtype=torch.float64)
    traj = []
    for _ in range(steps):
        theta, v = integrator(g, theta, v, grad_fn, eta, alpha, 0.0, 1)
        traj.append((float(theta), float(v)))
    return np.array(traj)


def test_euler_matches_its_linear_map():
    # v' = v - eta K theta ; theta' = theta + v'  =>  [theta', v'] = A [theta, v]
    eta, steps = 0.01, 500
    a = np.array([[1 - eta * K, 1.0], [-eta * K, 1.0]])
    traj = run(euler, eta, steps, alpha=0.0)
    x = np.array([1.0, 0.0])
    for i in range(steps):
        x = a @ x
        assert traj[i] == pytest.approx(x, abs=1e-12)


def test_euler_energy_does_not_drift():
    # symplectic Euler conserves the shadow energy K theta^2/2 + v^2/(2 eta) - K theta v / 2
    eta = 0.01
    traj = run(euler, eta, 5000, alpha=0.0)
    th, v = traj[:, 0], traj[:, 1]
    prev_theta = np.concatenate([[1.0], th[:-1]])
    shadow = K * prev_theta**2 / 2 + v**2 / (2 * eta) + K * prev_theta * v / 2
    assert np.ptp(shadow) / shadow[0] < 1e-9


def test_baoab_is_leapfrog_without_friction_and_follows_the_orbit():
    eta, steps = 0.01, 2000
    h = math.sqrt(eta)  # physical time per step
    traj = run(baoab, eta, steps, alpha=0.0)
    # leapfrog on a harmonic oscillator rotates at frequency w~ with cos(w~ h) = 1 - K h^2 / 2
    w_tilde = math.acos(1 - K * h * h / 2) / h
    t = h * np.arange(1, steps + 1)
    assert traj[:, 0] == pytest.approx(np.cos(w_tilde * t), abs=1e-9)
    # and stays within O(h^2) of the exact orbit over the first period
    period = int(2 * math.pi / math.sqrt(K) / h)
    assert np.max(np.abs(traj[:period, 0] - np.cos(math.sqrt(K) * t[:period]))) < K * h * h
    # energy: bounded oscillation, no drift
    energy = K * traj[:, 0] ** 2 / 2 + (traj[:, 1] / h) ** 2 / 2
    assert np.ptp(energy) / energy[0] < K * h * h


@pytest.mark.parametrize("integrator", [euler, baoab])
def test_stationary_variance_with_friction_and_noise(integrator):
    # exact-gradient Langevin on N(0, 1/K): the particle variance settles near 1/K
    g = torch.Generator().manual_seed(5)
    eta = 0.01
    theta = torch.zeros(4000, 1, dtype=torch.float64)
    v = math.sqrt(eta) * torch.randn(4000, 1, generator=g, dtype=torch.float64)
    theta, v = integrator(g, theta, v, grad_fn, eta, 0.2, 0.0, 600)
    var = float(theta.var())
    # discretisation bias is O(eta K); the sampling error of a variance over 4000 draws is ~2.2%
    assert var == pytest.approx(1 / K, rel=0.08)


def test_kernels_do_not_mutate_inputs():
    g = torch.Generator().manual_seed(0)
    theta = torch.ones(3, 2, dtype=torch.float64)
    v = torch.zeros(3, 2, dtype=torch.float64)
    for integ in (euler, baoab):
        integ(g, theta, v, grad_fn, 0.01, 0.2, 0.0, 5)
        assert torch.equal(theta, torch.ones(3, 2, dtype=torch.float64)) and torch.equal(v, torch.zeros(3, 2, dtype=torch.float64))

"""A plain SGAIS, papers/001 Algorithm 1, in about 60 lines of torch: the yardstick of ``cusp bench
speed``. Bayesian linear regression (noise 1, weights and bias ~ N(0, 1)), the paper's defaults:
10 particles, target ESS 5, 20 SGHMC steps per intermediate distribution with eta = 0.1 / n,
momentum decay 0.2, mini-batches of 500 from a reservoir of 100,000, multinomial resampling when
the ESS falls below the target, chunks of 500. No cusp code: only torch and the CSV reader.

    python -m bench.plain DATA.csv [--chunk-size 500] [--seed 0]   # prints the log-evidence and its seconds
"""

import argparse
import math
import sys
import time

import numpy as np
import torch


def sgais(x, y, chunk=500, m=10, steps=20, lr=0.1, alpha=0.2, batch=500, cap=100_000, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = x.shape[1] + 1
    xa = torch.cat([x, torch.ones(len(x), 1, dtype=torch.float64)], 1)
    theta = torch.randn(m, d, generator=g, dtype=torch.float64)
    logw = torch.full((m,), -math.log(m), dtype=torch.float64)
    res_x, res_y = torch.empty(cap, d, dtype=torch.float64), torch.empty(cap, dtype=torch.float64)
    log_z, n = 0.0, 0

    def loglik(th, xs, ys):  # [M, B]
        return -0.5 * math.log(2 * math.pi) - 0.5 * (ys - th @ xs.T) ** 2

    def ess(lw):
        w = torch.softmax(lw, 0)
        return 1.0 / float((w * w).sum())

    for lo in range(0, len(y), chunk):
        cx, cy = xa[lo : lo + chunk], y[lo : lo + chunk]
        ll, lam, eta, size = loglik(theta, cx, cy).sum(1), 0.0, lr / (n + len(cy)), min(n, cap)
        while lam < 1.0:
            delta = 1.0 - lam
            if ess(logw + delta * ll) < m / 2:  # bisection: the largest increment keeping the ESS at m / 2
                lo_d, hi_d = 0.0, delta
                for _ in range(50):
                    mid = 0.5 * (lo_d + hi_d)
                    lo_d, hi_d = (mid, hi_d) if ess(logw + mid * ll) >= m / 2 else (lo_d, mid)
                delta = max(lo_d, 1e-12)
            lam = 1.0 if lam + delta >= 1.0 - 1e-12 else lam + delta
            inc = logw + delta * ll
            log_z += float(torch.logsumexp(inc, 0))
            logw = inc - torch.logsumexp(inc, 0)
            if ess(logw) < m / 2:
                idx = torch.multinomial(torch.exp(logw), m, replacement=True, generator=g)
                theta, logw = theta[idx], torch.full((m,), -math.log(m), dtype=torch.float64)
            v = math.sqrt(eta) * torch.randn(m, d, generator=g, dtype=torch.float64)
            for _ in range(steps):  # SGHMC (papers/001 Eq. 3): the chunk at lam plus a scaled mini-batch
                grad = -theta + lam * ((cy - theta @ cx.T) @ cx)
                if n:
                    j = torch.randint(0, size, (batch,), generator=g)
                    grad += (n / batch) * ((res_y[j] - theta @ res_x[j].T) @ res_x[j])
                v = (1 - alpha) * v + eta * grad + math.sqrt(2 * alpha * eta) * torch.randn(m, d, generator=g, dtype=torch.float64)
                theta = theta + v
            ll = loglik(theta, cx, cy).sum(1)
        for i in range(len(cy)):  # reservoir (Algorithm R)
            if n < cap:
                res_x[n], res_y[n] = cx[i], cy[i]
            elif (k := int(torch.randint(0, n + 1, (1,), generator=g))) < cap:
                res_x[k], res_y[k] = cx[i], cy[i]
            n += 1
    return log_z


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.plain")
    p.add_argument("data")
    p.add_argument("--chunk-size", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    table = torch.from_numpy(np.loadtxt(a.data, delimiter=",", skiprows=1, ndmin=2))
    t0 = time.perf_counter()
    log_z = sgais(table[:, :-1], table[:, -1], a.chunk_size, seed=a.seed)
    print(log_z, time.perf_counter() - t0)  # the log-evidence, and the seconds the algorithm took
    return 0


if __name__ == "__main__":
    sys.exit(main())

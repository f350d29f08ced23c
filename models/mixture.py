"""Gaussian models: the paper's diagonal Gaussian mixture (papers/001 Appendix B.3) and the
conjugate Normal-Inverse-Gamma Gaussian for univariate or multivariate metric streams.

Both read every column and featurize a row y ``[d]`` as (y, y^2) ``[2d]`` so that the
per-component quadratic forms are one matrix product.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np
import torch

from models._random import standard_gamma
from models.base import LOG_2PI, Model, ModelError, RunGradient
from models.native import kernels
from models.timeseries import _check_finite, _clean_warmup, _warmup_frame, skip_counted


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise ModelError(f"{name} must be a positive number, got {value!r}")


def _check_frame_warmup(model) -> None:
    """A ``warmup`` (``gaussian``, ``gmm``): 0, or 2 to 10,000 rows whose values (x columns) a state
    can hold until the frame is fixed; else a ModelError naming the setting."""
    w, name = model.warmup, model.name
    if not (isinstance(w, int) and not isinstance(w, bool) and (w == 0 or 2 <= w <= 10_000)):
        raise ModelError(f"{name}: warmup must be 0 (the prior in the data's units) or an integer in [2, 10000] "
                         f"(a frame from the first rows), got {w!r}")
    if w * model.n_columns > model.MAX_WARMUP_VALUES:
        raise ModelError(f"{name}: warmup x columns must be at most {model.MAX_WARMUP_VALUES:,} (the warm-up rows are "
                         f"kept until the frame is fixed), got {w} x {model.n_columns}")


@dataclass(frozen=True)
class GaussianMixture(Model):
    """Mixture of ``components`` diagonal Gaussians in d = n_columns dimensions.

    Prior (paper B.3): weights ~ Dirichlet(1), variances ~ InverseGamma(1, 1), means ~
    N(0, 4 sigma^2) given the variances. Unconstrained ``theta [M, K + 2Kd]`` =
    (z [K], mu [K, d], s [K, d]): weights = softmax(z) with z_k = log g_k, g_k ~ Exp(1)
    independent (normalised exponentials are exactly Dirichlet(1), so the prior on z is
    proper and induces the stated prior on the weights), s = log sigma^2.

    ``warmup`` 0 (the default): the prior is in the data's units, as in the paper. ``warmup`` W >= 2:
    the prior is on each column's (y - centre) / scale, centre and scale the mean and standard
    deviation of the stream's first W rows (``frame_of``), which are conditioned on and not scored,
    as the metric-series models' frame (``models/timeseries.py``). The sampler keeps the frame in
    its state and moves in the frame's units (``service.sgais.engine.Sampler.update``); the
    evidence is in the data's: each scored row's log-likelihood less sum_j log scale_j. Why: the
    prior in data units cannot reach clusters far from 0 against their spread (2-D clusters at 1e4
    with spreads of 1e-2 kept a log predictive of -14 to -9.5 a row where the data support +5).
    """

    name = "gmm"
    multimodal = True
    run_precision = "float32"
    #: its float32 kernels end at 3.4e38: one value of 1e38-1e40 among standard rows made SGHMC
    #: diverge (non-finite particles) on 2 of 3 seeds, with or without a frame; 1e36 on none
    value_limit = 1e30
    #: SGAIS's first-chunk warm-up (``SGAISConfig.warmup`` None): 10x the SGHMC steps on the first chunk
    #: took the error after 500 rows from -18..-116 nats to -3..-14 (5-cluster data, 4 seeds)
    sgais_warmup = 9.0
    components: int = 5
    warmup: int = 0

    #: the most warm-up values (``warmup`` x columns) a state holds until its frame is fixed (512 KiB)
    MAX_WARMUP_VALUES: ClassVar[int] = 65_536

    def __post_init__(self) -> None:
        if not (isinstance(self.components, int) and 1 <= self.components <= 64):
            raise ModelError("gmm: components must be an integer between 1 and 64")
        _check_frame_warmup(self)

    def frame_of(self, rows: torch.Tensor) -> torch.Tensor:
        """The frame ``[2, d]`` (centre; scale) of the warm-up's raw ``rows [W, d]``: per column their
        mean and standard deviation (a constant column: the step its values are recorded in,
        ``models.timeseries.flat_unit``)."""
        cols = [_warmup_frame(rows[:, j].to(torch.float64)) for j in range(rows.shape[1])]
        # (a scale whose inverse overflows, as a constant warm-up of denormals gives: the data's unit instead)
        return torch.tensor([[c for c, _ in cols], [s if s > 0 and math.isfinite(1.0 / s) else 1.0 for _, s in cols]],
                            dtype=torch.float64)

    def frame(self, state) -> tuple[list[float], list[float]] | None:
        """(centre, scale) per column of the frame in a sampler ``state`` (``SGAISState.frame``);
        None while the warm-up lasts."""
        fr = getattr(state, "frame", None)
        if fr is None or not fr.numel():
            return None
        return fr[0].tolist(), fr[1].tolist()

    @property
    def dim(self) -> int:
        return self.components * (1 + 2 * self.n_columns)

    @property
    def feature_width(self) -> int:
        return 2 * self.n_columns

    def parameter_names(self) -> list[str]:
        k, d = self.components, self.n_columns
        return (
            [f"z[{i}]" for i in range(k)]
            + [f"mu[{i}][{j}]" for i in range(k) for j in range(d)]
            + [f"log_var[{i}][{j}]" for i in range(k) for j in range(d)]
        )

    def featurize(self, data: torch.Tensor) -> torch.Tensor:
        self.check_width(data)
        y = data.to(torch.float64)
        return torch.cat([y, y * y], dim=1)

    def _split(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k, d = self.components, self.n_columns
        m = theta.shape[0]
        return theta[:, :k], theta[:, k : k + k * d].reshape(m, k, d), theta[:, k + k * d :].reshape(m, k, d)

    def sample_prior(self, generator: torch.Generator, n: int) -> torch.Tensor:
        k, d = self.components, self.n_columns
        g = standard_gamma(generator, 1.0, (n, k))
        z = torch.log(g)
        var = 1.0 / standard_gamma(generator, 1.0, (n, k, d))
        mu = torch.sqrt(4.0 * var) * torch.randn(n, k, d, generator=generator, dtype=torch.float64)
        return torch.cat([z, mu.reshape(n, -1), torch.log(var).reshape(n, -1)], dim=1)

    def log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        z, mu, s = self._split(theta)
        lp_z = (z - torch.exp(z)).sum(-1)  # log Exp(1) density of g = e^z, plus log-Jacobian z
        lp_s = (-s - torch.exp(-s)).sum((-1, -2))  # InvGamma(1,1) on e^s, plus log-Jacobian s
        lp_mu = (-0.5 * (LOG_2PI + math.log(4.0) + s) - mu * mu * torch.exp(-s) / 8.0).sum((-1, -2))
        return lp_z + lp_s + lp_mu

    def grad_log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        z, mu, s = self._split(theta)
        e = torch.exp(-s)
        g_mu = -mu * e / 4.0
        g_s = -1.5 + e + mu * mu * e / 8.0
        m = theta.shape[0]
        return torch.cat([1.0 - torch.exp(z), g_mu.reshape(m, -1), g_s.reshape(m, -1)], dim=1)

    def _log_joint(self, theta: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """log(weight_k) + log N(y_b; mu_k, sigma_k^2): ``[M, K, B]``, plus the pieces the gradient
        reuses. Components stay on the middle axis, as the matrix product leaves them: reducing
        over a transposed [M, B, K] view cost most of the GMM's time (softmax on strided memory)."""
        z, mu, s = self._split(theta)
        m, k, d = mu.shape
        prec = torch.exp(-s)  # [M, K, d]
        coef = torch.cat([mu * prec, -0.5 * prec], dim=2)  # [M, K, 2d]
        const = torch.log_softmax(z, -1) - 0.5 * (d * LOG_2PI + s.sum(-1) + (mu * mu * prec).sum(-1))  # [M, K]
        quad = (coef.reshape(m * k, 2 * d) @ rows.T).view(m, k, -1)  # [M, K, B]
        return quad.add_(const[:, :, None]), mu, s, prec

    def log_likelihood(self, theta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``[M, B]``: each row's log-likelihood per particle, the evidence's terms. Each component's
        term is centred on its mean, -(y - mu)^2 / 2 sigma^2, here and in the native kernel
        (models/_native.c, gmm_loglik): ``_log_joint``'s raw moments (the gradient's form) cancel in
        float64 once |y| / sigma passes about 1e7 (data at 1,000 in steps of 1e-4 lost 0.04 nats a
        row, 14 over 2,000 rows; at 1e6 in steps of 1e-2, 3,230)."""
        native = kernels()
        if native is not None and not theta.requires_grad:
            return torch.from_numpy(native.gmm_loglik(theta.numpy(), self.components, rows.numpy()))
        z, mu, s = self._split(theta)
        d = self.n_columns
        u2 = ((rows[None, None, :, :d] - mu[:, :, None, :]).square() * torch.exp(-s)[:, :, None, :]).sum(-1)  # [M, K, B]
        const = torch.log_softmax(z, -1) - 0.5 * (d * LOG_2PI + s.sum(-1))  # [M, K]
        out = torch.logsumexp(const[:, :, None] - 0.5 * u2, dim=1)
        # a NaN or infinite parameter: NaN rows (centred, an infinite mean would drop its component)
        return torch.where(torch.isfinite(theta).all(1, keepdim=True), out, torch.full_like(out, math.nan))

    #: the float32 sum's reach: the rows' farthest distance from their mean in the narrowest
    #: component's standard deviations (max over b, k, j of |y_bj - c_j| / sigma_kj). Each row's
    #: value is off by about 6e-8 of that (float32's rounding of (y - c) / sigma): at 1e3, 6e-5 a
    #: row at most, and about 0.02 nats over 10^5 rows (rounding of random sign). Beyond it (two
    #: clusters 10^5 sigma apart: 5 nats off over 10^5 rows; one wild reading at 1e11 among N(0, 1)
    #: rows, which the mean follows: 17 nats) a particle's sum is taken in float64.
    TOTAL32_REACH = 1e3

    def total_log_likelihood(self, theta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """With the native kernel: the sum in one foreign call, its terms in float32 on rows centred
        in float64 (models/_native.c, gmm_total32; about half the float64 kernel's time, which was
        most of a late mode check's), for the particles within ``TOTAL32_REACH``; the others, and
        everything without the kernel, by the base class's float64 blocks of ``log_likelihood``."""
        native = kernels()
        if native is None or theta.requires_grad:
            return super().total_log_likelihood(theta, rows)
        out, far = native.gmm_total32(theta.numpy(), self.components, rows.numpy(), self.TOTAL32_REACH)
        out = torch.from_numpy(out)
        if far.any():
            idx = torch.from_numpy(np.flatnonzero(far))
            out[idx] = super().total_log_likelihood(theta[idx], rows)
        return out

    def total_log_likelihood64(self, theta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The float64 sum (``Model.total_log_likelihood``'s blocks): for a Newton line search, whose
        steps near the mode compare joints a few hundredths of a nat apart."""
        return super().total_log_likelihood(theta, rows)

    def grad_log_likelihood(self, theta: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        lj, mu, s, prec = self._log_joint(theta, rows)
        m, k, d = mu.shape
        wr = torch.softmax(lj, dim=1).mul_(weights)  # [M, K, B] responsibilities x weights
        r_sum = wr.sum(2)  # [M, K]
        stats = wr @ rows  # [M, K, 2d]: sum_b wr y, sum_b wr y^2
        s1, s2 = stats[..., :d], stats[..., d:]
        beta = torch.softmax(theta[:, :k], -1)
        g_z = r_sum - beta * weights.sum()
        g_mu = prec * (s1 - mu * r_sum[..., None])
        g_s = -0.5 * r_sum[..., None] + 0.5 * prec * (s2 - 2.0 * mu * s1 + mu * mu * r_sum[..., None])
        return torch.cat([g_z, g_mu.reshape(m, -1), g_s.reshape(m, -1)], dim=1)

    def sampled_run_gradient(
        self, chunk: torch.Tensor, lam: float, pool: torch.Tensor, idx: torch.Tensor, pool_weight: float,
    ) -> RunGradient:
        """With the native kernel: the mini-batches are gathered inside it, the gradient is
        computed in float32 on centred rows (``run_precision``; models/_native.c, grad_core32,
        about 1.4x the float64 kernel), and the returned gradient carries ``euler``, the run's
        whole Euler integration in one foreign call (no Python between steps). Without it: the
        base class's gather and ``run_gradient`` (float64)."""
        native = kernels()
        if native is None:
            return super().sampled_run_gradient(chunk, lam, pool, idx, pool_weight)
        run = native.gmm_run(self.components, chunk.numpy(), lam, pool.numpy(), idx.numpy(), pool_weight)
        grad = lambda theta, i: torch.from_numpy(run(theta.numpy(), i))  # noqa: E731
        grad.euler = run.euler
        return grad

    def run_gradient(self, rows: torch.Tensor, weights: torch.Tensor) -> RunGradient:
        """Per run. With the native kernel (models/_native.c, the default where it is built): one
        fused pass over the rows per particle, log-joint, softmax and weighted statistics with the
        exps vectorised, about 2x this function's numpy/torch path, which stays as the fallback
        and as the kernel's reference in the tests.

        The numpy/torch path: rows with a ones column, transposed for the log-joint product, and
        weighted for the statistics product, so that an evaluation is two matrix products around
        one softmax over [M, K, B]. The prior's gradient is folded into the same expressions, and
        the small per-particle algebra runs in numpy on views of theta: at [M, K, d] sizes each
        torch op costs a few microseconds of dispatch, about a third of the evaluation, numpy's
        about one."""
        k, d = self.components, self.n_columns
        e, b, f = rows.shape
        native = kernels()
        if native is not None:  # one fused pass per particle (models/_native.c); this path is its reference
            grad_np = native.gmm_grad_run(k, rows.numpy(), weights.numpy())
            return lambda theta, i: torch.from_numpy(grad_np(theta.numpy(), i))
        r1t = torch.empty(e, f + 1, b, dtype=rows.dtype)  # [E, 2d+1, B]: y, y^2, 1
        r1t[:, :f].copy_(rows.transpose(1, 2))
        r1t[:, f].fill_(1.0)
        rwt = r1t * weights  # weighted, [E, 2d+1, B]; two buffers per run, no more
        w_total = float(weights.sum())
        half_log_2pi_d = 0.5 * d * LOG_2PI

        def grad(theta: torch.Tensor, i: int) -> torch.Tensor:
            t = theta.numpy()
            m = t.shape[0]
            z, mu, s = t[:, :k], t[:, k : k + k * d].reshape(m, k, d), t[:, k + k * d :].reshape(m, k, d)
            prec = np.exp(-s)  # [M, K, d]
            mp = mu * prec
            ez = np.exp(z - z.max(1, keepdims=True))
            beta = ez / ez.sum(1, keepdims=True)  # softmax(z)
            coef = np.empty((m, k, 2 * d + 1))
            coef[..., :d] = mp
            np.multiply(prec, -0.5, out=coef[..., d : 2 * d])
            coef[..., 2 * d] = np.log(beta) - half_log_2pi_d - 0.5 * (s.sum(-1) + (mu * mp).sum(-1))
            lj = torch.mm(torch.from_numpy(coef.reshape(m * k, -1)), r1t[i]).view(m, k, -1)  # [M, K, B]
            resp = torch.softmax(lj, dim=1)
            st = torch.mm(resp.view(m * k, -1), rwt[i].T).view(m, k, -1).numpy()  # sum_b w r (y, y^2, 1)
            s1, s2, r_sum = st[..., :d], st[..., d : 2 * d], st[..., 2 * d :]
            mu2 = mu * mu
            # likelihood terms as in grad_log_likelihood, prior terms as in grad_log_prior
            out = np.empty((m, k * (1 + 2 * d)))
            out[:, :k] = r_sum[..., 0] - beta * w_total + 1.0 - np.exp(z)
            out[:, k : k + k * d] = (prec * (s1 - mu * r_sum - 0.25 * mu)).reshape(m, -1)
            g_s = prec * (0.5 * s2 - mu * s1 + 0.5 * mu2 * r_sum + 1.0 + 0.125 * mu2) - 0.5 * r_sum - 1.5
            out[:, k + k * d :] = g_s.reshape(m, -1)
            return torch.from_numpy(out)

        return grad

    def component_shares(self, theta: torch.Tensor, rows: torch.Tensor, blocks: int = 1) -> torch.Tensor:
        """Each component's share of the featurized ``rows``, its mean responsibility, per particle:
        ``[M, K]``; with ``blocks`` > 1, of each of that many equal runs of the rows (their number a
        multiple of it): ``[M, blocks, K]``. The change detector's view of what the mixture's weights
        describe (``signals.shares_moved``). The rows and means are centred on the rows' mean first
        (the responsibilities do not depend on the centre), so ``_log_joint``'s raw moments, one
        matrix product, keep their digits at large offsets."""
        k, d = self.components, self.n_columns
        m = theta.shape[0]
        c = rows[:, :d].mean(0)
        centred = theta.clone()
        centred[:, k : k + k * d] -= c.repeat(k)  # every component's mean, column by column
        resp = torch.softmax(self._log_joint(centred, self.featurize(rows[:, :d] - c))[0], dim=1)
        if blocks <= 1:
            return resp.mean(-1)
        return resp.view(m, k, blocks, -1).mean(-1).transpose(1, 2)  # [M, blocks, K]

    # --- a check of the particles against the dominant mode -------------------------------------
    checks_modes = True

    def mode_gap(self, theta: torch.Tensor, fit_rows: torch.Tensor, generator: torch.Generator,
                 all_rows: torch.Tensor, all_scale: float, **kw) -> float:
        """``mode_fit``'s gap alone."""
        return self.mode_fit(theta, fit_rows, generator, all_rows, all_scale, **kw).gap

    def mode_fit(self, theta: torch.Tensor, fit_rows: torch.Tensor, generator: torch.Generator,
                 all_rows: torch.Tensor, all_scale: float, restarts: int = 12,
                 iterations: int = 25, refine: int = 5, refine_rows: int = 20_000,
                 joint: torch.Tensor | None = None) -> "ModeFit":
        """How far the particles sit below the mixture's dominant mode, in nats of the log joint
        log p(theta) + all_scale * sum log p(all_rows | theta) (``all_rows [N, 2d]``, featurized: the
        reservoir, standing for the history). The mode: ``restarts`` EM fits from k-means++ starts on
        ``fit_rows``, the best of them judged on ``all_rows`` (on a second sample of the history until
        2026-11-27, which ranked two merges 120 nats apart wrongly in 4 of 20 draws: the paper's
        clusters, data seed 1, K = 3, 16,500 rows), refined by ``refine`` EM steps on up to
        ``refine_rows`` of ``all_rows``. Samples of the
        posterior sit about D/2 below its mode; particles that are all copies of a poor mode (two
        clusters in one component, one component where there are no data) sit thousands of nats
        below (issue 20). A check: the fits move no particle.

        Why the refinement: a fit on R rows sits about (n / R) D / 2 below the mode when judged at n
        (about 570 nats for K = 7 at n = 65,536 with R = 2,000), which hid particles stuck that far
        below. Why 12 restarts: with 7 clusters about 1 start in 4 reaches the dominant mode (16
        starts on the paper's 3 -> 5 -> 7 data at 65,500 rows), and with 2 the check's fit was often
        thousands of nats below healthy particles. ``joint [M]``: the particles' log joints on
        ``all_rows``, when the caller has them. Returns the gap with the refined fit (``ModeFit``),
        which ``propose_configuration`` draws whole configurations around."""
        k, d = self.components, self.n_columns
        y = fit_rows[:, :d].numpy()
        if not len(y) or not len(all_rows):
            return ModeFit(0.0, None, 0)
        centre = y.mean(0)
        spread = y.std(0)
        spread = np.where(spread > 0, spread, 1.0)
        ys = (y - centre) / spread

        def as_theta(w: np.ndarray, mu: np.ndarray, var: np.ndarray) -> torch.Tensor:  # standardised -> theta [1, D]
            return torch.from_numpy(np.concatenate([np.log(np.maximum(w, 1e-300)), (centre + spread * mu).ravel(),
                                                    np.log(var * spread**2).ravel()]))[None]

        # every start runs all its steps: ranking them after 8 and finishing the best 4 ("small EM",
        # tried 2026-11-28) took 30 % off the fit's time but left its fit 140 nats lower (K = 7 on
        # the paper's clusters at 16,500 rows, 16 seeds: the gap of healthy runs -220 against -80),
        # and runs stuck 420 nats below the old fit went unflagged
        seeds = torch.randint(0, 2**31 - 1, (restarts,), generator=generator).tolist()
        best, fit = -math.inf, None
        for seed in seeds:
            w, mu, var, _ = _em_matrix(ys, _kmeanspp(ys, k, np.random.default_rng(seed)), iterations)
            th = as_theta(w, mu, var)
            value = float(self.log_prior(th)[0] + all_scale * self.log_likelihood(th, all_rows).sum())
            if value > best:
                best, fit = value, (np.maximum(w, 1e-300), mu, var)
        sub = all_rows
        if len(all_rows) > refine_rows:
            sub = all_rows[torch.randperm(len(all_rows), generator=generator)[:refine_rows]]
        w, mu, var, _ = _em_matrix((sub[:, :d].numpy() - centre) / spread, fit[1], refine, start=fit)
        th = as_theta(w, mu, var)
        fit_prior = float(self.log_prior(th)[0])
        mode = fit_prior + all_scale * float(self.total_log_likelihood(th, all_rows)[0])
        if joint is None:
            joint = self.log_prior(theta) + all_scale * self.total_log_likelihood(theta, all_rows)
        best = int(torch.argmax(joint))
        best_prior = float(self.log_prior(theta[best : best + 1])[0])
        # the likelihood the best particle gives up against the fit, and what the prior pays it for that;
        # not measured where the fit put a component on one repeated value (its variance at EM's floor:
        # a gauge of a few values, a 0/1 column), whose likelihood has no maximum (a 12/13 gauge gave
        # 1,100-7,900 nats against a limit of 60, standardised or not)
        lik_gap = (mode - fit_prior) - (float(joint[best]) - best_prior)
        loss = min(lik_gap, best_prior - fit_prior) if float(var.min()) > 10.0 * EM_VAR_FLOOR else 0.0
        return ModeFit(mode - float(joint[best]), th, len(sub), loss if math.isfinite(loss) and loss > 0 else 0.0)

    #: the Student-t degrees of freedom of ``propose_configuration``'s means and log variances, and
    #: the most components whose label orders it sums over (K! of them)
    CONFIG_DOF = 3.0
    CONFIG_MAX_PERMUTED = 8

    def _configuration_law(self, fit: "ModeFit", n: int) -> tuple[np.ndarray, np.ndarray]:
        """The centres and scales [K, 2d] of ``propose_configuration``'s means and log variances, per
        component: the posterior's spread at n rows around the fit (mu ~ var / c, log var ~ 2 / c for
        the c = w n rows a component explains), widened by the fit's own error (1 + n / the rows it
        was refined on)."""
        k, d = self.components, self.n_columns
        t = fit.theta[0].numpy()
        z, mu, s = t[:k], t[k : k + k * d].reshape(k, d), t[k + k * d :].reshape(k, d)
        c = np.exp(z - _logsumexp(z, 0)) * n
        widen = 1.0 + n / max(fit.rows, 1)
        loc = np.concatenate([mu, s], 1)
        unit = np.concatenate([np.exp(0.5 * s), np.full((k, d), math.sqrt(2.0))], 1)
        return loc, np.sqrt(widen / (1.0 + c))[:, None] * unit

    def _configuration_blocks(self, loc: np.ndarray, scale: np.ndarray, m: int, generator: torch.Generator,
                              relabel: bool = False) -> np.ndarray:
        """``m`` draws of every component's mean and log variance, [M, K, 2d]: a Student-t
        (``CONFIG_DOF``) per coordinate around ``loc`` with ``scale`` ([K, 2d], ``_configuration_law``),
        the components then put in a uniformly random order (the fit's own beyond ``CONFIG_MAX_PERMUTED``
        unless ``relabel``: ``first_draws``)."""
        k, w = loc.shape
        nu = self.CONFIG_DOF
        eps = torch.randn((m, k, w), generator=generator, dtype=torch.float64).numpy()
        chi = standard_gamma(generator, 0.5 * nu, (m, k, w)).numpy() * (2.0 / nu)
        order = torch.argsort(torch.rand((m, k), generator=generator, dtype=torch.float64), dim=1).numpy()
        if k > self.CONFIG_MAX_PERMUTED and not relabel:
            order = np.broadcast_to(np.arange(k), (m, k))
        return (loc[None] + scale[None] * eps / np.sqrt(chi))[np.arange(m)[:, None], order]

    def _configuration_log_q(self, blocks: np.ndarray, loc: np.ndarray, scale: np.ndarray,
                             match: np.ndarray | None = None) -> np.ndarray:
        """log q of the means and log variances of particles given as component blocks [M, K, 2d]: the
        sum over the K! label orders of the product of each block's Student-t density under the
        component it is put on, over K! (the components are exchangeable, so any order of the fit's
        is as good); the fit's own order alone beyond ``CONFIG_MAX_PERMUTED`` components, or, given
        ``match`` [M, K] (draws in a random order, their fit's components apart: ``_labels_apart``),
        the order that matches each particle's blocks to them (``_match_blocks``), over K!: [M]."""
        nu = self.CONFIG_DOF
        k = blocks.shape[1]
        const = math.lgamma(0.5 * (nu + 1)) - math.lgamma(0.5 * nu) - 0.5 * math.log(nu * math.pi)
        u = (blocks[:, :, None, :] - loc[None, None]) / scale[None, None]  # [M, K (blocks), K (fit), 2d]
        f = (const - np.log(scale)[None, None] - 0.5 * (nu + 1) * np.log1p(u * u / nu)).sum(-1)  # [M, K, K]
        if k > self.CONFIG_MAX_PERMUTED and match is not None:  # match [M, K]: the block put on each fit component
            return f[np.arange(len(f))[:, None], match, np.arange(k)[None]].sum(1) - math.lgamma(k + 1)
        if k > self.CONFIG_MAX_PERMUTED:
            return np.einsum("mjj->m", f)
        perms = _permutations(k)  # [K!, K]
        step = max(1, 2_000_000 // (len(perms) * k))  # particles per slice: [slice, K!, K] stays about 16 MB
        out = np.empty(len(f))
        for i in range(0, len(f), step):
            total = f[i : i + step, np.arange(k)[None], perms].sum(-1)  # [slice, K!]
            out[i : i + step] = _logsumexp(total, 1)
        return out - math.lgamma(k + 1)

    def propose_configuration(self, theta: torch.Tensor, fit: "ModeFit", n: int, cands: "JumpCandidates",
                              b: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """An independence proposal of whole configurations around a mode fit (``mode_fit``), for the
        posterior at ``n`` rows (``b`` of them the chunk's):

        1. every component's mean and log variance drawn coordinate by coordinate from a Student-t
           (``CONFIG_DOF``) around the fit with ``_configuration_law``'s scale, the components then
           put in a uniformly random order;
        2. the weights as ``propose_jump`` draws them: z = log(w S), w ~ Dirichlet(1 + the counts of
           ``cands.assign``'s rows under the proposed means and variances), S ~ Gamma(K, 1), the
           prior's (and the posterior's) law of the total, which the likelihood does not see.

        The heavy tails keep q(theta) of a particle far from the fit (a stuck one: two clusters in
        one component, one where there are no data) within a few nats per coordinate of q at the
        fit, and its weights are judged under its own means, so a proposal that gains more than that
        is accepted: what frees particles that no move of one or two components frees (issue 20).
        Returns the proposals and log q(theta) - log q(proposal), the MH proposal ratio: ([M, D], [M])."""
        k, d = self.components, self.n_columns
        m = theta.shape[0]
        loc, scale = self._configuration_law(fit, n)
        blocks = self._configuration_blocks(loc, scale, m, generator)
        t = theta.numpy()
        z, mu, s = t[:, :k], t[:, k : k + k * d].reshape(m, k, d), t[:, k + k * d :].reshape(m, k, d)
        # the t tails can reach log variances whose exp overflows; such a move (to or from one) is
        # refused outright, a placeholder (the fit) keeping every array finite
        here = np.concatenate([mu, s], 2)
        bad = ~(self._sane(blocks, d) & self._sane(here, d))
        blocks = np.where(bad[:, None, None], loc[None], blocks)
        new_mu, new_s = blocks[:, :, :d], blocks[:, :, d:]
        alpha_old = self._weight_counts(mu, s, cands, 1.0, b)
        alpha_new = self._weight_counts(new_mu, new_s, cands, 1.0, b)
        new_z, log_ratio = _propose_weights(generator, z, alpha_old, alpha_new)
        prop = np.concatenate([new_z, new_mu.reshape(m, k * d), new_s.reshape(m, k * d)], 1)
        log_ratio += self._configuration_log_q(here, loc, scale) - self._configuration_log_q(blocks, loc, scale)
        return torch.from_numpy(prop), torch.from_numpy(np.where(bad, -np.inf, log_ratio))

    #: EM steps under the prior (``_map_em``) that move ``first_draws``' fit from the likelihood's
    #: mode to the posterior's: in raw units the prior's pull on the variances (means N(0, 4 sigma^2)
    #: far from 0) is larger than the data's, and the draws around the likelihood's mode missed the
    #: posterior (clusters around 1,000 with spreads of 30: an effective sample of 1-2 in 20,000)
    FIRST_MAP_STEPS = 20
    #: the rows (a uniform sample) under which ``first_draws`` counts each draw's rows per component
    #: for its weights' Dirichlet (``_weight_counts``, whose cost is draws x K x rows x 20 sweeps)
    FIRST_ASSIGN_ROWS = 2_000
    #: EM sweeps on the weights behind the draws' Dirichlet, from the fit's weights (2026-11-27: 20 from
    #: equal weights, as the moves use, before; the same estimates of the evidence within their spread on
    #: 8 seeds of 4 cases, 500-27,000 rows, K = 3 and 5, and half the time: 259 -> 128 ms for 1,000 draws)
    FIRST_WEIGHT_SWEEPS = 3
    #: the most rows ``_map_em`` runs on in ``first_draws`` (beyond: a uniform sample, its statistics
    #: scaled to all). A fit on a sample of R of n rows sits about sqrt(n / R - 1) posterior sds off
    #: the mode in every coordinate, and the draws around it miss the posterior: with 5,000 (until
    #: 2026-11-28) the mode checks' fresh estimates over 26,000-42,000 rows (the late clusters) came
    #: out 20-35 nats lower than with every row, and the runs ended lower (6 seeds, late clusters:
    #: mean -73 -> -43 nats against the Laplace reference; the 3 -> 5 -> 7 clusters, K = 5: -137 ->
    #: -98), for about 25 ms more a check at 40,000 rows
    FIRST_MAP_ROWS = 100_000
    #: ``first_draws`` needs at least this many rows per component in the chunk (a fit of K components
    #: to fewer rows is no law to draw from)
    FIRST_ROWS_PER_COMPONENT = 10

    def first_draws(self, rows: torch.Tensor, generator: torch.Generator, count: int,
                    fit: "ModeFit | None" = None, laplace: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``count`` draws for importance sampling of the posterior given ``rows [B, 2d]`` (featurized;
        the first chunk, or every row seen at a mode check: ``Sampler._check_modes``) and their log
        proposal densities: ([count, D], [count]); None when there are fewer than
        ``FIRST_ROWS_PER_COMPONENT`` rows per component. ``fit``: a mode fit to start from (the mode
        check's), else one is made on ``rows``.

        The proposal is ``propose_configuration``'s law around a mode fit of the chunk (``mode_fit``:
        EM from k-means++ starts, the best on the chunk's log joint): every component's mean and log
        variance from a Student-t around the fit, in a uniformly random order (its density sums over
        the label orders), the weights from a Dirichlet on the chunk's counts under the drawn means
        and variances (``FIRST_WEIGHT_SWEEPS`` EM sweeps from the fit's weights). It does not depend on where the prior sits: on data far from the prior's
        centre (raw units: clusters around 1,000 with spreads of 100) the annealing from prior draws
        ends hundreds of nats low after the first chunk, these draws within a nat of the reference
        (issue 20). Where it misses mass (components with no cluster of their own, whose posterior is
        about their prior) its estimate is low and the annealing's counts (``Sampler._first_chunk``).

        With ``laplace`` (the mode checks' fresh estimates; not the first chunk: below),
        ``LAPLACE_SHARE`` of the draws come from the Laplace law instead (``_laplace``: the
        posterior's mode and negative Hessian, a multivariate Student-t), where there is a mode
        with a positive-definite Hessian; the density is then the two laws' mixture. The
        configuration law's independent coordinates are far from the posterior's shape (the
        weights' Dirichlet as wide as its 2,000 assignment rows allow, every coordinate widened):
        its effective sample was 1-3 of 300 at the mode checks, the Laplace law's share gives
        30-120 (the late clusters at 30,000-50,000 rows; 5-30 at 26,000, where two clusters have
        just appeared), and the estimates 3-14 nats higher, agreeing across seeds within 0.3 nats.
        At the first chunk (500 rows by default, often fewer clusters than components: a posterior
        far from Gaussian) the Laplace law made the detector's restarts, sampled as the incumbent
        is, judge the data moved on unchanged clusters twice as often (8 of 16 verdicts against 4:
        K = 4 on three clusters, seeds 0-7, ``tests/test_detector.py``), so it is off there."""
        k, d = self.components, self.n_columns
        b = int(rows.shape[0])
        if count <= 0 or b < self.FIRST_ROWS_PER_COMPONENT * k:
            return None
        if fit is None or fit.theta is None:
            fit = self.mode_fit(rows.new_zeros((1, self.dim)), rows, generator, rows, 1.0,
                                joint=torch.zeros(1, dtype=torch.float64))
        t = fit.theta[0].numpy()
        y, weight = rows[:, :d].numpy(), 1.0
        if b > self.FIRST_MAP_ROWS:  # the EM under the prior on a uniform sample, its statistics scaled to b (``FIRST_MAP_ROWS``)
            y, weight = y[torch.randperm(b, generator=generator)[: self.FIRST_MAP_ROWS].numpy()], b / self.FIRST_MAP_ROWS
        w, mu, var = _map_em(y, np.exp(t[:k] - _logsumexp(t[:k], 0)), t[k : k + k * d].reshape(k, d),
                             np.exp(t[k + k * d :]).reshape(k, d), self.FIRST_MAP_STEPS, weight)
        fit = ModeFit(0.0, torch.from_numpy(np.concatenate([np.log(w), mu.ravel(), np.log(var).ravel()]))[None], b)
        lap = self._laplace(y, weight, w, mu, var) if laplace and self.LAPLACE_SHARE > 0 else None
        cands = self.assignment_rows(rows, rows[:0], b, generator, rows=self.FIRST_ASSIGN_ROWS)
        loc, scale = self._configuration_law(fit, b)
        # beyond CONFIG_MAX_PERMUTED components, the draws in a random order too where the fit's are
        # apart (``_labels_apart``): in the fit's order they cover one of the K! relabelled copies
        # of the posterior, and the estimate came out log K! low (K = 9: 12.8 nats)
        relabel = k > self.CONFIG_MAX_PERMUTED and self._labels_apart(loc, scale, lap)
        m_lap = int(round(self.LAPLACE_SHARE * count)) if lap is not None else 0
        blocks = self._configuration_blocks(loc, scale, count - m_lap, generator, relabel)
        if m_lap:
            z_lap, blocks_lap = self._laplace_draws(lap, m_lap, generator, relabel)
            blocks = np.concatenate([blocks, blocks_lap])
        bad = ~self._sane(blocks, d)
        blocks = np.where(bad[:, None, None], loc[None], blocks)  # placeholders, given no weight
        mu, s = blocks[:, :, :d], blocks[:, :, d:]
        # the weights' EM starts from the fit's weight of the component each block was drawn around
        # (the nearest in the law's scale: the blocks come in a random order); importance sampling
        # needs no reverse move, so its counts need not be a function of the draw's means alone
        dist = (((blocks[:, :, None, :] - loc[None, None]) / scale[None, None]) ** 2).sum(-1)  # [M, blocks, fit]
        nearest = dist.argmin(2)  # [M, K]
        alpha = self._particle_counts(mu, s, cands, 1.0, b, start=w[nearest], sweeps=self.FIRST_WEIGHT_SWEEPS)
        # the fit component each block sits on, where the laws' densities sum over label orders around it
        # (the Laplace law's always, the configuration law's beyond CONFIG_MAX_PERMUTED), else None
        match = _match_blocks(dist) if relabel or (m_lap and k <= self.CONFIG_MAX_PERMUTED) else None
        z = _draw_weights(generator, alpha[: count - m_lap])
        if m_lap:
            z = np.concatenate([z, z_lap])
        log_q = self._configuration_log_q(blocks, loc, scale, match if relabel else None) + _log_q_weights(z, alpha)
        if m_lap:  # the mixture of the two laws
            log_q = np.logaddexp(math.log1p(-self.LAPLACE_SHARE) + log_q,
                                 math.log(self.LAPLACE_SHARE) + self._laplace_log_q(lap, z, blocks, match))
        theta = np.concatenate([z, mu.reshape(count, k * d), s.reshape(count, k * d)], 1)
        return torch.from_numpy(theta), torch.from_numpy(np.where(bad, np.inf, log_q))

    #: the share of ``first_draws``' draws from the Laplace law (``_laplace``); the rest come from the
    #: configuration law, whose heavy tails cover what the Laplace law misses (components with no
    #: cluster of their own, a posterior far from Gaussian), and the density is the mixture's
    LAPLACE_SHARE = 0.5
    #: the Laplace law's Student-t degrees of freedom (one shared scale per draw: a multivariate t)
    LAPLACE_DOF = 20.0
    #: the most damped Newton steps from the MAP EM's fit to the posterior's mode
    LAPLACE_NEWTON = 6
    #: the Newton decrement (nats) below which the steps stop: the centre then sits within about
    #: sqrt(LAPLACE_TOL) posterior sds of the mode
    LAPLACE_TOL = 0.05
    #: the most rows (evenly spaced) the negative Hessian is computed on, scaled to all
    LAPLACE_INFO_ROWS = 16_384
    #: the Mahalanobis distance (under the mode's negative Hessian) within which a relabelled mode
    #: counts as near the mode: its term in the density's sum over label orders is kept. Farther
    #: ones are below e^-50 of a draw's own term (multivariate t, 20 degrees of freedom, D' <= 60)
    #: for all but draws more than 20 units out (probability below 1e-8)
    LAPLACE_NEAR = 40.0

    def _laplace(self, y: np.ndarray, weight: float, w: np.ndarray, mu: np.ndarray, var: np.ndarray) -> "Laplace | None":
        """The Laplace approximation of the posterior in v: damped Newton steps (``LAPLACE_NEWTON``,
        each halved until the log joint rises; the gradient on every row of ``y``, each standing for
        ``weight``, ``_laplace_gradient``; the negative Hessian on ``LAPLACE_INFO_ROWS`` of them evenly
        spaced, ``_laplace_pass``) from the MAP EM's fit (w, mu, var), and the negative Hessian's
        Cholesky factor at the end; None where it is not positive definite (no mode there)."""
        k, d = self.components, self.n_columns
        n = len(y)
        feats = np.concatenate([np.ones((n, 1)), y, y * y], 1)
        rows_t = torch.from_numpy(np.ascontiguousarray(feats[:, 1:]))
        y_info, w_info = y, weight
        if n > self.LAPLACE_INFO_ROWS:
            y_info = y[np.linspace(0, n - 1, self.LAPLACE_INFO_ROWS).astype(np.int64)]
            w_info = weight * n / self.LAPLACE_INFO_ROWS

        def joint(v: np.ndarray) -> float:  # -inf or NaN where a trial step overflows: refused
            eta = np.append(v[: k - 1], 0.0)
            log_w = eta - _logsumexp(eta, 0)
            mu_, s_ = v[k - 1 : k - 1 + k * d], v[k - 1 + k * d :]
            if not (np.isfinite(v).all() and np.abs(s_).max() <= self.CONFIG_MAX_LOG_VAR):
                return -math.inf
            theta = torch.from_numpy(np.concatenate([log_w, mu_, s_]))[None]
            e = np.exp(-s_)
            prior = float(log_w.sum() + (-s_ - e).sum() - 0.5 * (s_ + mu_ * mu_ * e / 4.0).sum())
            return weight * float(self.total_log_likelihood64(theta, rows_t)[0]) + prior

        v = np.concatenate([np.log(w[: k - 1]) - np.log(w[k - 1]), mu.ravel(), np.log(var).ravel()])
        f = joint(v)
        for _ in range(self.LAPLACE_NEWTON):
            w_, mu_, var_ = _v_unpack(v, k, d)
            info = _laplace_pass(y_info, w_info, w_, mu_, var_)
            chol = _cholesky(info)
            grad = _laplace_gradient(y, feats, weight, w_, mu_, var_)
            if chol is None:  # not yet at a mode (EM stops near saddles too): Levenberg-Marquardt steps
                damped = None
                ridge = 1e-3 * float(np.abs(np.diag(info)).max())
                while damped is None and ridge < 1e12:
                    damped, ridge = _cholesky(info + ridge * np.eye(len(v))), 10.0 * ridge
                if damped is None:
                    return None
                step = np.linalg.solve(damped.T, np.linalg.solve(damped, grad))
            else:
                step = np.linalg.solve(chol.T, np.linalg.solve(chol, grad))
                if not float(grad @ step) > self.LAPLACE_TOL:  # the Newton decrement, in nats (twice the gain)
                    break
            t = 1.0
            while t > 1e-3:
                fc = joint(v + t * step)
                if fc > f:
                    break
                t *= 0.5
            else:
                break
            v, f = v + t * step, fc
        else:
            chol = _cholesky(_laplace_pass(y_info, w_info, *_v_unpack(v, k, d)))
        if chol is None or not np.isfinite(chol).all() or not np.isfinite(v).all():
            return None
        near = np.arange(k)[None]
        if k <= self.CONFIG_MAX_PERMUTED:
            perms = _permutations(k)
            near = perms[_relabelled_distance2(v, chol, perms, d) <= self.LAPLACE_NEAR ** 2]
        return Laplace(v, chol, near)

    #: beyond ``CONFIG_MAX_PERMUTED`` components, ``first_draws`` puts its draws in a random order
    #: when swapping any two of the fit's components costs the configuration law more than this many
    #: nats (and moves the Laplace law's mode beyond ``LAPLACE_NEAR``): the density's sum over the K!
    #: orders is then its matched term alone, within e^-LABEL_GAP
    LABEL_GAP = 30.0

    def _labels_apart(self, loc: np.ndarray, scale: np.ndarray, lap: "Laplace | None") -> bool:
        """Whether every swap of two of the fit's components takes both laws far from themselves
        (``LABEL_GAP``, ``LAPLACE_NEAR``): then any other label order than a particle's matched one
        adds a negligible term to the laws' densities (a permutation moves at least two components)."""
        nu = self.CONFIG_DOF
        u = (loc[:, None, :] - loc[None, :, :]) / scale[None, :, :]  # [K, K, 2d]: component i under j's law
        cost = (0.5 * (nu + 1) * np.log1p(u * u / nu)).sum(-1)
        swap = cost + cost.T
        k = len(loc)
        if (swap[~np.eye(k, dtype=bool)] < self.LABEL_GAP).any():
            return False
        if lap is None:
            return True
        i, j = np.triu_indices(k, 1)
        swaps = np.broadcast_to(np.arange(k), (len(i), k)).copy()
        swaps[np.arange(len(i)), i], swaps[np.arange(len(i)), j] = j, i
        return bool((_relabelled_distance2(lap.mode, lap.chol, swaps, self.n_columns) > self.LAPLACE_NEAR ** 2).all())

    def _laplace_draws(self, lap: "Laplace", m: int, generator: torch.Generator,
                       relabel: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``m`` draws of the Laplace law: v = mode + chol'^-1 eps / sqrt(chi2_nu / nu), the components
        put in a uniformly random order (the fit's beyond ``CONFIG_MAX_PERMUTED`` unless ``relabel``), the total S ~
        Gamma(K, 1): (z [m, K], blocks [m, K, 2d])."""
        k, d = self.components, self.n_columns
        dp = len(lap.mode)
        nu = self.LAPLACE_DOF
        eps = torch.randn((m, dp), generator=generator, dtype=torch.float64).numpy()
        chi = standard_gamma(generator, 0.5 * nu, (m,)).numpy() * (2.0 / nu)
        v = lap.mode[None] + np.linalg.solve(lap.chol.T, eps.T).T / np.sqrt(chi)[:, None]
        order = torch.argsort(torch.rand((m, k), generator=generator, dtype=torch.float64), dim=1).numpy()
        if k > self.CONFIG_MAX_PERMUTED and not relabel:
            order = np.broadcast_to(np.arange(k), (m, k))
        total = standard_gamma(generator, float(k), (m,)).numpy()
        eta = np.concatenate([v[:, : k - 1], np.zeros((m, 1))], 1)
        rows = np.arange(m)[:, None]
        z = (eta - _logsumexp(eta, 1)[:, None] + np.log(total)[:, None])[rows, order]
        blocks = np.concatenate([v[:, k - 1 : k - 1 + k * d].reshape(m, k, d), v[:, k - 1 + k * d :].reshape(m, k, d)], 2)
        return z, blocks[rows, order]

    def _laplace_log_q(self, lap: "Laplace", z: np.ndarray, blocks: np.ndarray, match: np.ndarray | None) -> np.ndarray:
        """log density of the Laplace law (``_laplace_draws``) at particles (z [M, K], blocks [M, K, 2d]):
        with ``match`` [M, K] (each particle's block on each fit component, ``_match_blocks``), the
        sum over label orders keeps the orders near that match (``Laplace.near``), over K!; without,
        the draws were left in the fit's order (beyond ``CONFIG_MAX_PERMUTED``, ``first_draws``). [M]."""
        m, k = z.shape
        d = self.n_columns
        dp = len(lap.mode)
        nu = self.LAPLACE_DOF
        permuted = match is not None
        if not permuted:
            match = np.broadcast_to(np.arange(k), (m, k))
        const = (math.lgamma(0.5 * (nu + dp)) - math.lgamma(0.5 * nu) - 0.5 * dp * math.log(nu * math.pi)
                 + float(np.log(np.diag(lap.chol)).sum()))
        terms = []
        for sigma in lap.near:
            order = match[:, sigma]  # [M, K]: the particle's block put on each fit component
            rows = np.arange(m)[:, None]
            bo = blocks[rows, order]
            u = (_v_of(z[rows, order], bo[:, :, :d], bo[:, :, d:]) - lap.mode[None]) @ lap.chol
            terms.append(const - 0.5 * (nu + dp) * np.log1p((u * u).sum(1) / nu))
        log_v = _logsumexp(np.stack(terms, 1), 1)
        if permuted:
            log_v = log_v - math.lgamma(k + 1)
        log_s = _logsumexp(z, 1)
        return log_v + k * log_s - np.exp(log_s) - math.lgamma(k)

    #: the largest |log variance| ``propose_configuration`` moves to or from (e^300: the prior's
    #: density there, exp(-s - e^-s), is 0 in floating point below -300 and below any fit above 300)
    CONFIG_MAX_LOG_VAR = 300.0

    def _sane(self, blocks: np.ndarray, d: int) -> np.ndarray:
        """Whether each particle's blocks [M, K, 2d] are finite with |log variance| within
        ``CONFIG_MAX_LOG_VAR``: [M]."""
        return np.isfinite(blocks).all((1, 2)) & (np.abs(blocks[:, :, d:]) <= self.CONFIG_MAX_LOG_VAR).all((1, 2))

    def assignment_rows(self, history: torch.Tensor, chunk: torch.Tensor, n_prev: int, generator: torch.Generator,
                        rows: int = 10_000) -> "JumpCandidates":
        """The rows behind the weights' proposal (``_weight_counts``, for ``propose_jump`` and
        ``propose_configuration``): up to ``rows`` of the history (the reservoir, standing for
        ``n_prev`` rows) and the chunk, as ``JumpCandidates`` without clusters."""
        d = self.n_columns
        r_hist = history.shape[0]
        pick = torch.randperm(r_hist, generator=generator)[:rows] if r_hist > rows else torch.arange(r_hist)
        none = np.zeros(0)
        return JumpCandidates(np.zeros((0, d)), np.zeros((0, d)), none, none, none,
                              np.concatenate([history[pick, :d].numpy(), chunk[:, :d].numpy()]), len(pick), n_prev)

    # --- mode-jumping Metropolis-Hastings moves (service/sgais/engine.py, ``Sampler._jump``) --------
    def jump_candidates(self, history: torch.Tensor, chunk: torch.Tensor, n_prev: int, generator: torch.Generator,
                        restarts: int = 2, iterations: int = 10, refine: int = 0, fit_rows: int = 1_000, extra: int = 1,
                        assign_rows: int = 1_000) -> "JumpCandidates":
        """Clusters a component could be moved onto: the components of ``restarts`` EM fits (with K,
        K + ``extra``, K + 2 ``extra``, ... components; k-means++ starts, ``iterations`` steps on ``fit_rows`` rows of ``history [R, 2d]`` (the reservoir,
        featurized) with the ``chunk [B, 2d]``, then ``refine`` steps on all of them, on the data
        standardised per column), with how many rows of the history (scaled to ``n_prev``) and of the
        chunk each one explains. ``refine`` makes a candidate about as precise as the posterior, but
        costs a pass over the reservoir per step and did not lower the bench's errors (0 by default:
        the sample's fit, as precise as its rows allow, which the proposal's spread allows for). A function of the data and
        of the generator only, never of the particles: the proposal built from it is a fixed
        distribution for the MH acceptance of ``propose_jump``."""
        d = self.n_columns
        r_hist = history.shape[0]
        pick = torch.randperm(r_hist, generator=generator)[:fit_rows] if r_hist > fit_rows else torch.arange(r_hist)
        y_chunk = chunk[:, :d].numpy()
        # standardised by the centre and spread of all rows, history and chunk; the history's columns
        # are copied out as contiguous rows first: summed along them, 14x faster than down the
        # strided columns of the featurized history (4 of 12 ms a call at 100,000 rows before)
        h, total = np.ascontiguousarray(history[:, :d].numpy().T), r_hist + len(y_chunk)  # [d, R]
        centre = (h.sum(1) + y_chunk.sum(0)) / total
        spread = np.sqrt((np.square(h - centre[:, None]).sum(1) + np.square(y_chunk - centre).sum(0)) / total)
        del h
        spread = np.where(spread > 0, spread, 1.0)
        sample = (np.concatenate([history[pick, :d].numpy(), y_chunk]) - centre) / spread
        if refine:
            ys = (np.concatenate([history[:, :d].numpy(), y_chunk]) - centre) / spread
        seeds = torch.randint(0, 2**31 - 1, (restarts,), generator=generator).tolist()
        means, variances, hist, chk, rows = [], [], [], [], []
        n_fit = len(pick)
        for i, seed in enumerate(seeds):
            # K, K + 1, ... components: a fit with more components than the model's resolves
            # overlapping clusters that a K-component fit (like stuck particles) merges
            k = min(self.components + extra * i, len(sample))
            w, mu, var, resp = _em_matrix(sample, _kmeanspp(sample, k, np.random.default_rng(seed)), iterations,
                                          responsibilities=not refine)
            if refine:
                w, mu, var, resp = _em_matrix(ys, mu, refine, start=(w, mu, var), responsibilities=True)
                fit_hist = r_hist
            else:
                fit_hist = n_fit
            means.append(centre + spread * mu)
            variances.append(var * spread**2)
            hist.append(resp[:fit_hist].sum(0) * (n_prev / fit_hist if fit_hist else 0.0))
            chk.append(resp[fit_hist:].sum(0))
            rows.append(resp.sum(0))
        return replace(self.assignment_rows(history, chunk, n_prev, generator, rows=assign_rows),
                       means=np.concatenate(means), variances=np.concatenate(variances), hist=np.concatenate(hist),
                       chunk=np.concatenate(chk), sample=np.concatenate(rows))

    #: the share of ``propose_jump``'s proposal that draws the moved component from its prior: it keeps
    #: the reverse proposal density of any current component at least this share of its prior density
    JUMP_PRIOR_SHARE = 0.1

    def _component_log_prior(self, z, mu: np.ndarray, s: np.ndarray) -> np.ndarray:
        """The prior's factor for one component's (mu [M, d], s [M, d]) and, unless None, z [M], as in
        ``log_prior``: [M]."""
        lp_mu = -0.5 * (LOG_2PI + math.log(4.0) + s) - mu * mu * np.exp(-s) / 8.0
        out = (-s - np.exp(-s) + lp_mu).sum(-1)
        return out if z is None else out + z - np.exp(z)

    def propose_jump(self, theta: torch.Tensor, cands: "JumpCandidates", lam: float, n_prev: int, b: int,
                     generator: torch.Generator, size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """One proposal per particle, in two parts.

        1. ``size`` distinct components (uniformly chosen) get new (mu_j, s_j), each drawn
           independently of its current values from q_rest = share x the prior + (1 - share) x a
           mixture over the candidate clusters (a Gaussian around each cluster's mean and log
           variance), the candidates favoured where the other components' densities (unweighted) are
           low at their centres. q_rest depends on the other components' (mu, s) and the candidates
           only, which the move leaves unchanged, and the components are chosen uniformly: q_rest is
           also the reverse proposal.
        2. All weights are redrawn: z = log(w S) with w ~ Dirichlet(1 + c) and S ~ Gamma(K, 1) (the
           prior's law of the total), c the counts of the assignment rows (``cands.assign``; the
           history's scaled to its share of the current tempered target, the chunk's by lambda) each
           nearest (by unweighted density) to a component of the *proposed* means and variances,
           shrunk to the rows behind them. The reverse draw uses the counts under the *current*
           means and variances. So the weights follow the clusters the components now cover: with
           ``size`` 2 one move can split two clusters that share a component while it takes a
           duplicate away from another cluster, whose remaining component gets that cluster's weight.

        Returns the proposed particles and the MH log ratio of the proposal, log q(old | new) -
        log q(new | old), both parts: ([M, D], [M])."""
        k, d = self.components, self.n_columns
        size = min(size, k)
        t = theta.numpy()
        m = t.shape[0]
        z, mu, s = t[:, :k], t[:, k : k + k * d].reshape(m, k, d), t[:, k + k * d :].reshape(m, k, d)
        picks = torch.argsort(torch.rand((m, k), generator=generator, dtype=torch.float64), dim=1)[:, :size].numpy()
        u = torch.rand((m, size, 2), generator=generator, dtype=torch.float64).numpy()
        eps = torch.randn((m, size, 2 * d), generator=generator, dtype=torch.float64).numpy()
        prior_draw = self.sample_prior(generator, m * size).numpy()  # drawn always: a fixed number of draws per move

        rows = np.arange(m)
        rest = np.ones((m, k), dtype=bool)
        for i in range(size):
            rest[rows, picks[:, i]] = False
        total = n_prev + lam * b
        n_c = cands.hist + lam * cands.chunk + 1e-9  # [C]
        prec_n = 1.0 / (cands.sample + 1.0) + 1.0 / (n_c + 1.0)  # a fit's error plus the posterior's spread
        mu_var = cands.variances * prec_n[:, None]  # [C, d]
        s_mean, s_var = np.log(cands.variances), 2.0 * prec_n  # [C, d], [C]
        n_cand = len(n_c)
        if size < k:
            pi_c = np.clip(n_c / max(total, 1e-9), 1e-9, 1.0)
            own = -0.5 * (d * LOG_2PI + np.log(cands.variances).sum(1))  # log N(m_c; m_c, v_c), [C]
            diff = cands.means[None, :, None, :] - mu[:, None]  # [M, C, K, d]
            dens = -0.5 * (d * LOG_2PI + s.sum(-1)[:, None] + (diff * diff * np.exp(-s)[:, None]).sum(-1))  # [M, C, K]
            explained = _logsumexp(np.where(rest[:, None], dens, -np.inf), 2) - math.log(k - size)  # [M, C]
            score = np.clip(np.log(pi_c)[None] + own[None] - explained, -50.0, 50.0)
            soft = np.exp(score - score.max(1, keepdims=True))
            p_c = 0.5 * soft / soft.sum(1, keepdims=True) + 0.5 / n_cand  # [M, C]
        else:
            p_c = np.full((m, n_cand), 1.0 / n_cand)
        cdf = np.cumsum(p_c, 1)
        share = self.JUMP_PRIOR_SHARE

        def log_q_block(bmu: np.ndarray, bs: np.ndarray) -> np.ndarray:
            lmu = -0.5 * (LOG_2PI + np.log(mu_var)[None] + (bmu[:, None] - cands.means[None]) ** 2 / mu_var[None]).sum(-1)
            ls = -0.5 * (LOG_2PI + np.log(s_var)[None, :, None] + (bs[:, None] - s_mean[None]) ** 2 / s_var[None, :, None]).sum(-1)
            mix = _logsumexp(np.log(p_c) + lmu + ls, 1)
            return np.logaddexp(math.log(share) + self._component_log_prior(None, bmu, bs), math.log1p(-share) + mix)

        out = t.copy()
        log_ratio = np.zeros(m)
        pmu = prior_draw[:, k : k + k * d].reshape(m, size, k, d)[:, :, 0]
        ps = prior_draw[:, k + k * d :].reshape(m, size, k, d)[:, :, 0]
        for i in range(size):
            j = picks[:, i]
            c = np.minimum((cdf < u[:, i, :1]).sum(1), n_cand - 1)
            e = eps[:, i]
            new_mu = cands.means[c] + np.sqrt(mu_var[c]) * e[:, :d]
            new_s = s_mean[c] + np.sqrt(s_var[c])[:, None] * e[:, d:]
            from_prior = u[:, i, 1] < share
            new_mu = np.where(from_prior[:, None], pmu[:, i], new_mu)
            new_s = np.where(from_prior[:, None], ps[:, i], new_s)
            log_ratio += log_q_block(mu[rows, j], s[rows, j]) - log_q_block(new_mu, new_s)
            cols = j[:, None] * d + np.arange(d)[None]  # the block's mean and log-variance columns, [M, d]
            out[rows[:, None], k + cols] = new_mu
            out[rows[:, None], k + k * d + cols] = new_s

        # 2. the weights
        alpha_old = self._weight_counts(mu, s, cands, lam, b)
        new_mu_all = out[:, k : k + k * d].reshape(m, k, d)
        new_s_all = out[:, k + k * d :].reshape(m, k, d)
        alpha_new = self._weight_counts(new_mu_all, new_s_all, cands, lam, b)
        new_z, log_q_w = _propose_weights(generator, z, alpha_old, alpha_new)
        out[:, :k] = new_z
        log_ratio += log_q_w
        return torch.from_numpy(out), torch.from_numpy(log_ratio)

    def _weight_counts(self, mu: np.ndarray, s: np.ndarray, cands: "JumpCandidates", lam: float, b: int) -> np.ndarray:
        """``_particle_counts`` once per distinct particle (resampled particles are copies) and once per
        ``cands``: an MH move's later steps meet its current particles again, as they were proposed or
        kept (``cands.memo``; the same numbers, computed once)."""
        m = mu.shape[0]
        keys = [(lam, b, mu[i].tobytes(), s[i].tobytes()) for i in range(m)]
        memo, todo = cands.memo, {}
        for i, key in enumerate(keys):
            if key not in memo and key not in todo:
                todo[key] = i
        if todo:
            idx = np.fromiter(todo.values(), dtype=np.int64, count=len(todo))
            for key, row in zip(todo, self._particle_counts(mu[idx], s[idx], cands, lam, b)):
                memo[key] = row
        return np.stack([memo[key] for key in keys])

    def _particle_counts(self, mu: np.ndarray, s: np.ndarray, cands: "JumpCandidates", lam: float, b: int,
                         start: np.ndarray | None = None, sweeps: int | None = None) -> np.ndarray:
        """1 + the counts behind the weights' proposal, [M, K]: the assignment rows' responsibilities under
        (mu [M, K, d], s [M, K, d]) with the weights that ``WEIGHT_SWEEPS`` EM steps on the weights alone
        (fewer once they settle: ``WEIGHT_TOL``) give them from equal ones (a function of the means and
        variances only, as the moves' reverse densities need), or ``sweeps`` from ``start`` [M, K]
        (``first_draws``); history rows count n_prev /
        assign_hist each, chunk rows lambda; the total is then shrunk to the rows behind it (the
        proposal is as wide as the sample allows, not as narrow as the posterior)."""
        y = cands.assign  # [R, d]
        h = cands.assign_hist
        wts = np.concatenate([np.full(h, cands.n_prev / h if h else 0.0), np.full(len(y) - h, lam)])
        m, k = mu.shape[:2]
        w = np.full((m, k), 1.0 / k) if start is None else start / start.sum(1, keepdims=True)
        sweeps = WEIGHT_SWEEPS if sweeps is None else sweeps
        native = kernels()
        if native is not None:
            counts = native.weight_em(y, wts, mu, s, w, sweeps, WEIGHT_TOL)[0]
        else:
            counts = _weight_em(np.exp(_component_log_densities(y, mu, s)), wts, w, sweeps)
        total = counts.sum(1, keepdims=True)
        rows_behind = h + lam * (len(y) - h)
        return 1.0 + counts * (rows_behind / np.maximum(total, 1e-12))


@dataclass(frozen=True)
class ModeFit:
    """``GaussianMixture.mode_fit``'s answer: the gap (nats of the log joint the best particle sits
    below the fit), the fit as a parameter vector [1, D] (None without rows), the rows it was
    refined on, and ``prior_loss``: the nats of log-likelihood (scaled to n) the best particle sits
    below the fit that its prior pays for, min(likelihood gap, prior gain), 0 when neither is
    positive. Large where the prior keeps the posterior from the data (the paper's prior is in data
    units: means N(0, 4 sigma^2), so clusters far from 0 against their spread end in one widened
    component, ``engine.WARNINGS['prior_conflict']``); small for posterior draws (about D/2), and
    usually for particles stuck in a poor mode (their likelihood gap is large, but what their prior
    gains over the fit's, an empty component at a draw from it, a merged one's wider variance, is
    tens of nats a component: with data far from 0 it could pass the limit beside ``stuck_mode``;
    not measured); 0 where the fit put a component on one repeated value (``EM_VAR_FLOOR``)."""

    gap: float
    theta: torch.Tensor | None
    rows: int
    prior_loss: float = 0.0


# --- the Laplace law of ``first_draws`` (issue 20) -----------------------------------------------
# The posterior in v = (eta [K-1], mu [K, d], s [K, d]) with eta_k = log w_k - log w_K: the total S
# of g_k = e^z_k (Gamma(K, 1) under the prior) is independent of v and of the data, and (v, log S)
# -> z has Jacobian 1, so a law on v times S's Gamma is a law on theta.

#: rows per block of ``_laplace_pass`` (its arrays are [block, K, d] and [block, D'])
LAPLACE_BLOCK = 4_096


def _laplace_pass(y: np.ndarray, weight: float, w: np.ndarray, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
    """The negative Hessian [D', D'] (D' = K - 1 + 2Kd) of the mixture's log posterior in v at (w [K],
    mu [K, d], var [K, d]), from rows ``y [n, d]`` each standing for ``weight`` rows: the observed
    information of the likelihood by Louis's identity, sum_i s_i s_i' - sum_i sum_k r_ik (a_ik a_ik' +
    H_ik) (s_i: row i's score; a_ik, H_ik: the score and Hessian of log w_k N(y_i; mu_k, var_k)), plus
    the prior's (Dirichlet(1) on the weights, as sum log w in eta; InvGamma(1, 1) on e^s and N(0, 4 e^s)
    on mu, per coordinate). Checked against autograd to 1e-12 (tests/test_jumps.py)."""
    n, d = y.shape
    k = len(w)
    dp = k - 1 + 2 * k * d
    log_w, log_var = np.log(w), np.log(var)
    opg = np.zeros((dp, dp))
    big_n = np.zeros(k)
    rb = np.zeros((k, 2 * d))
    rbb = np.zeros((k, 2 * d, 2 * d))
    native = kernels()
    for lo in range(0, n, LAPLACE_BLOCK):
        yb = y[lo : lo + LAPLACE_BLOCK]
        if native is not None:
            sc = native.laplace_rows(yb, w, mu, var, big_n, rb, rbb)
            opg += sc.T @ sc
            continue
        dv = yb[:, None, :] - mu[None]  # [B, K, d]
        ld = log_w[None] - 0.5 * (log_var[None] + dv * dv / var[None]).sum(-1)  # [B, K], up to a constant
        r = np.exp(ld - ld.max(1, keepdims=True))
        r /= r.sum(1, keepdims=True)
        dev = dv / var[None]
        b = np.concatenate([dev, 0.5 * (dev * dv - 1.0)], 2)  # [B, K, 2d]: a_ik's (mu_k, s_k) entries
        rbk = r[:, :, None] * b
        sc = np.concatenate([r[:, : k - 1] - w[None, : k - 1], rbk[:, :, :d].reshape(len(yb), -1),
                             rbk[:, :, d:].reshape(len(yb), -1)], 1)  # [B, D']: the rows' scores
        opg += sc.T @ sc
        big_n += r.sum(0)
        rb += rbk.sum(0)
        for c in range(k):
            rbb[c] += rbk[:, c].T @ b[:, c]
    e = np.exp(-log_var)
    # (mu_k, s_k)'s positions in v, [K, 2d]
    idx = np.concatenate([k - 1 + np.arange(k * d).reshape(k, d), k - 1 + k * d + np.arange(k * d).reshape(k, d)], 1)
    e_k = np.eye(k)[:, : k - 1] - w[None, : k - 1]  # [K, K-1]: eta's entries of a_ik
    miss = np.zeros((dp, dp))  # sum_i sum_k r_ik a_ik a_ik'
    miss[: k - 1, : k - 1] = (big_n[:, None, None] * e_k[:, :, None] * e_k[:, None, :]).sum(0)
    cross = (e_k.T[:, :, None] * rb[None]).reshape(k - 1, 2 * k * d)  # [K-1, K * 2d], in idx's order
    miss[: k - 1, idx.ravel()] = cross
    miss[idx.ravel(), : k - 1] = cross.T
    miss[idx[:, :, None], idx[:, None, :]] = rbb
    hess = np.zeros((dp, dp))  # sum_i sum_k r_ik H_ik
    wk = w[: k - 1]
    hess[: k - 1, : k - 1] = -(np.diag(wk) - np.outer(wk, wk)) * big_n.sum()
    im, is_ = idx[:, :d], idx[:, d:]
    hess[im, im] = -big_n[:, None] / var
    hess[im, is_] = hess[is_, im] = -rb[:, :d]  # -sum r (y - mu) / var
    hess[is_, is_] = -(rb[:, d:] + 0.5 * big_n[:, None])  # -sum r (y - mu)^2 / (2 var)
    info = weight * (opg - miss - hess)
    info[: k - 1, : k - 1] += k * (np.diag(wk) - np.outer(wk, wk))
    info[im, im] += e / 4.0
    info[im, is_] -= mu * e / 4.0
    info[is_, im] -= mu * e / 4.0
    info[is_, is_] += e + mu * mu * e / 8.0
    return info


def _laplace_gradient(y: np.ndarray, feats: np.ndarray, weight: float, w: np.ndarray, mu: np.ndarray,
                      var: np.ndarray) -> np.ndarray:
    """The gradient [D'] of ``_laplace_pass``'s log posterior in v, from one E step's sums on every
    row (``_em_stats``, the native kernel where built)."""
    k, d = mu.shape
    st = _em_stats(y, feats, w, mu, var) * weight
    big_n, s1, s2 = st[:, 0], st[:, 1 : 1 + d], st[:, 1 + d :]
    e = 1.0 / var
    g_eta = big_n[: k - 1] - weight * len(y) * w[: k - 1] + 1.0 - k * w[: k - 1]
    g_mu = (s1 - big_n[:, None] * mu) * e - mu * e / 4.0
    g_s = 0.5 * ((s2 - 2.0 * mu * s1 + mu * mu * big_n[:, None]) * e - big_n[:, None]) - 1.5 + e + mu * mu * e / 8.0
    return np.concatenate([g_eta, g_mu.ravel(), g_s.ravel()])


def _match_blocks(dist: np.ndarray) -> np.ndarray:
    """Which of each particle's blocks sits on each fit component, from their squared distances in
    the fit's scale ``dist [M, blocks, fit]``: greedily, the nearest pair first: [M, K]."""
    m, k = dist.shape[:2]
    cost = np.where(np.isfinite(dist), dist, np.inf)
    match = np.broadcast_to(np.arange(k), (m, k)).copy()
    rows = np.arange(m)
    for _ in range(k):
        flat = cost.reshape(m, -1).argmin(1)
        b, c = flat // k, flat % k
        match[rows, c] = b
        cost[rows, b, :] = np.inf
        cost[rows, :, c] = np.inf
    return match


def _cholesky(a: np.ndarray) -> np.ndarray | None:
    """The lower Cholesky factor of ``a``, None where it is not positive definite."""
    try:
        return np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        return None


def _v_unpack(v: np.ndarray, k: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    eta = np.append(v[: k - 1], 0.0)
    return np.exp(eta - _logsumexp(eta, 0)), v[k - 1 : k - 1 + k * d].reshape(k, d), np.exp(v[k - 1 + k * d :]).reshape(k, d)


def _v_of(z: np.ndarray, mu: np.ndarray, s: np.ndarray) -> np.ndarray:
    """v of particles given as z [M, K], mu [M, K, d], s [M, K, d]: [M, D']."""
    m, k = z.shape
    return np.concatenate([z[:, : k - 1] - z[:, k - 1 :], mu.reshape(m, -1), s.reshape(m, -1)], 1)


def _relabelled_distance2(v: np.ndarray, chol: np.ndarray, perms: np.ndarray, d: int) -> np.ndarray:
    """Squared Mahalanobis distances (negative Hessian chol chol') from the mode ``v`` [D'] to its
    relabellings by ``perms`` [P, K]: [P]."""
    k = perms.shape[1]
    w, mu, var = _v_unpack(v, k, d)
    moved = _v_of(np.log(w)[perms], mu[perms], np.log(var)[perms]) - v[None]
    return ((moved @ chol) ** 2).sum(1)


@dataclass(frozen=True)
class Laplace:
    """The Laplace law of ``GaussianMixture.first_draws``: the posterior's mode in v [D'], the
    Cholesky factor of the negative Hessian there (P = chol chol'), and the label orders that map
    the mode near itself (``LAPLACE_NEAR``) [P, K]."""

    mode: np.ndarray
    chol: np.ndarray
    near: np.ndarray


_PERMUTATIONS: dict[int, np.ndarray] = {}


def _permutations(k: int) -> np.ndarray:
    """All orders of k labels, [k!, k] (cached)."""
    if k not in _PERMUTATIONS:
        _PERMUTATIONS[k] = np.array(list(itertools.permutations(range(k))), dtype=np.int64).reshape(-1, k)
    return _PERMUTATIONS[k]


@dataclass(frozen=True)
class JumpCandidates:
    """Clusters for ``GaussianMixture.propose_jump``: means [C, d], variances [C, d], the history rows
    (scaled to the history's size), chunk rows and sample rows each explains (responsibilities) [C];
    and a sample of rows for the weights' proposal."""

    means: np.ndarray
    variances: np.ndarray
    hist: np.ndarray
    chunk: np.ndarray
    sample: np.ndarray
    #: rows [R, d] (``assign_hist`` of the history, then the chunk) whose hard assignments set the
    #: proposal of the weights, and n_prev, the history's size they stand for
    assign: np.ndarray = None
    assign_hist: int = 0
    n_prev: int = 0
    #: ``GaussianMixture._weight_counts`` of the particles seen with these rows, by their means,
    #: variances, lambda and chunk size: a move's later steps meet the same particles again
    memo: dict = field(default_factory=dict, compare=False, repr=False)


#: EM steps on the weights alone behind the weights' proposal of ``GaussianMixture.propose_jump``.
#: Why 20, not 3 as before 2026-11-27: the reverse move's Dirichlet is set by the counts under the
#: particle's own means and variances, as concentrated as the rows behind them (about 10,000), so a
#: particle whose weights sit a few percent from counts that 3 sweeps from equal weights left
#: unconverged had no reverse density, and every move away from it was rejected: a particle
#: stuck with a merged pair of clusters could not leave (the paper's 3 -> 5 -> 7 clusters, K = 7:
#: 12 of 20 runs beyond 0.2 % of the reference with 3 sweeps, 4 of 20 with 20)
WEIGHT_SWEEPS = 20
#: and fewer where a particle's weights move less than this in a sweep (their fixed point, to rounding
#: in the counts; 2026-11-27: on the paper's 3 -> 5 -> 7 clusters, K = 3, half the particles settle within
#: 5 sweeps, 90 % within 16: the sweeps were a third of the mixture's default time there)
WEIGHT_TOL = 1e-10


def _component_log_densities(y: np.ndarray, mu: np.ndarray, s: np.ndarray) -> np.ndarray:
    """log N(y_r; mu_k, e^s_k) up to a constant, minus its largest over k, per particle: ``[M, K, R]``
    for rows ``y [R, d]`` and particles' ``mu``, ``s [M, K, d]`` (one product on (y, y^2))."""
    prec = np.exp(-s)  # [M, K, d]
    coef = np.concatenate([mu * prec, -0.5 * prec], axis=2)  # [M, K, 2d]
    const = -0.5 * (s.sum(-1) + (mu * mu * prec).sum(-1))  # [M, K]
    dens = coef @ np.concatenate([y, y * y], axis=1).T + const[:, :, None]  # [M, K, R]
    dens -= dens.max(1, keepdims=True)
    return dens


def _weight_em(lik: np.ndarray, wts: np.ndarray, w: np.ndarray, sweeps: int) -> np.ndarray:
    """The weights' EM of ``_particle_counts`` without the native kernel (and its reference in
    tests/test_native.py): from the normalised weights ``w [M, K]``, on the rows' likelihoods ``lik
    [M, K, R]`` (each row's largest 1) with the rows' weights ``wts [R]``; the last sweep's counts [M, K]."""
    m, k = w.shape
    w = w[:, None, :].copy()
    counts = np.zeros((m, k))
    live, lik_live = np.arange(m), lik  # the particles whose weights still move, and their lik
    for _ in range(sweeps):  # EM on the weights alone, the means and variances held
        # counts_k = w_k sum_r wts_r lik_kr / sum_j w_j lik_jr: two batched products over lik
        # per sweep, no [M, K, R] responsibilities written (4x faster than forming them)
        w_live = w[live]
        den = w_live @ lik_live  # [L, 1, R], >= 1e-12 (each row's largest lik is 1)
        c = w_live[:, 0, :] * (lik_live @ (wts / den[:, 0, :])[:, :, None])[:, :, 0]  # [L, K]
        w_next = (c / np.maximum(c.sum(1, keepdims=True), 1e-300))[:, None, :] + 1e-12
        counts[live], w[live] = c, w_next
        # a particle whose weights have settled stops (its own test: its counts depend on its
        # means and variances alone, as the moves' reverse densities need)
        moving = np.abs(w_next - w_live).max((1, 2)) > WEIGHT_TOL
        if not moving.all():
            live = live[moving]
            if len(live) == 0:
                break
            lik_live = lik[live]
    return counts


def _propose_weights(generator: torch.Generator, z: np.ndarray, alpha_old: np.ndarray,
                     alpha_new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """New weights z' = log(w S) for particles at z [M, K]: w ~ Dirichlet(alpha_new [M, K]) (the counts
    behind the proposed components), S ~ Gamma(K, 1); the reverse density uses alpha_old (the counts
    behind the current components). Returns z' and log q(z | alpha_old) - log q(z' | alpha_new):
    ([M, K], [M])."""
    new_z = _draw_weights(generator, alpha_new)
    return new_z, _log_q_weights(z, alpha_old) - _log_q_weights(new_z, alpha_new)


def _draw_weights(generator: torch.Generator, alpha: np.ndarray) -> np.ndarray:
    """z = log(w S) with w ~ Dirichlet(alpha [M, K]) and S ~ Gamma(K, 1): [M, K] (density ``_log_q_weights``)."""
    k = alpha.shape[1]
    w_draw = standard_gamma_rows(generator, alpha)  # [M, K] Gamma(alpha) draws
    tot = standard_gamma(generator, float(k), (alpha.shape[0],)).numpy()  # S ~ Gamma(K, 1)
    w = w_draw / w_draw.sum(1, keepdims=True)
    return np.log(np.maximum(w, 1e-300)) + np.log(tot)[:, None]


def standard_gamma_rows(generator: torch.Generator, alpha: np.ndarray) -> np.ndarray:
    """Gamma(alpha, 1) draws, one per entry of ``alpha`` (each its own shape, all >= 1), by
    Marsaglia-Tsang as ``models._random.standard_gamma``, from the generator: rejected entries are
    drawn again, all of them in one call per round."""
    a = np.asarray(alpha, dtype=np.float64).ravel()
    if not np.all(a >= 1.0):  # NaN too: its draws would be rejected for ever
        raise ValueError("gamma shapes must be finite and >= 1 here")
    d = a - 1.0 / 3.0
    c = 1.0 / np.sqrt(9.0 * d)
    out = np.empty_like(a)
    todo = np.arange(len(a))
    while len(todo):
        x = torch.randn(len(todo), generator=generator, dtype=torch.float64).numpy()
        u = torch.rand(len(todo), generator=generator, dtype=torch.float64).numpy()
        v = (1.0 + c[todo] * x) ** 3
        with np.errstate(invalid="ignore", divide="ignore"):
            ok = (v > 0) & (np.log(u) < 0.5 * x * x + d[todo] - d[todo] * v + d[todo] * np.log(np.maximum(v, 1e-300)))
        out[todo[ok]] = (d[todo] * v)[ok]
        todo = todo[~ok]
    return out.reshape(np.shape(alpha))


def _log_q_weights(z: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Log density, in z [M, K], of z = log(w S) with w ~ Dirichlet(alpha [M, K]) and S ~ Gamma(K, 1)
    independent: g = e^z has density Dir(g / S) Gamma(S) S^-(K-1) (the change of variables from
    (w_1..w_{K-1}, S) to g), times prod g for the log. [M]."""
    k = z.shape[1]
    top = z.max(1, keepdims=True)
    log_s = top[:, 0] + np.log(np.exp(z - top).sum(1))
    log_w = z - log_s[:, None]
    lgam = np.vectorize(math.lgamma)
    log_dir = lgam(alpha.sum(1)) - lgam(alpha).sum(1) + ((alpha - 1.0) * log_w).sum(1)
    log_gamma_s = (k - 1) * log_s - np.exp(log_s) - math.lgamma(k)
    return log_dir + log_gamma_s - (k - 1) * log_s + z.sum(1)


def _logsumexp(a: np.ndarray, axis: int) -> np.ndarray:
    top = np.max(a, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(top, axis) + np.log(np.sum(np.exp(a - top), axis=axis))


#: the variances' floor of the EM fits (standardised units: ``_em_matrix``)
EM_VAR_FLOOR = 1e-6


def _em_matrix(y: np.ndarray, means: np.ndarray, iterations: int, start=None, responsibilities: bool = False):
    """``_em`` in matrix form (one product per step, not an [n, K, d] broadcast), on rows ``y [n, d]``
    that should be standardised, from ``means [K, d]`` (hard assignment to the nearest) or from
    ``start`` = (weights, means, variances): (weights [K], means [K, d], variances [K, d], and the
    responsibilities [n, K] when ``responsibilities``, else None). Each step's E step and sums are
    one ``_em_stats``."""
    n, d = y.shape
    k = means.shape[0]
    floor = EM_VAR_FLOOR
    feats = np.concatenate([np.ones((n, 1)), y, y * y], axis=1)  # [n, 1 + 2d]

    def m_step(st: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        nk = st[:, 0] + 1e-9
        mu = np.where(st[:, :1] > 0, st[:, 1 : 1 + d] / nk[:, None], means)
        var = np.maximum(st[:, 1 + d :] / nk[:, None] - mu * mu, floor)
        return nk / nk.sum(), mu, np.where(st[:, :1] > 1.0, var, 1.0)  # a component with (almost) no rows: unit variance

    if start is None:
        nearest = np.stack([((y - means[j]) ** 2).sum(-1) for j in range(k)]).argmin(0)
        w, mu, var = m_step((nearest[None] == np.arange(k)[:, None]).astype(np.float64) @ feats)  # hard assignments' sums
    else:
        w, mu, var = start
    native = kernels()
    if native is not None and iterations > 0:  # the steps in one call (each an ``_em_stats`` and an M step)
        w, mu, var = native.em_run(y, w, mu, var, means, iterations, floor)
    else:
        for _ in range(iterations):
            w, mu, var = m_step(_em_stats(y, feats, w, mu, var))
    return w, mu, var, (_responsibilities(feats, w, mu, var).T if responsibilities else None)


def _em_stats(y: np.ndarray, feats: np.ndarray, w: np.ndarray, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
    """An E step and its sums, [K, 1 + 2d] = sum over the rows of the responsibilities times (1, y,
    y^2) (``feats``: the rows ``y [n, d]`` so featurized); the native kernel forms no [K, n] array."""
    native = kernels()
    if native is not None:
        return native.em_stats(y, w, mu, var)
    return _responsibilities(feats, w, mu, var) @ feats


def _responsibilities(feats: np.ndarray, w: np.ndarray, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
    """The E step of a diagonal Gaussian mixture on rows featurized as (1, y, y^2) ``feats [n, 1 + 2d]``:
    responsibilities [K, n] (one product, the components along rows)."""
    prec = 1.0 / var
    coef = np.concatenate([
        (np.log(w) - 0.5 * (np.log(var).sum(1) + (mu * mu * prec).sum(1)))[:, None], mu * prec, -0.5 * prec,
    ], axis=1)  # [K, 1 + 2d]
    lj = coef @ feats.T  # [K, n]
    lj -= lj.max(0)
    resp = np.exp(lj)
    resp /= resp.sum(0)
    return resp


def _map_em(y: np.ndarray, w: np.ndarray, mu: np.ndarray, var: np.ndarray, iterations: int, weight: float = 1.0):
    """EM for the mode of ``GaussianMixture``'s posterior in its parameters (theta: log weights
    up to a constant, means, log variances), on rows ``y [n, d]`` in their own units, from (w [K],
    mu [K, d], var [K, d]): each M step is the mode of the Normal-Inverse-Gamma posterior of a
    component's means and variances (means N(0, 4 sigma^2), so kappa0 = 1/4; variances
    InvGamma(1, 1)) given its responsibilities, in log variance (sigma^2 = b_n / (a_n + 1/2)), and
    weights (N_k + 1) / (n + K) (Dirichlet(1) with the log-weights' Jacobian). ``weight``: each row
    stands for this many (a sample of the rows). Returns (w, mu, var)."""
    n, d = y.shape
    native = kernels()
    if native is not None and iterations > 0:
        return native.em_run(y, w, mu, var, None, iterations, map_weight=weight)
    feats = np.concatenate([np.ones((n, 1)), y, y * y], axis=1)  # [n, 1 + 2d]
    k = w.shape[0]
    for _ in range(iterations):
        st = _em_stats(y, feats, w, mu, var)  # [K, 1 + 2d]
        if weight != 1.0:
            st *= weight
        nk = st[:, :1]
        kappa = 0.25 + nk
        mu = st[:, 1 : 1 + d] / kappa
        b_n = 1.0 + 0.5 * np.maximum(st[:, 1 + d :] - kappa * mu * mu, 0.0)
        var = b_n / (1.0 + 0.5 * nk + 0.5)
        w = (st[:, 0] + 1.0) / (n * weight + k)
    return w, mu, var


def _kmeanspp(y: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding: ``k`` rows of ``y [n, d]``, each drawn with probability proportional to its
    squared distance from the nearest one drawn before (kept as a running minimum)."""
    centres = [y[rng.integers(len(y))]]
    d2 = None
    for _ in range(1, k):
        diff = y - centres[-1]
        # up to two columns einsum sums as numpy's sum does (one addition); beyond, in another order
        new = np.einsum("ij,ij->i", diff, diff) if y.shape[1] <= 2 else (diff * diff).sum(-1)
        d2 = new if d2 is None else np.minimum(d2, new)
        total = d2.sum()
        if total > 0:  # rng.choice(len(y), p=d2 / total)'s draw, without its checks of p (half the time here)
            cdf = np.cumsum(d2 / total)
            cdf /= cdf[-1]
            centres.append(y[int(cdf.searchsorted(rng.random(), side="right"))])
        else:
            centres.append(y[rng.integers(len(y))])
    return np.array(centres)


def _em(y: np.ndarray, means: np.ndarray, iterations: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Diagonal-Gaussian mixture EM from ``means [K, d]`` (a hard assignment sets the first weights
    and variances): (weights [K], means [K, d], variances [K, d])."""
    n, d = y.shape
    k = means.shape[0]
    floor = 1e-8 * y.var(0).max() + 1e-300
    nearest = ((y[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    w = np.array([max((nearest == j).sum(), 1) for j in range(k)], dtype=np.float64)
    var = np.array([y[nearest == j].var(0) if (nearest == j).sum() > 1 else y.var(0) for j in range(k)])
    w, mu, var = w / w.sum(), means.astype(np.float64).copy(), np.maximum(var, floor)
    for _ in range(iterations):
        lj = np.log(w) - 0.5 * (np.log(2 * np.pi * var).sum(1) + (((y[:, None, :] - mu[None]) ** 2) / var[None]).sum(-1))
        lj -= lj.max(1, keepdims=True)
        r = np.exp(lj)
        r /= r.sum(1, keepdims=True)
        nk = r.sum(0) + 1e-12
        w = nk / nk.sum()
        mu = (r.T @ y) / nk[:, None]
        var = np.maximum((r.T @ (y * y)) / nk[:, None] - mu**2, floor)
    return w, mu, var


#: the prior of a new regime's mean at a restart of ``gaussian`` with a warm-up, in the old
#: regime's frame: N(the old mean, sigma^2 / RESTART_KAPPA0), sd 10 noise sds, as the metric-series
#: models' level jumps (``coef_scale`` 10). With the first regime's kappa0 (1), a jump of z noise
#: sds put z^2 / 2 into the new regime's noise (b), which took the noise for about 1 + z^2 / n times
#: its value n rows on; a second restart at the row the first was found, centred where the
#: data then were, beat it by a log Bayes factor of about 10: every change in a stream of several
#: columns that moved far came with an echo at its detection row (a held-out trial: 2 columns, 8
#: false changes in 20 true ones; 3 columns, 12; now none, detection delays within a row).
RESTART_KAPPA0 = 0.01


@dataclass(frozen=True)
class Gaussian(Model):
    """Independent Gaussian per column with unknown mean and variance, Normal-Inverse-Gamma prior:
    sigma_j^2 ~ InverseGamma(alpha0, beta0), mu_j | sigma_j^2 ~ N(mu0, sigma_j^2 / kappa0).

    Conjugate, so ``exact_log_evidence`` is closed form. ``theta [M, 2d]`` = (mu [d], log sigma^2 [d]).

    ``warmup`` 0 (the default): the prior is in the data's units, as in the paper. ``warmup`` W >= 2:
    a frame per column fixed from the first W rows (their mean and standard deviation, as the
    metric-series models do, ``models.timeseries``), the prior on (y - centre) / scale, the W rows
    conditioned on and not scored; exact only. Why: in data units, far from zero against the
    spread, the prior's mean term stays in the noise the posterior expects (its b holds about
    centre^2 / 2 for ever), and changes go unseen (1,000 +- 5 with +20 at 300: never found in 600
    rows; with a frame, 3-5 rows late point by point). ``post``: (mu, kappa, alpha, beta) [4d]; with a
    warm-up (seen, centre [d], scale [d]) before them, and the warm-up rows [W, d] between until
    the frame is fixed (then they are not kept: W x d is at most ``MAX_WARMUP_VALUES``).
    """

    name = "gaussian"
    mu0: float = 0.0
    kappa0: float = 1.0
    alpha0: float = 1.0
    beta0: float = 1.0
    warmup: int = 0

    #: the most warm-up values (``warmup`` x columns) a state holds until its frame is fixed (512 KiB)
    MAX_WARMUP_VALUES: ClassVar[int] = 65_536

    def __post_init__(self) -> None:
        if not math.isfinite(self.mu0):
            raise ModelError("gaussian: mu0 must be finite")
        for key in ("kappa0", "alpha0", "beta0"):
            _positive(f"gaussian: {key}", getattr(self, key))
        _check_frame_warmup(self)
        if self.warmup and self.sampler == "sgais":
            raise ModelError("gaussian: warmup (a frame from the first rows) runs with the exact method only "
                             "(no sampler=sgais); set warmup=0 for SGAIS")

    @property
    def dim(self) -> int:
        return 2 * self.n_columns

    @property
    def feature_width(self) -> int:
        return 2 * self.n_columns

    def parameter_names(self) -> list[str]:
        d = self.n_columns
        return [f"mu[{j}]" for j in range(d)] + [f"log_var[{j}]" for j in range(d)]

    def featurize(self, data: torch.Tensor) -> torch.Tensor:
        self.check_width(data)
        y = data.to(torch.float64)
        if self.warmup:  # a NaN in the warm-up would make a NaN frame: refused by name, as the metric models do
            y = _check_finite(self.name, y)
        return torch.cat([y, y * y], dim=1)

    def sample_prior(self, generator: torch.Generator, n: int) -> torch.Tensor:
        d = self.n_columns
        var = self.beta0 / standard_gamma(generator, self.alpha0, (n, d))
        mu = self.mu0 + torch.sqrt(var / self.kappa0) * torch.randn(n, d, generator=generator, dtype=torch.float64)
        return torch.cat([mu, torch.log(var)], dim=1)

    def log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        d = self.n_columns
        mu, s = theta[:, :d], theta[:, d:]
        a, b, k = self.alpha0, self.beta0, self.kappa0
        lp_s = a * math.log(b) - math.lgamma(a) - a * s - b * torch.exp(-s)
        lp_mu = -0.5 * (LOG_2PI + s - math.log(k)) - 0.5 * k * (mu - self.mu0) ** 2 * torch.exp(-s)
        return (lp_s + lp_mu).sum(-1)

    def grad_log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        d = self.n_columns
        mu, s = theta[:, :d], theta[:, d:]
        e = torch.exp(-s)
        dm = mu - self.mu0
        return torch.cat([-self.kappa0 * dm * e, -self.alpha0 - 0.5 + self.beta0 * e + 0.5 * self.kappa0 * dm * dm * e], dim=1)

    def log_likelihood(self, theta: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        d = self.n_columns
        mu, s = theta[:, :d], theta[:, d:]
        prec = torch.exp(-s)
        coef = torch.cat([mu * prec, -0.5 * prec], dim=1)  # [M, 2d]
        const = -0.5 * (d * LOG_2PI + s.sum(-1) + (mu * mu * prec).sum(-1))  # [M]
        return coef @ rows.T + const[:, None]

    def grad_log_likelihood(self, theta: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.grad_from_stats(theta, self.stats(rows, weights))

    has_stats = True

    def stats(self, rows: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        """(sum w, sum w y [d], sum w y^2 [d]): ``[..., 1 + 2d]``."""
        if weights is None:
            s = rows.sum(-2)
            return torch.cat([torch.full((*s.shape[:-1], 1), float(rows.shape[-2]), dtype=s.dtype), s], dim=-1)
        s = weights @ rows  # [..., 2d]
        return torch.cat([weights.sum().expand(*s.shape[:-1], 1), s], dim=-1)

    def grad_from_stats(self, theta: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
        d = self.n_columns
        mu, s = theta[:, :d], theta[:, d:]
        prec = torch.exp(-s)
        w, s1, s2 = stats[0], stats[1 : 1 + d], stats[1 + d :]
        g_mu = prec * (s1 - mu * w)
        g_s = -0.5 * w + 0.5 * prec * (s2 - 2.0 * mu * s1 + mu * mu * w)
        return torch.cat([g_mu, g_s], dim=1)

    # --- exact posterior (Normal-Inverse-Gamma per column) -------------------------------------
    conjugate = True

    def exact_init(self) -> torch.Tensor:
        """``[4d]``: (mu [d], kappa [d], alpha [d], beta [d]) of the prior; with a warm-up, after
        (seen, centre [d], scale [d], the warm-up rows [W, d]), zero until they are in."""
        if not self.warmup:
            return self._prior_nig()
        d = self.n_columns
        return torch.cat([torch.zeros(1 + 2 * d + self.warmup * d, dtype=torch.float64), self._prior_nig()])

    def _prior_nig(self) -> torch.Tensor:
        """(mu0, kappa0, alpha0, beta0), each repeated per column: ``[4d]``."""
        return torch.tensor([self.mu0, self.kappa0, self.alpha0, self.beta0], dtype=torch.float64).repeat_interleave(self.n_columns)

    def _nig(self, post: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(post[post.numel() - 4 * self.n_columns :].view(4, self.n_columns))

    def frame(self, post: torch.Tensor) -> tuple[list[float], list[float]] | None:
        """(centre [d], scale [d]) of the reference frame, None without a warm-up or during it."""
        d = self.n_columns
        if not self.warmup or int(post[0]) < self.warmup:
            return None
        return post[1 : 1 + d].tolist(), post[1 + d : 1 + 2 * d].tolist()

    def exact_conditioned(self, post: torch.Tensor, rows: int) -> int:
        """The warm-up's rows among the next ``rows``: conditioned on, not scored."""
        return max(0, min(rows, self.warmup - int(post[0]))) if self.warmup else 0

    def exact_restart(self, post: torch.Tensor) -> torch.Tensor:
        """The prior; with a warm-up, in the incumbent's scale (fixed from rows before the change),
        centred per column at the incumbent's posterior mean, scored from its first row, as the
        metric-series models restart (``TimeSeriesRegression.exact_restart``: centred at the warm-up's
        mean, the prior's mean term, kappa0 (ybar - 0)^2 / 2, went into the noise the restart
        expected wherever the columns had moved far from their first rows; during the incumbent's
        own warm-up: the prior, with a warm-up)."""
        if not (self.warmup and int(post[0]) >= self.warmup):
            return self.exact_init()
        d = self.n_columns
        centre, scale = post[1 : 1 + d], post[1 + d : 1 + 2 * d]
        mean = post[post.numel() - 4 * d : post.numel() - 3 * d]  # the posterior's mu, in the frame
        head = torch.cat([torch.tensor([float(self.warmup)], dtype=torch.float64), centre + mean * scale, scale])
        prior = self._prior_nig()
        prior[d : 2 * d] = min(self.kappa0, RESTART_KAPPA0)  # the new mean: N(the old one, sigma^2 / RESTART_KAPPA0)
        return torch.cat([head, prior])

    def exact_skip(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        """``Model.exact_skip``: the rows are exchangeable, so the posterior stays (with a warm-up, its
        count of rows goes on); None inside the warm-up, whose rows fix the frame."""
        return skip_counted(post, rows, self.warmup) if self.warmup else post

    @staticmethod
    def _nig_step(nig: torch.Tensor, d: int, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mu, kappa, alpha, beta) [4d] after the rows ``y [n, d]``, and log p(y) per column. The
        chunk's statistics are centred on its own mean, and its mean is taken around its first row,
        so data far from zero (1e6 with a spread of 1e-4) lose no digits to cancellation."""
        mu, k, a, b = nig.view(4, d)
        n = y.shape[0]
        ybar = y[0] + (y - y[0]).mean(0)
        ss = ((y - ybar) ** 2).sum(0)
        lp = _nig_log_marginal(mu, k, a, b, n, ybar, ss)
        kn = k + n
        dm = ybar - mu
        return torch.cat([mu + dm * (n / kn), kn, a + 0.5 * n, b + 0.5 * ss + 0.5 * (k * n / kn) * dm * dm]), lp

    def exact_update(self, post: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The closed-form update (``_nig_step``); with a warm-up, its rows fix the frame and are
        conditioned on, and the rows after it are scored in the frame, less log scale each."""
        d = self.n_columns
        y = rows[:, :d]
        if not self.warmup:
            new, lp = self._nig_step(post, d, y)
            return new, float(lp.sum())
        w, o = self.warmup, 1 + 2 * d
        seen = int(post[0])
        centre, scale = post[1 : 1 + d], post[1 + d : o]
        nig = post[post.numel() - 4 * d :]
        first, buf = 0, None
        if seen < w:  # warm-up: collect, and at its end fix the frame and condition on the rows
            buf = post[o : o + w * d].view(w, d).clone()
            first = min(w - seen, y.shape[0])
            buf[seen : seen + first] = y[:first]
            if seen + first == w:
                buf = torch.stack([_clean_warmup(buf[:, j]) for j in range(d)], 1)  # (each column's wild readings replaced)
                frames = [_warmup_frame(buf[:, j]) for j in range(d)]
                centre = torch.tensor([c for c, _ in frames], dtype=torch.float64)
                scale = torch.tensor([sc for _, sc in frames], dtype=torch.float64)
                nig, _ = self._nig_step(nig, d, (buf - centre) / scale)
                buf = None  # the frame is fixed: the rows are not kept
        lp = 0.0
        if first < y.shape[0]:
            nig, lps = self._nig_step(nig, d, (y[first:] - centre) / scale)
            lp = float(lps.sum()) - (y.shape[0] - first) * float(torch.log(scale).sum())
        head = torch.cat([torch.tensor([float(seen + y.shape[0])], dtype=torch.float64), centre, scale])
        return torch.cat([head] + ([buf.reshape(-1)] if buf is not None else []) + [nig]), lp

    #: rows since the prior (the start or a restart) before ``exact_warnings`` judges the prior's share:
    #: before them the prior legitimately holds much of the posterior (unit-variance data at 0: the
    #: prior's part of the noise scale falls below the data's by n = 3 or 4, below half of it by 6-8)
    CONFLICT_ROWS: ClassVar[int] = 20

    def exact_warnings(self, before: torch.Tensor, after: torch.Tensor) -> tuple[str, ...]:
        """``prior_conflict`` when, in some column, the prior holds more of the posterior's noise
        scale than the data do, ``CONFLICT_ROWS`` rows or more after the prior: the posterior's b =
        beta0 + kappa0 n (ybar - mu0)^2 / (2 (kappa0 + n)) + S / 2, S the rows' squares about their
        mean, and beta0 plus the mean term above S / 2. The model then expects noise over twice the
        data's variance and scores every row too low; a change within that noise goes unseen. In data
        units this is a column far from mu0 against its spread (1,000 +- 5: the mean term 5e5 against
        12.5 a row, for 40,000 rows; 250 +- 20 ms: for the first 156) or a spread far below beta0's
        (0.002 +- 1e-4: for ever, in practice). Not judged with a warm-up: the prior is in the frame
        (a restart's, centred at the old regime's level, holds a large shift's square for a while,
        z^2 rows for z sds: the model's own choice, not a setting to fix). Recovered from (mu, kappa,
        alpha, beta): n = kappa - kappa0, ybar = (kappa mu - kappa0 mu0) / n."""
        if self.warmup:
            return ()
        d = self.n_columns
        mu, k, _, b = after.numpy()[-4 * d :].reshape(4, d)  # (numpy: a few us a row, where torch's small ops took 40)
        n = k - self.kappa0
        old = n >= self.CONFLICT_ROWS
        if not old.any():
            return ()
        ybar = (k * mu - self.kappa0 * self.mu0) / np.maximum(n, 1.0)
        prior = self.beta0 + 0.5 * self.kappa0 * n / k * (ybar - self.mu0) ** 2
        return ("prior_conflict",) if bool((old & (prior > b - prior)).any()) else ()

    def exact_row_log_predictive(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Each row's Student-t predictive (independent columns): ``[B]``; with a warm-up, in the
        frame less log scale, and 0 during the warm-up."""
        d = self.n_columns
        mu, k, a, b = self._nig(post)
        y = rows[:, :d]
        if not self.warmup:
            return _nig_log_marginal(mu, k, a, b, 1, y, torch.zeros_like(y)).sum(-1)
        if int(post[0]) < self.warmup:  # no frame yet
            return torch.zeros(y.shape[0], dtype=torch.float64)
        centre, scale = post[1 : 1 + d], post[1 + d : 1 + 2 * d]
        z = (y - centre) / scale
        return _nig_log_marginal(mu, k, a, b, 1, z, torch.zeros_like(z)).sum(-1) - float(torch.log(scale).sum())


def _nig_log_marginal(mu, k, a, b, n: int, ybar, ss) -> torch.Tensor:
    """log p(y_1..n) of n observations with mean ``ybar`` and centred sum of squares ``ss`` under
    mu | s2 ~ N(mu, s2 / k), s2 ~ InvGamma(a, b), per column (broadcasts)."""
    kn, an = k + n, a + 0.5 * n
    bn = b + 0.5 * ss + 0.5 * (k * n / kn) * (ybar - mu) ** 2
    return (torch.lgamma(an) - torch.lgamma(a) + a * torch.log(b) - an * torch.log(bn)
            + 0.5 * torch.log(k / kn) - 0.5 * n * LOG_2PI)

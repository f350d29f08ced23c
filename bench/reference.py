"""Accurate log-evidence references for the non-conjugate models (issue 20): the Laplace
approximation at the global posterior mode, and a Student-t importance sampler around it that
checks the Laplace value where it can.

    ref = laplace_log_evidence(model, rows)           # rows: the model's featurized rows [n, F]
    chk = importance_log_evidence(model, rows, ref)   # IS with the Laplace-t proposal
    ref.log_evidence, ref.min_eigenvalue, ref.restarts_at_best, chk.log_evidence, chk.std_error

Models: ``models.mixture.GaussianMixture`` (diagonal, prior of papers/001 B.3 as implemented in
``models/mixture.py``) and ``models.linear.LogisticRegression``. Only the models' own
``log_prior``/``log_likelihood`` enter, in cusp's parameterisation, with one exact reduction:

Mixture weights. cusp's ``theta`` holds z [K] with weights = softmax(z) and z_k = log g_k,
g_k ~ Exp(1). The likelihood depends on z only through softmax(z), so the direction z + c 1 is
not identified by the data: along it the posterior is the prior's, log S with S = sum g ~
Gamma(K, 1), which is not Gaussian. Laplace in z would carry an error of about -1/(12K) nats
that does not shrink with n (exactly -0.081 at K = 1). That direction integrates out in closed
form: g = S w with S ~ Gamma(K, 1) independent of w ~ Dirichlet(1), so in the additive
log-ratio coordinates eta_k = z_k - z_K (k < K) the marginal prior is exactly
log p(eta) = lgamma(K) + sum_k log w_k. The reference therefore works in the reduced
coordinates v = (eta [K-1], mu [K, d], s [K, d]): the model's ``log_prior`` with its z-part
sum_k (z_k - e^{z_k}) swapped for that marginal (the swap is checked against the model in
tests/test_reference.py), and theta = (eta, 0, mu, s) for the likelihood. Nothing is lost:
p(y) = integral over v of p(y | v) p(v), exactly.

Label symmetry. The mixture posterior is invariant under the K! relabellings. Laplace at one
mode counts one copy; ``log K!`` is added when the copies are well separated (the smallest
Mahalanobis distance, under the mode's covariance, from the mode to a relabelled copy of
itself is ``separation``; above SEPARATED the copies' overlap is far below 1e-6 of the mass).
Below it (a component with no data, two components on one cluster) the value is flagged
``separated=False`` and is not a validated reference.

Mode search (mixture). EM with many restarts (k-means++ seeding and random data rows) on a
subsample, the distinct local modes (matched up to relabelling) refined by EM on all rows and
then polished by damped Newton on the exact log posterior in v (gradient and Hessian by
autograd). The global mode's Laplace value is the reference; ``other_modes_nats`` is how much
the other distinct local modes found would add (logsumexp of their Laplace values), a measure
of how unimodal the posterior is up to relabelling. Logistic regression: the log posterior is
strictly concave (Gaussian prior), Newton from zero finds the unique mode.

Accuracy. Laplace's error is O(1/n) where the posterior is unimodal up to relabelling; the
importance sampler (``importance_log_evidence``: a multivariate Student-t at the mode with the
Laplace covariance, mixed over the relabellings whose copies come near it) is exact in
expectation with a reported standard error. tests/test_reference.py holds the measurements.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from models._random import standard_gamma
from models.base import LOG_2PI, Model
from models.linear import LogisticRegression
from models.mixture import GaussianMixture

#: separation (Mahalanobis distance between the mode and its nearest relabelled copy) above which
#: log K! is added: the copies' Gaussian overlap, exp(-SEPARATED^2 / 8), is below 1e-9
SEPARATED = 13.0
#: at most this many rows enter a restart's EM (the distinct modes are refined on all rows)
EM_SUBSAMPLE = 20_000
#: local modes whose EM log-likelihood (subsample) is this far below the best are not polished
POLISH_NATS = 30.0
#: draws x rows per log-likelihood batch (memory: 8 bytes each)
BATCH_CELLS = 4_000_000


# --- targets: the log joint in the coordinates the Laplace approximation uses ---------------------

class Target:
    """The log joint ``log p(rows | v) + log p(v)`` in reference coordinates ``v [M, Dr]``."""

    def __init__(self, model: Model, rows: torch.Tensor):
        self.model = model
        self.rows = rows.to(torch.float64)
        self.n = int(rows.shape[0])

    dim: int
    symmetric = False

    def to_theta(self, v: torch.Tensor) -> torch.Tensor:
        return v

    def from_theta(self, theta: torch.Tensor) -> torch.Tensor:
        return theta

    def log_prior(self, v: torch.Tensor) -> torch.Tensor:
        return self.model.log_prior(self.to_theta(v))

    def log_joint(self, v: torch.Tensor) -> torch.Tensor:
        """``v [M, Dr]`` -> ``[M]``; differentiable when ``v`` requires grad."""
        theta = self.to_theta(v)
        if v.requires_grad:
            return self.log_likelihood_sum(theta) + self.log_prior(v)
        out = torch.empty(v.shape[0], dtype=torch.float64)
        step = max(1, BATCH_CELLS // max(self.n, 1))
        with torch.no_grad():
            for i in range(0, v.shape[0], step):
                out[i : i + step] = self.log_likelihood_sum(theta[i : i + step].contiguous())
            return out + self.log_prior(v)

    def log_likelihood_sum(self, theta: torch.Tensor) -> torch.Tensor:
        """``theta [M, D]`` -> ``[M]``: the model's log-likelihood summed over the rows."""
        return self.model.log_likelihood(theta, self.rows).sum(1)

    def permutations(self) -> list[torch.Tensor]:
        """Linear maps ``[Dr, Dr]`` of the relabellings under which the posterior is invariant (identity first)."""
        return [torch.eye(self.dim, dtype=torch.float64)]

    @property
    def log_symmetry(self) -> float:
        """log of the number of relabelled copies of a mode."""
        return 0.0


class MixtureTarget(Target):
    """v = (eta [K-1], mu [K*d], s [K*d]); theta = (eta, 0, mu, s). See the module docstring."""

    symmetric = True

    def __init__(self, model: GaussianMixture, rows: torch.Tensor):
        super().__init__(model, rows)
        self.k, self.d = model.components, model.n_columns
        self.dim = model.dim - 1
        # The likelihood is evaluated on centred rows with the means shifted to match:
        # N(y; mu, sigma^2) = N(y - c; mu - c, sigma^2) exactly, but the model's (y, y^2) form
        # cancels catastrophically for columns far from 0 relative to their spread (raw units).
        y = self.rows[:, : self.d]
        self.centre = y.mean(0) if self.n else torch.zeros(self.d, dtype=torch.float64)
        self.centred_rows = model.featurize(y - self.centre)

    def log_likelihood_sum(self, theta: torch.Tensor) -> torch.Tensor:
        k, d = self.k, self.d
        shift = torch.cat([torch.zeros(k, dtype=torch.float64), self.centre.repeat(k), torch.zeros(k * d, dtype=torch.float64)])
        return self.model.log_likelihood(theta - shift, self.centred_rows).sum(1)

    def to_theta(self, v: torch.Tensor) -> torch.Tensor:
        k = self.k
        zeros = torch.zeros(v.shape[0], 1, dtype=v.dtype)
        return torch.cat([v[:, : k - 1], zeros, v[:, k - 1 :]], dim=1)

    def from_theta(self, theta: torch.Tensor) -> torch.Tensor:
        """cusp's ``theta [M, D]`` -> ``v [M, Dr]`` (eta_k = z_k - z_K; the inverse of ``to_theta`` up to the
        unidentified shift of z)."""
        k = self.k
        return torch.cat([theta[:, : k - 1] - theta[:, k - 1 : k], theta[:, k:]], dim=1)

    def log_prior(self, v: torch.Tensor) -> torch.Tensor:
        theta = self.to_theta(v)
        z = theta[:, : self.k]
        cusp_z = (z - torch.exp(z)).sum(-1)  # the z-part of GaussianMixture.log_prior
        dirichlet = math.lgamma(self.k) + torch.log_softmax(z, -1).sum(-1)  # Dirichlet(1) in log-ratio coordinates
        return self.model.log_prior(theta) - cusp_z + dirichlet

    @property
    def log_symmetry(self) -> float:
        return math.lgamma(self.k + 1)

    def permutation_matrix(self, perm: tuple[int, ...]) -> torch.Tensor:
        """The map v -> v' of the relabelling 'new component j is old component perm[j]'."""
        k, d = self.k, self.d
        p = torch.zeros(k, k, dtype=torch.float64)
        p[torch.arange(k), torch.tensor(perm)] = 1.0
        embed = torch.cat([torch.eye(k - 1, dtype=torch.float64), torch.zeros(1, k - 1, dtype=torch.float64)])  # eta -> z
        ratio = torch.cat([torch.eye(k - 1, dtype=torch.float64), -torch.ones(k - 1, 1, dtype=torch.float64)], dim=1)
        a = ratio @ p @ embed
        pd = torch.kron(p, torch.eye(d, dtype=torch.float64))
        return torch.block_diag(a, pd, pd)

    def permutations(self) -> list[torch.Tensor]:
        return [self.permutation_matrix(perm) for perm in itertools.permutations(range(self.k))]


def make_target(model: Model, rows: torch.Tensor) -> Target:
    if isinstance(model, GaussianMixture):
        return MixtureTarget(model, rows)
    if isinstance(model, LogisticRegression):
        t = Target(model, rows)
        t.dim = model.dim
        return t
    raise TypeError(f"no Laplace reference for model {type(model).__name__}")


# --- EM for the diagonal mixture (starting points only) ---------------------------------------------

@dataclass
class _Fit:
    weights: np.ndarray  # [K]
    means: np.ndarray  # [K, d]
    var: np.ndarray  # [K, d]
    loglik: float = -math.inf
    iterations: int = 0


def _log_resp(x: np.ndarray, fit: _Fit) -> tuple[np.ndarray, np.ndarray]:
    """(log responsibilities [n, K], log-likelihood per row [n])."""
    prec = 1.0 / fit.var  # [K, d]
    quad = (x * x) @ prec.T - 2.0 * x @ (fit.means * prec).T + (fit.means**2 * prec).sum(1)  # [n, K]
    lp = np.log(np.maximum(fit.weights, 1e-300)) - 0.5 * (x.shape[1] * LOG_2PI + np.log(fit.var).sum(1)) - 0.5 * quad
    t = torch.from_numpy(lp)
    ll = torch.logsumexp(t, 1)  # torch: numpy's reductions over a short last axis are slow
    return (t - ll[:, None]).numpy(), ll.numpy()


def _kmeanspp(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    centres = [x[rng.integers(len(x))]]
    d2 = ((x - centres[0]) ** 2).sum(1)
    for _ in range(1, k):
        p = d2 / d2.sum() if d2.sum() > 0 else np.full(len(x), 1.0 / len(x))
        c = x[rng.choice(len(x), p=p)]
        centres.append(c)
        d2 = np.minimum(d2, ((x - c) ** 2).sum(1))
    return np.array(centres)


def _em(x: np.ndarray, means: np.ndarray, max_iter: int = 300, tol: float = 1e-7) -> _Fit:
    """Maximum-likelihood EM from the given means (one hard assignment step sets weights and variances),
    until the log-likelihood gains less than ``tol`` nats per row: a starting point for Newton, which
    converges to the mode itself."""
    n, d = x.shape
    k = means.shape[0]
    floor = 1e-8 * x.var(0).max() + 1e-300
    nearest = ((x[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    var = np.empty((k, d))
    w = np.empty(k)
    for j in range(k):
        pts = x[nearest == j]
        w[j] = max(len(pts), 1) / n
        var[j] = pts.var(0) if len(pts) > 1 else x.var(0)
    fit = _Fit(w / w.sum(), means.astype(np.float64).copy(), np.maximum(var, floor))
    prev = -math.inf
    for it in range(max_iter):
        lr, ll = _log_resp(x, fit)
        total = float(ll.sum())
        fit.loglik, fit.iterations = total, it
        if total - prev < tol * n:
            break
        prev = total
        r = np.exp(lr)
        nk = r.sum(0) + 1e-12
        fit.weights = nk / nk.sum()
        fit.means = (r.T @ x) / nk[:, None]
        fit.var = np.maximum((r.T @ (x * x)) / nk[:, None] - fit.means**2, floor)
    return fit


def _same_mode(a: _Fit, b: _Fit, tol: float = 0.5) -> bool:
    """Whether two fits are one mode up to relabelling: after the best matching of components, no mean
    moved by more than ``tol`` of its standard deviation, no log-variance or log-weight by more than ``tol``."""
    from scipy.optimize import linear_sum_assignment

    sd = np.sqrt(a.var)
    cost = (np.abs(a.means[:, None, :] - b.means[None]) / sd[:, None, :]).max(-1)  # [K, K]
    ri, ci = linear_sum_assignment(cost)
    if cost[ri, ci].max() > tol:
        return False
    if np.abs(np.log(a.var[ri]) - np.log(b.var[ci])).max() > tol:
        return False
    return bool(np.abs(np.log(a.weights[ri]) - np.log(b.weights[ci])).max() <= tol)


def _fit_to_v(fit: _Fit) -> torch.Tensor:
    lw = np.log(np.maximum(fit.weights, 1e-300))
    eta = lw[:-1] - lw[-1]
    return torch.from_numpy(np.concatenate([eta, fit.means.ravel(), np.log(fit.var).ravel()]))


def _v_to_fit(v: torch.Tensor, k: int, d: int) -> _Fit:
    a = v.detach().numpy()
    z = np.append(a[: k - 1], 0.0)
    w = np.exp(z - z.max())
    return _Fit(w / w.sum(), a[k - 1 : k - 1 + k * d].reshape(k, d).copy(), np.exp(a[k - 1 + k * d :]).reshape(k, d))


# --- Newton polish and the Laplace value ---------------------------------------------------------------

def _value_grad_hess(target: Target, v: torch.Tensor, hessian: bool = True):
    with torch.enable_grad():
        x = v.detach().clone().requires_grad_(True)
        f = target.log_joint(x[None])[0]
        (g,) = torch.autograd.grad(f, x, create_graph=hessian)
        if not hessian:
            return float(f.detach()), g.detach(), None
        h = torch.empty(len(v), len(v), dtype=torch.float64)
        for i in range(len(v)):
            (row,) = torch.autograd.grad(g[i], x, retain_graph=i + 1 < len(v))
            h[i] = row
    return float(f.detach()), g.detach(), 0.5 * (h + h.T)


def newton_mode(target: Target, v0: torch.Tensor, max_iter: int = 200, tol: float = 1e-9,
                refresh: int = 8) -> tuple[torch.Tensor, float, int]:
    """Damped Newton ascent of the log joint from ``v0``; returns (mode, log joint, Hessians computed).

    The Hessian (``len(v)`` backward passes) is reused for up to ``refresh`` steps (each then costs one
    gradient) and recomputed when a step fails to ascend; it is made negative definite by flipping and
    flooring its eigenvalues where it is not. Stops when the Newton decrement g' (-H)^-1 g is below
    ``tol`` nats or no step along the direction ascends (the mode, to rounding)."""
    v = v0.detach().clone().to(torch.float64)
    f, g, h = _value_grad_hess(target, v)
    hessians, age = 1, 0

    def factor(h):
        lam, u = torch.linalg.eigh(-h)
        return torch.clamp(lam.abs(), min=max(float(lam.abs().max()) * 1e-12, 1e-12)), u

    lam, u = factor(h)
    for _ in range(max_iter):
        step = u @ ((u.T @ g) / lam)
        dec = float(g @ step)  # Newton decrement squared (with the current Hessian)
        if dec < tol:
            if age == 0:
                return v, f, hessians
            f, g, h = _value_grad_hess(target, v)  # confirm with a fresh Hessian
            hessians, age = hessians + 1, 0
            lam, u = factor(h)
            continue
        t = 1.0
        while t > 1e-10:
            cand = v + t * step
            fc = float(target.log_joint(cand[None])[0])
            if math.isfinite(fc) and fc >= f + 1e-4 * t * dec:
                break
            t *= 0.5
        else:
            if age == 0:  # no ascent along a fresh Newton direction: at the mode, to rounding
                return v, f, hessians
            f, g, h = _value_grad_hess(target, v)
            hessians, age = hessians + 1, 0
            lam, u = factor(h)
            continue
        v = cand
        age += 1
        if age >= refresh or t < 1.0:
            f, g, h = _value_grad_hess(target, v)
            hessians, age = hessians + 1, 0
            lam, u = factor(h)
        else:
            f, g, _ = _value_grad_hess(target, v, hessian=False)
    return v, f, hessians


@dataclass
class Mode:
    v: torch.Tensor  # [Dr]
    log_joint: float
    log_laplace: float  # Laplace value of this one copy of the mode
    neg_hessian: torch.Tensor  # [Dr, Dr]
    min_eigenvalue: float
    max_eigenvalue: float
    restarts: int  # restarts that reached it
    newton_iterations: int = 0


def _laplace_at(target: Target, v: torch.Tensor, restarts: int = 1, iterations: int = 0) -> Mode:
    f, g, h = _value_grad_hess(target, v)
    neg = -h
    lam = torch.linalg.eigvalsh(neg)
    lo, hi = float(lam.min()), float(lam.max())
    if lo > 0:
        logdet = float(torch.log(lam).sum())
        lap = f + 0.5 * len(v) * LOG_2PI - 0.5 * logdet
    else:
        lap = math.nan
    return Mode(v, f, lap, neg, lo, hi, restarts, iterations)


@dataclass
class Reference:
    """A Laplace log-evidence reference and its diagnostics (see the module docstring)."""

    log_evidence: float  # the reference: the global mode's Laplace value + log_symmetry (when separated)
    log_laplace_one_copy: float  # Laplace at the global mode, one labelling
    log_symmetry: float  # log K! added for the relabelled copies (0: none added)
    log_joint_at_mode: float
    dim: int  # dimension of the Laplace integral (the mixture's is model.dim - 1, see above)
    positive_definite: bool
    min_eigenvalue: float  # of minus the Hessian at the mode
    max_eigenvalue: float
    separation: float  # Mahalanobis distance to the nearest relabelled copy (inf: no symmetry)
    separated: bool
    restarts: int
    restarts_at_best: int
    distinct_modes: int  # distinct local modes EM found (up to relabelling)
    polished_modes: int  # of those, Newton-polished on all rows (within POLISH_NATS of the best)
    other_modes_nats: float  # logsumexp of the polished modes' Laplace values minus the global mode's
    seconds: float
    mode: torch.Tensor = field(repr=False)  # [Dr]
    neg_hessian: torch.Tensor = field(repr=False)  # [Dr, Dr]
    n: int = 0

    @property
    def valid(self) -> bool:
        return self.positive_definite and self.separated

    def summary(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("mode", "neg_hessian")}


def _separation(target: Target, v: torch.Tensor, neg_h: torch.Tensor) -> float:
    if not target.symmetric:
        return math.inf
    best = math.inf
    for p in target.permutations()[1:]:
        dv = p @ v - v
        best = min(best, float(dv @ neg_h @ dv))
    return math.sqrt(max(best, 0.0))


def _mixture_modes(target: MixtureTarget, x: np.ndarray, restarts: int, seed: int, polish: int) -> tuple[list[Mode], int]:
    k = target.k
    rng = np.random.default_rng([seed, 0x1A9])
    # EM on standardised columns (raw units: offsets far from 0, tiny or huge spreads), fits mapped back
    loc, sd = x.mean(0), x.std(0) + 1e-300
    xs = (x - loc) / sd
    sub = xs if len(xs) <= EM_SUBSAMPLE else xs[rng.choice(len(xs), EM_SUBSAMPLE, replace=False)]
    fits = []
    for r in range(restarts):
        means = _kmeanspp(sub, k, rng) if r % 3 != 2 else sub[rng.choice(len(sub), k, replace=False)]
        f = _em(sub, means)
        fits.append(_Fit(f.weights, f.means * sd + loc, f.var * sd**2, f.loglik - len(sub) * float(np.log(sd).sum()), f.iterations))
    fits.sort(key=lambda f: -f.loglik)
    groups: list[list[_Fit]] = []  # distinct modes, best first
    for f in fits:
        for grp in groups:
            if _same_mode(grp[0], f):
                grp.append(f)
                break
        else:
            groups.append([f])
    # polish the best distinct modes whose subsample log-likelihood is within POLISH_NATS of the best
    # (farther ones would add less than exp(-POLISH_NATS) relative), from their subsample fits
    modes = []
    for grp in groups[:polish]:
        if grp[0].loglik < groups[0][0].loglik - POLISH_NATS:
            break
        v, _, it = newton_mode(target, _fit_to_v(grp[0]))
        modes.append(_laplace_at(target, v, restarts=len(grp), iterations=it))
    # two EM groups may polish to one mode: merge them (same mode up to relabelling)
    merged: list[Mode] = []
    for m in sorted(modes, key=lambda m: -m.log_joint):
        fm = _v_to_fit(m.v, k, target.d)
        for o in merged:
            if _same_mode(_v_to_fit(o.v, k, target.d), fm, tol=1e-3):
                o.restarts += m.restarts
                break
        else:
            merged.append(m)
    return merged, len(groups)


def laplace_log_evidence(model: Model, rows: torch.Tensor, restarts: int = 24, seed: int = 0, polish: int = 4) -> Reference:
    """The Laplace reference for ``model`` on featurized ``rows [n, F]`` (``model.featurize(data)``).

    Mixture: ``restarts`` EM runs (two of three k-means++ seeded, one of three from random rows), the
    ``polish`` best distinct modes refined and Newton-polished. Logistic regression: Newton from zero."""
    t0 = time.perf_counter()
    target = make_target(model, rows)
    if isinstance(target, MixtureTarget):
        x = rows[:, : target.d].numpy()
        modes, n_local = _mixture_modes(target, x, restarts, seed, polish)
        n_restarts = restarts
    else:
        v, _, it = newton_mode(target, torch.zeros(target.dim, dtype=torch.float64))
        modes = [_laplace_at(target, v, iterations=it)]
        n_restarts, n_local = 1, 1
    best = max(modes, key=lambda m: m.log_joint)
    sep = _separation(target, best.v, best.neg_hessian)
    separated = sep >= SEPARATED
    sym = target.log_symmetry if separated else 0.0
    finite = [m.log_laplace for m in modes if math.isfinite(m.log_laplace)]
    other = (float(torch.logsumexp(torch.tensor(finite, dtype=torch.float64), 0)) - best.log_laplace) if finite and math.isfinite(best.log_laplace) else math.nan
    return Reference(
        log_evidence=best.log_laplace + sym, log_laplace_one_copy=best.log_laplace, log_symmetry=sym,
        log_joint_at_mode=best.log_joint, dim=target.dim, positive_definite=best.min_eigenvalue > 0,
        min_eigenvalue=best.min_eigenvalue, max_eigenvalue=best.max_eigenvalue, separation=sep, separated=separated,
        restarts=n_restarts, restarts_at_best=best.restarts, distinct_modes=n_local, polished_modes=len(modes), other_modes_nats=other,
        seconds=time.perf_counter() - t0, mode=best.v, neg_hessian=best.neg_hessian, n=target.n,
    )


# --- importance sampling with the Laplace-t proposal ----------------------------------------------------

@dataclass
class ImportanceEstimate:
    log_evidence: float
    std_error: float  # of log_evidence (delta method on the weights' mean)
    ess: float  # effective sample size of the weights
    draws: int
    copies: int  # relabelled copies of the proposal in the mixture (1: none near the mode)
    dof: float
    seconds: float


def importance_log_evidence(model: Model, rows: torch.Tensor, ref: Reference, draws: int = 20_000, dof: float = 5.0,
                            seed: int = 0, scale: float = 1.0, near: float = 60.0) -> ImportanceEstimate:
    """Importance sampling of p(rows) with a multivariate Student-t (``dof``) proposal at the
    reference's mode with covariance ``scale^2 (-H)^{-1}``, symmetrised over the relabellings:
    q = (1/K!) sum_pi q_pi. As p and q are both invariant, drawing from q_id and weighting by
    p / q is the same estimator. Copies farther than ``near`` Mahalanobis units from the mode
    are left out of q (their density near the draws is below (1 + near^2/dof)^(-(dof+D)/2) of
    q_id's, under 1e-15 for D >= 3)."""
    t0 = time.perf_counter()
    target = make_target(model, rows)
    g = torch.Generator().manual_seed(int(seed))
    dim = target.dim
    cov = torch.linalg.inv(ref.neg_hessian) * scale**2
    cov = 0.5 * (cov + cov.T)
    chol = torch.linalg.cholesky(cov)
    z = torch.randn(draws, dim, generator=g, dtype=torch.float64)
    chi2 = 2.0 * standard_gamma(g, dof / 2.0, (draws,))  # chi-square(dof), from the seeded generator
    v = ref.mode + (z @ chol.T) * torch.sqrt(dof / chi2)[:, None]
    logdet = 2.0 * float(torch.log(torch.diagonal(chol)).sum())
    const = math.lgamma((dof + dim) / 2) - math.lgamma(dof / 2) - 0.5 * dim * math.log(dof * math.pi) - 0.5 * logdet

    def log_t(x: torch.Tensor) -> torch.Tensor:
        sol = torch.linalg.solve_triangular(chol, (x - ref.mode).T, upper=False)  # [D, M]
        return const - 0.5 * (dof + dim) * torch.log1p((sol * sol).sum(0) / dof)

    perms = target.permutations()
    near_perms = [p for p in perms if float(((p @ ref.mode - ref.mode) @ ref.neg_hessian @ (p @ ref.mode - ref.mode))) <= (near * scale) ** 2]
    # q_pi(x) = q_id(P_pi^{-1} x) (|det P_pi| = 1: a relabelling is a linear map of finite order)
    logq = torch.stack([log_t(v @ torch.linalg.inv(p).T) for p in near_perms])  # [copies, M]
    log_q = torch.logsumexp(logq, 0) - math.log(len(perms))
    log_w = target.log_joint(v) - log_q
    log_w = torch.where(torch.isfinite(log_w), log_w, torch.tensor(-math.inf, dtype=torch.float64))
    m = float(log_w.max())
    w = torch.exp(log_w - m)
    mean = float(w.mean())
    se = float(w.std()) / (mean * math.sqrt(draws))
    ess = float(w.sum() ** 2 / (w * w).sum())
    return ImportanceEstimate(m + math.log(mean), se, ess, draws, len(near_perms), dof, time.perf_counter() - t0)

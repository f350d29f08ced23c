"""Heavy tails: ``student-t``, a level and a scale with a Student-t likelihood, evidence by
deterministic quadrature.

**Model.** A univariate series in a frame fixed from its first ``warmup`` rows, z = (y - centre)
/ scale with centre their median and scale 1.4826 x their median absolute deviation (robust: a
heavy-tailed warm-up often holds an outlier, and its sd would put the frame's unit far above the
noise, where the prior below forbids the scale the data need): z_t = mu + sigma e_t, e_t ~
Student-t with nu degrees of freedom, and the prior of ``level`` on (mu, sigma^2): mu | sigma^2 ~
N(0, sigma^2 coef_scale^2), sigma^2 ~ InvGamma(alpha0, beta0). nu is fixed (``nu`` > 0) or, by
default (``nu`` = 0), one of 1, 2, 4, 8, 16, 32 with equal prior weight (a finite mixture: each nu
keeps its own posterior and evidence, and the chunk's log predictive is the log of their weighted
sum). As nu grows the model becomes ``level`` (with this frame). The warm-up rows are
conditioned on, not scored, as for the regressions (models/timeseries.py): the evidence is
log p(y_{k+1..n} | y_1..k), and y -> a y + b changes it by -(n - k) log|a| only. The frame is
shown like the regressions' (``frame``: centre, scale).

**Quadrature.** The likelihood is not conjugate, so for each nu the posterior density of
(mu, lambda = log sigma) is kept on a tensor grid of ``NODES`` x ``NODES`` Chebyshev points with
Clenshaw-Curtis weights over a box in the coordinates (s, lambda), mu = m + e^lambda a sinh(s):
the anchor m, the scale a and the ranges are fitted to the posterior (its mean, and 8 standard
deviations on each side, widened until the density on every side of the box is below e^-30 of
its peak; when the rows are about to be dropped and at later refits, ``REGRID_SPAN`` sds in
log sigma and ``REACH`` times that in u, room for a level shift before the detector restarts). The sinh map resolves a peaked posterior with heavy tails (few rows, small nu), and
u = (mu - m) / sigma makes the cone of a posterior whose spread in mu scales with sigma a
rectangle. The log evidence is log sum W exp(log joint) over the nodes, and a chunk's log
predictive the difference of two such sums.

- While the model has conditioned on at most ``warmup`` + ``EXACT_ROWS`` rows since its start
  (or restart), it keeps them (standardised). A chunk adds its rows' log likelihood at the nodes;
  when a posterior reaches a side of its box (e^-30) or the rows have grown 1.5x since the last
  fit, the box is refitted and the log joint evaluated at its nodes from all the rows: no
  approximation but the quadrature's.
- After that, while the conditioned rows hold at most ``_distinct_cap`` (``cap`` // 2, 18 at the
  default warm-up) distinct values, they are kept as those values and their counts, and every
  refit stays exact. A gauge on one value (a pod count, a flag), or on a few, has a posterior whose
  scale shrinks without end (log sigma falls like -log(n) / 2): no fixed box holds it, and before
  this the posterior left its box after about 400 rows, every chunk warned ``quadrature_edge`` and
  2,000 flat rows lost 790-880 nats (tests/test_heavy.py). Such a state is written as layout 2
  (``exact_layout``): a release before it would read the values as rows, and refuses it instead.
- Otherwise (or once a value beyond those arrives) the rows are dropped, after a last exact refit
  with room to move, and a chunk adds its rows' log likelihood at the nodes (exact
  at the nodes). When the posterior has narrowed to half the box in a coordinate, the box is
  refitted and the log joint carried to the new nodes by barycentric interpolation in the old
  box (checked whenever n grows 1.25x, done when the fitted box is 0.7 of the old one or less in
  a coordinate; it only shrinks, so never extrapolates; the log joint is smooth there). A posterior that
  moves out of its box (a change the detector has not yet restarted at) cannot follow without
  the rows: the mass beyond the box is lost, the evidence is then that of a prior cut to the box,
  and the result says so: the ``quadrature_edge`` warning (service/sgais/exact.py).

Accuracy against independent 2-D quadrature (scipy's dblquad; tests/test_heavy.py), raw units
from 1e-4 to 1e4 at offsets to 1e6: within 3e-6 nats while the rows are kept, 1.1e-5 after 1,500
rows for nu = 3 and 30, and up to a few 1e-3 nats after 1,500 Cauchy (nu = 1) rows (interpolation
at regrids; ~1e-6 of the evidence). The sums over rows at the nodes and the rows' predictives run in
models/_native.c (``t_loglik``, ``t_row_lse``; torch is the fallback and, in tests/test_native.py,
the reference: the same evidence to 1e-9 nats). Cost, one thread, the default six nu, after the
rows are dropped: 9 ms for a chunk of 500 rows (54 ms on the torch path), 0.4 ms for one row
(Python's own overhead); 3.7 ms a refit from 37 kept rows (every nu's box fitted at once; a
challenger refits whenever its rows grow 1.5x). Each row's one-step predictive (the detector's row
fits) is taken on the current grid, rows kept or not: while they are kept a one-step update may
refit the box from them, and the two agree to the quadrature's error (at most 7e-9 nats on 42
typical rows; up to 2.5e-4 for a row 20 sds out right after the warm-up, where a refit moves
the box most; each row as a one-step update made ``POST /v1/detect`` of 864 rows 2 s slower).
Deterministic (no randomness); the state is one float64 vector (about 110 KB with six nu).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import ClassVar

import torch

from models.base import ModelError
from models.native import kernels
from models.timeseries import _check_finite, _check_frame_prior, _check_warmup, _clean_warmup, _Exact, flat_unit

#: Chebyshev points per coordinate of each nu's grid
NODES = 48
#: rows (after the warm-up) kept and re-read exactly before the grid is updated incrementally
EXACT_ROWS = 32
#: the default grid of degrees of freedom (``nu`` = 0), equal prior weight
NU_GRID = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
#: half-width of a box fitted from the rows, in posterior standard deviations (then widened
#: until every side is below e^EDGE)
SPAN = 8.0
#: half-width of a box refitted without the rows (it cannot widen again: room for the posterior
#: to move)
REGRID_SPAN = 10.0
#: ... and this many times as far in mu (the sinh map keeps the core resolved): room for a level
#: shift the detector has not yet restarted at, which moves mu far more than sigma
REACH = 4.0
#: a side of a box updated without the rows whose log density comes within this of the peak:
#: the ``quadrature_edge`` warning (the mass beyond it is no longer below ~1e-6 of the evidence,
#: and grows as the posterior moves on)
WARN = -12.0
#: a side of the box whose log density is within this of the peak is too close (e^-30 ~ 1e-13)
EDGE = -30.0
#: the sinh map's scale a, in robust spreads of u (larger: a milder map, smoother for interpolation)
CORE = 1.0
#: refits of a box from the rows before giving up widening it
FITS = 8
#: the most passes that zoom a box onto the posterior before the widening (``StudentT._fit``)
ZOOMS = 8

_HEAD = 8  # seen, centre, scale, rows kept, rows complete (1 rows / 2 distinct values and counts / 0 none), edge events, log Z, n at the last box fit / regrid check
#: while the rows are kept, the boxes are refitted from them when a posterior reaches a side or the
#: rows have grown by this factor since the last fit (the posterior narrows)
REFIT = 1.5
#: a box is refitted when the posterior's fitted box is this fraction of it or less in a coordinate
SHRINK = 0.7
#: the boxes are checked for a regrid whenever n has grown by this factor (a posterior narrows to
#: half its box when n grows about 4x)
RECHECK = 1.25
_BOX = 6  # m, a, s_lo, s_hi, lam_lo, lam_hi


@lru_cache(maxsize=4)
def _cheb(g: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chebyshev points of the second kind on [-1, 1] (descending), their Clenshaw-Curtis weights
    and barycentric weights."""
    n = g - 1
    theta = torch.arange(g, dtype=torch.float64) * math.pi / n
    x = torch.cos(theta)
    w = torch.zeros(g, dtype=torch.float64)
    v = torch.ones(n - 1, dtype=torch.float64)
    inner = theta[1:-1]
    if n % 2 == 0:
        w[0] = w[n] = 1.0 / (n * n - 1)
        for k in range(1, n // 2):
            v = v - 2.0 * torch.cos(2 * k * inner) / (4 * k * k - 1)
        v = v - torch.cos(n * inner) / (n * n - 1)
    else:
        w[0] = w[n] = 1.0 / (n * n)
        for k in range(1, (n - 1) // 2 + 1):
            v = v - 2.0 * torch.cos(2 * k * inner) / (4 * k * k - 1)
    w[1:-1] = 2.0 * v / n
    bary = torch.ones(g, dtype=torch.float64)
    bary[1::2] = -1.0
    bary[0] *= 0.5
    bary[-1] *= 0.5
    return x, w, bary


@lru_cache(maxsize=4)
def _t_terms(nus: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each nu ``[V, 1]``: the Student-t's log normaliser lgamma((nu + 1) / 2) - lgamma(nu / 2)
    - log(nu pi) / 2, 1 / sqrt(nu) and (nu + 1) / 2 (shared: not to be written to)."""
    nu = torch.tensor(nus, dtype=torch.float64)[:, None]
    return torch.lgamma((nu + 1) / 2) - torch.lgamma(nu / 2) - 0.5 * torch.log(nu * math.pi), nu.rsqrt(), (nu + 1) / 2


def _interp_matrix(nodes: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """``[P, G]``: the barycentric interpolation weights of points ``at [P]`` (in [-1, 1]) on the
    Chebyshev points ``nodes``."""
    _, _, bary = _cheb(nodes.shape[0])
    d = at[:, None] - nodes[None, :]
    exact = d == 0
    d = torch.where(exact, torch.ones_like(d), d)
    m = bary / d
    m = m / m.sum(1, keepdim=True)
    hit = exact.any(1)
    if bool(hit.any()):
        m[hit] = exact[hit].to(torch.float64)
    return m


def robust_frame(rows: torch.Tensor) -> tuple[float, float]:
    """(centre, scale) of the warm-up rows: their median and 1.4826 x their median absolute
    deviation (the sd for Gaussian data, unmoved by an outlier among them) but at least 1e-3 of
    their sd; where that deviation is 0 (most of the rows equal), their sd; else (all equal)
    ``flat_unit``, as the regressions take it."""
    centre = float(torch.quantile(rows, 0.5))
    sd = float(rows.std()) if rows.shape[0] > 1 else 0.0
    mad = 1.4826 * float(torch.quantile((rows - centre).abs(), 0.5))
    # at least 1e-3 of their sd: nearly equal values and a few far ones (1e-308, 1e-170, 42, ...)
    # would otherwise give a unit 1e-169 and z-values whose squares overflow. Not that floor where
    # the deviation is 0: an integer gauge flickering 5, 4, 5, 5, 4 took 1e-3 of its sd as its unit
    # (until 2026-11-28), its noise then 1,000 units, far in the prior's tail (sigma^2 ~ InvGamma(1, 1))
    scale = max(mad, 1e-3 * sd) if mad > 0 else sd
    if not scale > 0:
        scale = flat_unit(centre, rows.tolist())
    return centre, scale


def _distinct(z: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct values of ``z`` (ascending) and the sum of ``counts`` of each."""
    vals, inverse = torch.unique(z, sorted=True, return_inverse=True)
    return vals, torch.zeros(vals.shape[0], dtype=counts.dtype).index_add_(0, inverse, counts)


def _median_sd(z: torch.Tensor, counts: torch.Tensor | None = None) -> tuple[float, float]:
    """The median and sd of the rows ``z`` (each ``counts`` times, if given); 0 where undefined."""
    if counts is None:
        return (float(z.median()) if z.shape[0] else 0.0), (float(z.std()) if z.shape[0] > 1 else 0.0)
    n = float(counts.sum())
    if n < 1:
        return 0.0, 0.0
    order = torch.argsort(z)
    at = int(torch.searchsorted(counts[order].cumsum(0), torch.tensor(0.5 * n, dtype=counts.dtype)))
    mean = float((counts * z).sum()) / n
    var = float((counts * (z - mean) ** 2).sum()) / (n - 1) if n > 1 else 0.0
    return float(z[order[min(at, z.shape[0] - 1)]]), math.sqrt(max(var, 0.0))


@dataclass(frozen=True)
class StudentT(_Exact):
    """Heavy tails: level and scale with a Student-t likelihood (module docstring).
    ``post`` = head [8], warm-up buffer [warmup], kept rows [warmup + EXACT_ROWS] (head[4] = 1: the
    rows, head[3] of them; 2: head[3] distinct values, then from ``_distinct_cap`` on their counts;
    0: none, the grids go on without them), then per nu:
    box [6] and the log joint at the nodes [NODES * NODES] minus log Z (normalised: the weighted
    sum of exp over every nu's nodes is 1); log Z = log p(conditioned rows) is head[6].

    Several columns (at most ``MAX_COLUMNS``): independent, each with its own frame, level, scale
    and nu (the product of one-column models: log evidences add, ``post`` is the columns' posts one
    after the other), restarted together at a change. For streams of several gauges whose readings
    have wild values or flicker between a few, where ``gaussian`` reads each wild value as two
    changes (README, "Models for metric series")."""

    name = "student-t"
    exchangeable = True  # i.i.d. given (mu, sigma, nu); each exact update may refit the grids
    nu: float = 0.0
    warmup: int = 5
    coef_scale: float = 10.0
    alpha0: float = 1.0
    beta0: float = 1.0

    #: the most columns: each holds its grids (6 x 48 x 48 nodes, 111 KB), the detector's recent states too
    MAX_COLUMNS: ClassVar[int] = 16

    def __post_init__(self) -> None:
        n = self.name
        if not 1 <= self.n_columns <= self.MAX_COLUMNS:
            raise ModelError(f"{n} models at most {self.MAX_COLUMNS} columns (independent, each its grids of "
                             f"{len(self.nus) * NODES * NODES:,} nodes), the stream has {self.n_columns}: use gaussian "
                             "or gmm for more, or a stream per group of columns")
        if not (isinstance(self.nu, (int, float)) and math.isfinite(self.nu) and (self.nu == 0 or 0.1 <= self.nu <= 1e4)):
            raise ModelError(f"{n}: nu must be 0 (a grid of 1, 2, 4, 8, 16, 32 degrees of freedom) or a number in "
                             f"[0.1, 10000], got {self.nu!r}")
        _check_warmup(n, self.warmup, 2)
        _check_frame_prior(n, self)

    # --- shape ---------------------------------------------------------------------------------
    @property
    def nus(self) -> tuple[float, ...]:
        return (float(self.nu),) if self.nu else NU_GRID

    @property
    def dim(self) -> int:
        return (2 if self.nu else 3) * self.n_columns  # mu, sigma (and nu) per column

    def parameter_names(self) -> list[str]:
        names = ["mu", "sigma"] + ([] if self.nu else ["nu"])
        return names if self.n_columns == 1 else [f"{p}[{j}]" for j in range(self.n_columns) for p in names]

    # --- several columns: one-column models side by side ----------------------------------------
    @cached_property
    def _one(self) -> "StudentT":
        """The model of one column (itself when there is one)."""
        return self if self.n_columns == 1 else replace(self, n_columns=1)

    def _columns(self, post: torch.Tensor) -> torch.Tensor:
        """``post`` as one row per column ``[C, P]`` (a view)."""
        return post.view(self.n_columns, -1)

    def featurize(self, data: torch.Tensor) -> torch.Tensor:
        self.check_width(data)
        return _check_finite(self.name, data.to(torch.float64))

    @property
    def _cap(self) -> int:
        return self.warmup + EXACT_ROWS

    @property
    def _distinct_cap(self) -> int:
        """The most distinct values kept with their counts (in the kept rows' room: values, then counts)."""
        return self._cap // 2

    # --- posterior layout ----------------------------------------------------------------------
    def _offsets(self) -> tuple[int, int, int]:
        k = self.warmup
        return _HEAD, _HEAD + k, _HEAD + k + self._cap  # warm-up buffer, kept rows, grids

    def _grids(self, post: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``[V, 6]`` (boxes) and ``[V, G, G]`` (log joints) into ``post``."""
        o = self._offsets()[2]
        v, gg = len(self.nus), NODES * NODES
        block = post[o:].view(v, _BOX + gg)
        return block[:, :_BOX], block[:, _BOX:].view(v, NODES, NODES)

    def exact_init(self) -> torch.Tensor:
        if self.n_columns > 1:
            return self._one.exact_init().repeat(self.n_columns)
        v = len(self.nus)
        post = torch.zeros(self._offsets()[2] + v * (_BOX + NODES * NODES), dtype=torch.float64)
        post[4] = 1.0  # the kept rows are complete (none yet)
        return post

    def frame(self, post: torch.Tensor) -> tuple[float, float] | tuple[list[float], list[float]] | None:
        """(centre, scale) of the reference frame (lists, one per column, for several), None during
        the warm-up."""
        if self.n_columns > 1:
            frames = [self._one.frame(p) for p in self._columns(post)]
            return None if None in frames else ([f[0] for f in frames], [f[1] for f in frames])
        return (float(post[1]), float(post[2])) if int(post[0]) >= self.warmup else None

    def exact_restart(self, post: torch.Tensor) -> torch.Tensor:
        """As the regressions (``TimeSeriesRegression.exact_restart``): the prior in the incumbent's
        scale, centred at its posterior mean of the level (``_location``), scored from its first
        row; during the incumbent's warm-up, the prior with a warm-up. (Centred at the warm-up's
        centre, a restart of a series that had wandered far from where it began met data its prior
        of mu, N(0, sigma^2 coef_scale^2), conflicted with, and took sigma for too large.)"""
        if self.n_columns > 1:
            return torch.cat([self._one.exact_restart(p) for p in self._columns(post)])
        new = self.exact_init()
        if int(post[0]) >= self.warmup:
            new[0], new[1], new[2] = float(self.warmup), float(post[1]) + self._location(post) * float(post[2]), post[2]
        return new

    def _location(self, post: torch.Tensor) -> float:
        """The posterior mean of mu in the frame, over every nu's nodes (each weighted by its
        posterior mass: the stored log joints, less their log total)."""
        boxes, logjs = self._grids(post)
        lam, sh, logw = self._nodes_all(boxes)
        lj = logw + logjs
        p = torch.exp(lj - torch.logsumexp(lj.flatten(), 0))
        return float((p * self._mu(boxes, sh, lam)).sum())

    # --- densities --------------------------------------------------------------------------------
    def _log_prior(self, mu: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        """log p(mu, lambda) (lambda = log sigma): N(mu; 0, c^2 sigma^2) and sigma^2 ~ InvGamma(alpha0,
        beta0), with the Jacobian 2 sigma^2 of sigma^2 -> lambda."""
        c, a0, b0 = self.coef_scale, self.alpha0, self.beta0
        var = (c * c) * torch.exp(2 * lam)
        normal = -0.5 * (math.log(2 * math.pi) + torch.log(var) + mu * mu / var)
        invgamma = a0 * math.log(b0) - math.lgamma(a0) - (a0 + 1) * 2 * lam - b0 * torch.exp(-2 * lam)
        return normal + invgamma + math.log(2.0) + 2 * lam

    # --- boxes ----------------------------------------------------------------------------------
    @staticmethod
    def _nodes_all(boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The nodes of every box ``[V, 6]`` at once: (lam [V, G], a sinh(s) [V, G], log weight
        [V, G, G]); mu = m + a sinh(s) e^lam is ``_mu``'s."""
        x, w, _ = _cheb(NODES)
        m, a, s_lo, s_hi, l_lo, l_hi = (boxes[:, i : i + 1] for i in range(_BOX))
        s = 0.5 * (s_lo + s_hi) + 0.5 * (s_hi - s_lo) * x
        lam = 0.5 * (l_lo + l_hi) + 0.5 * (l_hi - l_lo) * x
        logw = (torch.log(w * 0.5 * (s_hi - s_lo) * a * torch.cosh(s))[:, :, None]
                + (torch.log(w * 0.5 * (l_hi - l_lo)) + lam)[:, None, :])
        return lam, a * torch.sinh(s), logw

    @staticmethod
    def _mu(boxes: torch.Tensor, sh: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        """mu at the nodes ``[V, G, G]`` (index [s, lam]) from ``_nodes_all``'s lam and a sinh(s)."""
        return boxes[:, 0, None, None] + sh[:, :, None] * torch.exp(lam)[:, None, :]

    def _factors(self, sh: torch.Tensor, lam: torch.Tensor, idx: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """For every nu (or the nus ``idx``): its log normaliser and (nu + 1) / 2 ``[V, 1]`` (``_t_terms``),
        and the two factors of the standardised residual at the nodes, (z - mu) / (sigma sqrt(nu)) =
        (z - m) er_j - sr_i: er = e^-lam / sqrt(nu) and sr = a sinh(s) / sqrt(nu), ``[V, G]`` each (the
        native kernels' inputs, models/_native.c)."""
        const, root, half = _t_terms(self.nus)
        if idx is not None:
            const, root, half = const[idx], root[idx], half[idx]
        return const, half, torch.exp(-lam) * root, sh * root

    def _log1p_terms(self, z: torch.Tensor, boxes: torch.Tensor, sh: torch.Tensor, lam: torch.Tensor,
                     idx: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """log(1 + ((z - mu) / sigma)^2 / nu) for rows ``z [B]`` at the nodes ``[B, V, G, G]`` of the boxes
        of every nu (or the nus ``idx``), with that nu's log normaliser and (nu + 1) / 2 ``[V, 1]``.
        With mu = m + a sinh(s) e^lam, (z - mu) / sigma = (z - m) e^-lam - a sinh(s): two small
        factors, then one pass over the ``[B, V, G, G]`` terms each for the difference, square and
        log1p."""
        const, half, er, sr = self._factors(sh, lam, idx)
        scaled = (z[:, None, None] - boxes[None, :, 0:1]) * er[None]  # [B, V, G] (lambda)
        q = scaled[:, :, None, :] - sr[None, :, :, None]
        return q.square_().log1p_(), const, half

    def _log_lik_all(self, z: torch.Tensor, boxes: torch.Tensor, sh: torch.Tensor, lam: torch.Tensor,
                     idx: torch.Tensor | None = None, counts: torch.Tensor | None = None) -> torch.Tensor:
        """sum over rows ``z [B]`` (each ``counts [B]`` times: distinct values) of log t_nu(z; mu, e^lam)
        at the nodes of every nu's box (or those of the nus ``idx``): ``[V, G, G]``."""
        native = kernels()
        const, half, er, sr = self._factors(sh, lam, idx)
        if native is not None:
            m, er_, sr_ = boxes[:, 0].numpy(), er.numpy(), sr.numpy()
            if counts is None:
                sums = torch.from_numpy(native.t_loglik(z.numpy(), m, er_, sr_))
            else:  # the rows seen once in one kernel call, each value seen more often in one of its own
                zs, once = z.numpy(), (counts == 1).numpy()
                sums = torch.from_numpy(native.t_loglik(zs[once], m, er_, sr_)) if once.any() else 0.0
                for i in (~once).nonzero()[0].tolist():
                    sums = sums + float(counts[i]) * torch.from_numpy(native.t_loglik(zs[i : i + 1], m, er_, sr_))
        else:
            q, const, half = self._log1p_terms(z, boxes, sh, lam, idx)
            sums = q.sum(0) if counts is None else (counts[:, None, None, None] * q).sum(0)
        n = z.shape[0] if counts is None else float(counts.sum())
        return n * (const - lam)[:, None, :] - half[:, :, None] * sums

    @staticmethod
    def _fit_boxes(mu: torch.Tensor, lam: torch.Tensor, logw: torch.Tensor, logj: torch.Tensor,
                   span: float = SPAN, reach: float = 1.0) -> torch.Tensor:
        """Boxes ``[V, 6]`` of ``span`` posterior sds each side of each posterior's mean (``reach`` x
        that in u), from grids (``_nodes_all``'s lam [V, G], mu and log weight [V, G, G]; the log
        joints ``logj [V, G, G]``)."""
        v = logj.shape[0]
        p = torch.softmax((logw + logj).reshape(v, -1), 1).view_as(logj)
        lam3 = lam[:, None, :]
        em = (p * mu).sum((1, 2))
        el = (p * lam3).sum((1, 2))
        sl = (p * (lam3 - el[:, None, None]) ** 2).sum((1, 2)).clamp_min(1e-12).sqrt()
        u = (mu - em[:, None, None]) * torch.exp(-lam3)
        su = (p * u * u).sum((1, 2)).clamp_min(1e-24).sqrt()
        # the sinh scale: the core's width (a robust spread of u: its mean absolute value), at most su
        a = (torch.minimum((p * u.abs()).sum((1, 2)) * 1.2533, su) * CORE).clamp_min(1e-12)
        s_hi = torch.asinh(reach * span * su / a)
        return torch.stack([em, a, -s_hi, s_hi, el - span * sl, el + span * sl], 1)

    @staticmethod
    def _edges(logj: torch.Tensor, edge: float = EDGE) -> torch.Tensor:
        """``[V, 4]``: which sides (s_lo, s_hi, lam_lo, lam_hi) of each grid ``logj [V, G, G]`` have
        density within e^edge of its peak (nodes are descending, so index 0 is the high end)."""
        top = logj.amax((1, 2))[:, None]
        sides = torch.stack([logj[:, -1, :].amax(1), logj[:, 0, :].amax(1), logj[:, :, -1].amax(1),
                             logj[:, :, 0].amax(1)], 1)
        return sides > top + edge

    def _joint(self, idx: torch.Tensor | None, boxes: torch.Tensor, z: torch.Tensor, counts: torch.Tensor | None = None):
        """(lam [V, G], mu, log weight, log joint [V, G, G]) of the boxes ``[V, 6]`` of the nus ``idx``
        given the rows ``z`` (each ``counts`` times, if given)."""
        lam, sh, logw = self._nodes_all(boxes)
        mu = self._mu(boxes, sh, lam)
        logj = self._log_prior(mu, lam[:, None, :])
        if z.shape[0]:
            logj = logj + self._log_lik_all(z, boxes, sh, lam, idx, counts)
        return lam, mu, logw, logj

    def _fit(self, z: torch.Tensor, boxes: torch.Tensor, span: float = SPAN, counts: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every nu at once: boxes ``[V, 6]`` fitted to the posteriors given all rows ``z`` (kept
        rows; distinct values each ``counts`` times, if given), starting from ``boxes`` (one with scale
        <= 0: none yet), the log joints at their nodes ``[V, G, G]``, the log evidences log p(z) for
        each nu ``[V]`` (quadrature), and whether each box fits ``[V]``."""
        v = len(self.nus)
        # a box without a fit: around the rows, their median, log sigma near log sd
        med, sd = _median_sd(z, counts)
        lc = min(max(math.log(sd), -6.0), 700.0) if sd > 0 else 0.0
        start = torch.tensor([med, 1.0, -math.asinh(60.0), math.asinh(60.0), min(lc, 0.0) - 6.0, max(lc, 0.0) + 10.0],
                             dtype=torch.float64)
        box = torch.where(boxes[:, 1:2] > 0, boxes, start)
        # the posterior's mean and spread, from the box before, then from that fit, until the fit settles
        # (below: the centre moves under a tenth of the spread, the spreads by under 10 %): a grid fitted to the warm-up's 5 rows resolves the
        # posterior of a first chunk of 500 coarsely, and two passes left a box off its centre that no
        # widening fixed (a false ``quadrature_edge`` on 10 of 32 runs of Gaussian noise in chunks of
        # 500 and 1,000; none with up to ``ZOOMS`` passes). A settled pass keeps its own box, within
        # 10 % of its fit, and that box's evaluation goes on to the widening below (one pass fewer
        # than taking the fitted box: 4.6 -> 3.6 passes a refit on a /v1/detect of 864 rows)
        at_hand = None
        for _ in range(ZOOMS):
            lam, mu, logw, logj = self._joint(None, box, z, counts)
            new = self._fit_boxes(mu, lam, logw, logj, span, REACH if span == REGRID_SPAN else 1.0)
            # settled: the centre moved less than a tenth of the new spread, the spreads by under 10 %
            settled = bool(((new[:, 0] - box[:, 0]).abs() <= 0.1 * new[:, 1] * torch.sinh(new[:, 3])).all()
                           and ((new[:, 1] * torch.sinh(new[:, 3])) / (box[:, 1] * torch.sinh(box[:, 3])) - 1).abs().max() < 0.1
                           and ((new[:, 5] - new[:, 4]) / (box[:, 5] - box[:, 4]) - 1).abs().max() < 0.1)
            if settled:
                at_hand = lam, mu, logw, logj
                break
            box = new
        logjs = torch.empty(v, NODES, NODES, dtype=torch.float64)
        lzs = torch.empty(v, dtype=torch.float64)
        ok = torch.zeros(v, dtype=torch.bool)
        active = torch.arange(v)
        for _ in range(FITS):  # widen the sides the posterior still reaches (heavy tails, few rows)
            lam, mu, logw, logj = at_hand if at_hand is not None else self._joint(active, box[active], z, counts)
            at_hand = None
            edges = self._edges(logj)
            done = ~edges.any(1)
            fit = active[done]
            logjs[fit], lzs[fit], ok[fit] = logj[done], torch.logsumexp((logw + logj)[done].flatten(1), 1), True
            active, edges = active[~done], edges[~done].to(torch.float64)
            if not active.numel():
                return box, logjs, lzs, ok
            b = box[active]
            width = b[:, 5] - b[:, 4]
            b[:, 2] -= 1.5 * edges[:, 0]
            b[:, 3] += 1.5 * edges[:, 1]
            b[:, 4] -= 0.5 * width * edges[:, 2]
            b[:, 5] += 0.5 * width * edges[:, 3]
            box[active] = b
        # values far outside the frame (a posterior over dozens of orders of magnitude): the widest
        # box, and the caller reports it (``quadrature_edge``)
        lam, mu, logw, logj = self._joint(active, box[active], z, counts)
        logjs[active], lzs[active] = logj, torch.logsumexp((logw + logj).flatten(1), 1)
        return box, logjs, lzs, ok

    def _too_wide(self, box: torch.Tensor, logj: torch.Tensor, span: float, reach: float = 1.0) -> torch.Tensor | None:
        """The box ``span`` posterior sds wide, when the posterior has narrowed to half of ``box`` in
        a coordinate; else None."""
        lam, sh, logw = self._nodes_all(box[None])
        new = self._fit_boxes(self._mu(box[None], sh, lam), lam, logw, logj[None], span, reach)[0]
        old_l = float(box[5] - box[4])
        new_l = float(new[5] - new[4])
        # compare the u extents at the posterior's lambda: |u| reach a sinh(s_hi)
        reach_old = float(box[1]) * math.sinh(float(box[3] - box[2]) / 2)
        reach_new = float(new[1]) * math.sinh(float(new[3]))
        shift = abs(float(new[0]) - float(box[0])) * math.exp(-float((new[4] + new[5]) / 2))
        return new if (new_l < SHRINK * old_l or reach_new + shift < SHRINK * reach_old) else None

    def _regrid(self, nu: float, box: torch.Tensor, logj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Refit the box to a posterior that has narrowed to half of it in a coordinate, carrying the
        log joint to the new nodes by interpolation in the old box (points outside it, where the
        density is below e^EDGE of the peak, take the nearest boundary's value)."""
        new = self._too_wide(box, logj, REGRID_SPAN, REACH)
        if new is None:
            return box, logj
        new[4], new[5] = max(float(new[4]), float(box[4])), min(float(new[5]), float(box[5]))
        lam2, sh, _ = self._nodes_all(new[None])
        mu2, lam2 = self._mu(new[None], sh, lam2)[0], lam2[0]
        x, _, _ = _cheb(NODES)
        u_old = (mu2 - float(box[0])) * torch.exp(-lam2)[None, :] / float(box[1])
        s_old = torch.asinh(u_old)
        xs = ((2 * s_old - float(box[2] + box[3])) / float(box[3] - box[2])).clamp(-1, 1).flatten()
        xl = ((2 * lam2 - float(box[4] + box[5])) / float(box[5] - box[4])).clamp(-1, 1)
        ms = _interp_matrix(x, xs)  # [P, G]
        ml = _interp_matrix(x, xl)  # [G2, G]: lambda of the new columns
        p = mu2.shape[1]
        # value at new node (i, j): sum_ab ms[(i,j), a] logj[a, b] ml[j, b]
        tmp = ms @ logj  # [P, G]
        vals = (tmp.view(NODES, p, NODES) * ml[None, :, :]).sum(-1)
        return new, vals

    # --- exact updates ---------------------------------------------------------------------------
    def _refit_all(self, post: torch.Tensor, z: torch.Tensor, span: float = SPAN, counts: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """From all conditioned rows ``z`` (distinct values each ``counts`` times, if given): boxes, log
        joints (each nu's prior weight in it) and the total log evidence log p(z)."""
        boxes, _ = self._grids(post)
        log_v = math.log(len(self.nus))
        boxes, logjs, lzs, ok = self._fit(z, boxes, span, counts)
        if not bool(ok.all()):
            post[5] += 1
        return boxes, logjs - log_v, float(torch.logsumexp(lzs - log_v, 0))

    def exact_update(self, post: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, float]:
        if self.n_columns > 1:
            new, lp = zip(*(self._one.exact_update(p, rows[:, j : j + 1]) for j, p in enumerate(self._columns(post))))
            return torch.cat(new), float(sum(lp))
        post = post.clone()
        y = rows[:, 0]
        seen, k = int(post[0]), self.warmup
        o_warm, o_rows, _ = self._offsets()
        wbuf = post[o_warm:o_rows]
        kept = post[o_rows : o_rows + self._cap]
        first = 0
        if seen < k:  # warm-up: collect, and at its end fix the frame and condition on the rows
            first = min(k - seen, y.shape[0])
            wbuf[seen : seen + first] = y[:first]
            if seen + first == k:
                wbuf.copy_(_clean_warmup(wbuf))  # (a wild reading replaced, as the other models do)
                centre, scale = robust_frame(wbuf)
                post[1], post[2] = centre, scale
                z = (wbuf - centre) / scale
                boxes, logjs, lz = self._refit_all(post, z)
                kept[:k] = z
                post[3], post[4], post[6], post[7] = k, 1.0, lz, k
                self._store(post, boxes, logjs - lz)
        lp = 0.0
        if first < y.shape[0]:
            centre, scale = float(post[1]), float(post[2])
            z = (y[first:] - centre) / scale
            before = float(post[6])
            held = int(post[3])
            if int(post[4]):  # every conditioned row is at hand: kept (1), or as distinct values (2)
                last = False  # the rows are dropped after this: room to move
                if int(post[4]) == 1:
                    allz, counts = torch.cat([kept[:held], z]), None
                    if allz.shape[0] > self._cap:  # too many to keep one by one: as distinct values, if few
                        vals, many = _distinct(allz, torch.ones_like(allz))
                        last = vals.shape[0] > self._distinct_cap
                        if not last:
                            allz, counts = vals, many
                else:
                    d0 = self._distinct_cap
                    seen_z, each = torch.cat([kept[:held], z]), torch.cat([kept[d0 : d0 + held], torch.ones_like(z)])
                    vals, many = _distinct(seen_z, each)
                    last = vals.shape[0] > self._distinct_cap
                    # dropped: the kept values with their counts and the chunk's rows, each once (one kernel call)
                    allz, counts = (seen_z, each) if last else (vals, many)
                n_all = allz.shape[0] if counts is None else float(counts.sum())
                boxes, logjs = (t.clone() for t in self._grids(post))
                refit = last or held == 0 or bool((boxes[:, 1] <= 0).any()) or n_all >= REFIT * float(post[7])
                if not refit:  # the rows' log likelihood at the nodes, kept if the boxes still fit
                    lam, sh, logw = self._nodes_all(boxes)
                    logjs += self._log_lik_all(z, boxes, sh, lam)
                    lzs = torch.logsumexp((logw + logjs).flatten(1), 1)
                    gain = float(torch.logsumexp(lzs, 0))
                    logjs -= gain
                    lz = before + gain
                    refit = bool((self._edges(logjs).any(1) & (lzs - lzs.max() > EDGE)).any())
                if refit:  # a box fitted to the posterior and the log joint at its nodes, from all rows
                    boxes, logjs, lz = self._refit_all(post, allz, REGRID_SPAN if last else SPAN, counts)
                    logjs = logjs - lz
                    post[7] = n_all
                if last:
                    kept.zero_()
                    post[3], post[4], post[7] = 0, 0.0, seen + y.shape[0]
                elif counts is None:
                    kept[: allz.shape[0]] = allz
                    post[3] = allz.shape[0]
                else:
                    d, d0 = allz.shape[0], self._distinct_cap
                    kept.zero_()
                    kept[:d], kept[d0 : d0 + d] = allz, counts
                    post[3], post[4] = d, 2.0
            else:  # add the rows' log likelihood at the nodes
                boxes, logjs = (t.clone() for t in self._grids(post))
                lam, sh, logw = self._nodes_all(boxes)
                logjs += self._log_lik_all(z, boxes, sh, lam)
                lzs = torch.logsumexp((logw + logjs).flatten(1), 1)  # [V]
                gain = float(torch.logsumexp(lzs, 0))
                lz = before + gain
                logjs -= gain
                # the edge: a side of a box within e^WARN of its peak, for a nu that carries weight
                if bool((self._edges(logjs, WARN).any(1) & (lzs - lzs.max() > WARN)).any()):
                    post[5] += 1
                n_now = seen + y.shape[0]
                if n_now >= RECHECK * float(post[7]):
                    post[7] = n_now
                    for i, nu in enumerate(self.nus):
                        boxes[i], logjs[i] = self._regrid(nu, boxes[i], logjs[i])
            if not math.isfinite(lz):
                raise ModelError(f"{self.name}: the evidence is not finite: values too far from the frame (centre "
                                 f"{centre:.6g}, scale {scale:.6g}) for float64, up to {float(y.abs().max()):.6g}")
            lp = lz - before - z.shape[0] * math.log(scale)
            post[6] = lz
            self._store(post, boxes, logjs)
        post[0] = seen + y.shape[0]
        return post, lp

    def exact_skip(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        """``Model.exact_skip``: the rows are i.i.d. given (mu, sigma, nu), so the posterior (grids,
        kept rows) stays as it is and only the count of rows seen goes on (in every column). A
        heavy tail already discounts one wild reading, but a burst of them, or one far enough out,
        still moves the scale, and the model that skipped them predicts the rows after better.
        None inside the warm-up (no frame yet)."""
        if int(post[0]) < self.warmup:
            return None
        new = post.clone()
        self._columns(new)[:, 0] += int(rows.shape[0])
        return new

    def _store(self, post: torch.Tensor, boxes: torch.Tensor, logjs: torch.Tensor) -> None:
        b, l = self._grids(post)
        b.copy_(boxes)
        l.copy_(logjs)

    def exact_layout(self, post: torch.Tensor) -> int:
        """2 while the kept rows are distinct values with counts (``post[4]`` = 2; in any column),
        which a release before them would read as rows: its state is then written as layout 2,
        which such a release refuses as a state it cannot read (``service.sgais.exact.EXACT_LAYOUTS``).
        (A release before several columns refuses such a model when it builds it.)"""
        return 2 if bool((self._columns(post)[:, 4] == 2).any()) else 1

    def exact_warnings(self, before: torch.Tensor, after: torch.Tensor) -> tuple[str, ...]:
        """``quadrature_edge`` when this update found the posterior at its box's edge (in a column)."""
        return ("quadrature_edge",) if bool((self._columns(after)[:, 5] > self._columns(before)[:, 5]).any()) else ()

    def exact_row_log_predictive(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Each row's one-step predictive given ``post`` (summed over the columns); 0 during the warm-up."""
        if self.n_columns > 1:
            return sum(self._one.exact_row_log_predictive(p, rows[:, j : j + 1]) for j, p in enumerate(self._columns(post)))
        if int(post[0]) < self.warmup:
            return torch.zeros(rows.shape[0], dtype=torch.float64)
        centre, scale = float(post[1]), float(post[2])
        z = (rows[:, 0] - centre) / scale
        boxes, logjs = self._grids(post)
        lam, sh, logw = self._nodes_all(boxes)
        native = kernels()
        if native is not None:
            const, half, er, sr = self._factors(sh, lam, None)
            base = logw + logjs + (const - lam)[:, None, :]
            lse = native.t_row_lse(z.numpy(), boxes[:, 0].numpy(), er.numpy(), sr.numpy(), half[:, 0].numpy(), base.numpy())
            return torch.from_numpy(lse) - math.log(scale)
        q, const, half = self._log1p_terms(z, boxes, sh, lam, None)
        ll = (const - lam)[None, :, None, :] - half[None, :, :, None] * q  # [B, V, G, G]
        return torch.logsumexp(((logw + logjs)[None] + ll).flatten(1), 1) - math.log(scale)

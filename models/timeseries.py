"""Models for real metric series, with exact evidence: regressions of a univariate series on its
own past, its time index and seasonal terms (``level``, ``ar``, ``trend``, ``seasonal``), and
Poisson counts (``poisson``).

All of them are conjugate and run with the exact method only (``service/sgais/exact.py``).

**Units.** Real metrics come in any units (latency in ms around 250, prices around 3e4, rates
of 1e-4). A fixed prior cannot be vague in every unit, so these models fix their reference
frame from their first ``warmup`` observations: the regressions standardise the series with
the warm-up rows' mean and standard deviation, z = (y - centre) / scale, and put a fixed prior
on the model of z (coefficients ~ N(0, s2 coef_scale^2), s2 ~ InvGamma(alpha0, beta0)); Poisson
counts need no frame. The warm-up rows are then *conditioned on*, not scored: they update the
posterior, and the evidence is the partial (training-sample) evidence

    log p(y_{k+1..n} | y_1..k) = log p(z_{k+1..n} | z_1..k) - (n - k) log scale,

exact, and equivariant: y -> a y + b changes it by -(n - k) log|a| and nothing else. Models of
one stream with the same ``warmup`` condition on the same rows, so their evidences compare
(posterior model probabilities); ChunkResult.conditioned says how many rows of a chunk were
conditioned on. A restart at a change point (the detector's challengers) warms up again on its
first rows, in the new regime's own units.

**Regressions.** y_t = phi_t . beta + e_t with e_t ~ N(0, s2), the Normal-Inverse-Gamma prior
above, and phi_t = (1, t if ``trend``, sin/cos(2 pi h t / period) for h = 1..``harmonics`` if
``period``, z_{t-1}..z_{t-order}); t counts observations from the model's start, and lags
before the start are 0 (the warm-up mean). The posterior is kept as a square-root information
filter (R, z = R m, with R^T R the coefficients' precision over s2) plus (a, b) of s2: a
chunk is stacked under [R | z] and triangularised by QR, its residual e^2 adds to b, and

    log p(chunk | past) = lgamma(a') - lgamma(a) + a log b - a' log b' + log det R - log det R'
                          - B/2 log 2 pi.

**Counts.** ``poisson``: each column y ~ Poisson(rate), rate ~ Gamma(alpha0, beta0) (rate
parameterisation), negative-binomial predictive; the warm-up rows only sharpen the prior.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from models.base import LOG_2PI, Model, ModelError


def _check_warmup(name: str, warmup: int, least: int) -> None:
    if not (isinstance(warmup, int) and least <= warmup <= 10_000):
        raise ModelError(f"{name}: warmup must be an integer in [{least}, 10000], got {warmup!r}")


def _check_positive(name: str, key: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise ModelError(f"{name}: {key} must be a positive number, got {value!r}")


class _Exact(Model):
    """Exact-only models: no particles, so the SGAIS functions are not there."""

    conjugate: ClassVar[bool] = True
    exact_only: ClassVar[bool] = True
    warmup: int

    def sample_prior(self, generator, n):  # pragma: no cover - exact only
        raise ModelError(f"model {self.name!r} runs with the exact method only")

    log_prior = log_likelihood = sample_prior

    def exact_conditioned(self, post: torch.Tensor, rows: int) -> int:
        """How many of the next ``rows`` observations are warm-up, conditioned on and not scored."""
        return max(0, min(rows, self.warmup - int(post[0])))


@dataclass(frozen=True)
class TimeSeriesRegression(_Exact):
    """A univariate series regressed on its past, time and seasonal terms (module docstring).
    ``post`` = (seen, centre, scale, warm-up buffer [warmup], lags [order], a, b, R [D*D], z [D])."""

    name = "ts"
    order: int = 0
    trend: int = 0
    period: float = 0.0
    harmonics: int = 1
    warmup: int = 5
    coef_scale: float = 10.0
    alpha0: float = 1.0
    beta0: float = 1.0

    def __post_init__(self) -> None:
        n = self.name
        if self.n_columns != 1:
            raise ModelError(f"{n} models one column (a univariate series), the stream has {self.n_columns}: "
                             "give the stream one column, or use gaussian or gmm for several")
        if not (isinstance(self.order, int) and 0 <= self.order <= 64):
            raise ModelError(f"{n}: order must be an integer in [0, 64], got {self.order!r}")
        if self.trend not in (0, 1):
            raise ModelError(f"{n}: trend must be 0 or 1, got {self.trend!r}")
        if not (math.isfinite(self.period) and (self.period == 0 or self.period >= 2)):
            raise ModelError(f"{n}: period must be 0 (none) or at least 2 observations, got {self.period!r}")
        if not (isinstance(self.harmonics, int) and 1 <= self.harmonics <= 32 and 2 * self.harmonics <= max(self.period, 2)):
            raise ModelError(f"{n}: harmonics must be an integer in [1, 32] and at most period / 2, got {self.harmonics!r}")
        _check_warmup(n, self.warmup, 2)
        for key in ("coef_scale", "alpha0", "beta0"):
            _check_positive(n, key, getattr(self, key))

    # --- shape -------------------------------------------------------------------------------
    @property
    def n_coef(self) -> int:
        return 1 + self.trend + (2 * self.harmonics if self.period else 0) + self.order

    @property
    def dim(self) -> int:
        return self.n_coef + 1  # coefficients and the noise variance

    def parameter_names(self) -> list[str]:
        names = ["intercept"] + (["slope"] if self.trend else [])
        if self.period:
            names += [f"{f}[{h}]" for h in range(1, self.harmonics + 1) for f in ("sin", "cos")]
        return names + [f"ar[{i}]" for i in range(1, self.order + 1)] + ["noise_var"]

    def featurize(self, data: torch.Tensor) -> torch.Tensor:
        self.check_width(data)
        return data.to(torch.float64)

    # --- posterior layout ----------------------------------------------------------------------
    def _parts(self, post: torch.Tensor) -> dict[str, torch.Tensor]:
        k, p, d = self.warmup, self.order, self.n_coef
        o = 3
        parts = {"buf": post[o : o + k]}
        o += k
        parts["lags"] = post[o : o + p]
        o += p
        parts["ab"] = post[o : o + 2]
        o += 2
        parts["r"] = post[o : o + d * d].view(d, d)
        parts["z"] = post[o + d * d : o + d * d + d]
        return parts

    def exact_init(self) -> torch.Tensor:
        d = self.n_coef
        head = torch.zeros(3 + self.warmup + self.order, dtype=torch.float64)
        ab = torch.tensor([self.alpha0, self.beta0], dtype=torch.float64)
        r = torch.eye(d, dtype=torch.float64) / self.coef_scale
        return torch.cat([head, ab, r.flatten(), torch.zeros(d, dtype=torch.float64)])

    def exact_restart(self, post: torch.Tensor) -> torch.Tensor:
        """A restart at a change point keeps the incumbent's frame, fixed from data before the
        change, and so needs no warm-up of its own: it is scored from its first row, under the
        prior in the old regime's units (a new level within a few old standard deviations is
        likely, one 1e6 away is not). Its lags start at 0 (the old centre), its time at 0. During
        the incumbent's own warm-up there is no frame yet: the prior, with a warm-up."""
        new = self.exact_init()
        if int(post[0]) >= self.warmup:
            new[0], new[1], new[2] = float(self.warmup), post[1], post[2]
        return new

    def exact_shift(self, post: torch.Tensor) -> torch.Tensor | None:
        """A restart at a level shift: the series' level jumps to a new value and everything else
        holds. The posterior ``post`` (the incumbent's, given the rows before the change) with the
        intercept's information replaced by its prior, N(0, s2 coef_scale^2) in the frame, drawn
        afresh: the slope, the seasonal terms, the lags' coefficients and the noise variance keep
        what the old regime taught, and the lags and the time index go on. Exact: the intercept
        is the first coefficient, so the marginal posterior of the others is the lower-right block
        of the square-root information R (and of z), and (a, b) of the noise variance are those of
        the joint posterior. The detector compares it after one training row, its one new
        parameter (``service.detect.detector.SHIFT_TRAIN``). None during the warm-up (no frame
        yet)."""
        if int(post[0]) < self.warmup:
            return None
        new = post.clone()
        parts = self._parts(new)  # views into ``new``
        parts["r"][0] = 0.0  # R is upper triangular: its first row is all the intercept's information
        parts["r"][0, 0] = 1.0 / self.coef_scale
        parts["z"][0] = 0.0
        return new

    def frame(self, post: torch.Tensor) -> tuple[float, float] | None:
        """(centre, scale) of the reference frame, None during the warm-up."""
        return (float(post[1]), float(post[2])) if int(post[0]) >= self.warmup else None

    # --- features ----------------------------------------------------------------------------
    def _design(self, z: torch.Tensor, lags: torch.Tensor, t0: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Features ``[B, D]`` of standardised values ``z [B]`` whose predecessors' last ``order``
        values are ``lags`` (oldest first), the first at time ``t0``; and the lags after them."""
        b, p = z.shape[0], self.order
        t = torch.arange(t0, t0 + b, dtype=torch.float64)
        cols = [torch.ones(b, dtype=torch.float64)]
        if self.trend:
            cols.append(t)
        if self.period:
            for h in range(1, self.harmonics + 1):
                angle = (2.0 * math.pi * h / self.period) * t
                cols += [torch.sin(angle), torch.cos(angle)]
        seq = torch.cat([lags, z])
        cols += [seq[p - i - 1 : p - i - 1 + b] for i in range(p)]  # lag i + 1 of each row
        return torch.stack(cols, dim=1), seq[len(seq) - p :]

    # --- exact updates -----------------------------------------------------------------------
    def exact_update(self, post: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, float]:
        parts = self._parts(post)
        y = rows[:, 0]
        seen, k = int(post[0]), self.warmup
        centre, scale = float(post[1]), float(post[2])
        buf = parts["buf"].clone()
        lags, (a, b), r, zc = parts["lags"], parts["ab"], parts["r"], parts["z"]
        first = 0
        if seen < k:  # warm-up: collect, and at its end fix the frame and condition on the rows
            first = min(k - seen, y.shape[0])
            buf[seen : seen + first] = y[:first]
            if seen + first == k:
                centre = float(buf[0] + (buf - buf[0]).mean())
                sd = float(torch.sqrt(((buf - centre) ** 2).sum() / (k - 1)))
                scale = sd if sd > 0 else (abs(centre) if centre != 0 else 1.0)
                phi, lags = self._design((buf - centre) / scale, lags, 0)
                r, zc, a, b, _ = _srif_nig(r, zc, a, b, phi, (buf - centre) / scale)
        lp = 0.0
        if first < y.shape[0]:
            zv = (y[first:] - centre) / scale
            phi, lags = self._design(zv, lags, seen + first)
            r, zc, a, b, lp = _srif_nig(r, zc, a, b, phi, zv)
            lp -= zv.shape[0] * math.log(scale)
        head = torch.tensor([seen + y.shape[0], centre, scale], dtype=torch.float64)
        new = torch.cat([head, buf, lags, torch.stack([a, b]), r.flatten(), zc])
        return new, lp

    def exact_row_log_predictive(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Each row's one-step Student-t predictive given ``post`` (no update between rows; an
        autoregression reads the rows before it as its lags); 0 during the warm-up."""
        fr = self.frame(post)
        if fr is None:
            return torch.zeros(rows.shape[0], dtype=torch.float64)
        centre, scale = fr
        parts = self._parts(post)
        a, b = parts["ab"]
        zv = (rows[:, 0] - centre) / scale
        phi, _ = self._design(zv, parts["lags"], int(post[0]))
        m = torch.linalg.solve_triangular(parts["r"], parts["z"][:, None], upper=True)[:, 0]
        u = torch.linalg.solve_triangular(parts["r"].T, phi.T, upper=False)
        var = (b / a) * (1.0 + (u * u).sum(0))
        nu = 2.0 * a
        q = (zv - phi @ m) ** 2 / var
        return (torch.lgamma((nu + 1) / 2) - torch.lgamma(nu / 2) - 0.5 * torch.log(nu * math.pi * var)
                - (nu + 1) / 2 * torch.log1p(q / nu) - math.log(scale))


def _srif_nig(r, z, a, b, phi, y):
    """One block of the Normal-Inverse-Gamma regression: (R', z', a', b', log p(y | past))."""
    d = r.shape[0]
    tri = torch.linalg.qr(torch.cat([torch.cat([r, z[:, None]], 1), torch.cat([phi, y[:, None]], 1)]), mode="r").R
    r2, z2, e = tri[:d, :d], tri[:d, d], tri[d, d]  # at least one row of y: tri is [D+1, D+1]
    n = y.shape[0]
    a2, b2 = a + 0.5 * n, b + 0.5 * e * e
    logdet = torch.log(torch.abs(torch.diagonal(r))).sum() - torch.log(torch.abs(torch.diagonal(r2))).sum()
    lp = (torch.lgamma(a2) - torch.lgamma(a) + a * torch.log(b) - a2 * torch.log(b2) + logdet - 0.5 * n * LOG_2PI)
    return r2, z2, a2, b2, float(lp)


@dataclass(frozen=True)
class Level(TimeSeriesRegression):
    """A constant level with Gaussian noise, in the series' own frame (no trend, no season, no lags)."""

    name = "level"


@dataclass(frozen=True)
class Autoregressive(TimeSeriesRegression):
    """AR(order): the level plus the last ``order`` values (default 1)."""

    name = "ar"
    order: int = 1


@dataclass(frozen=True)
class Trend(TimeSeriesRegression):
    """A linear trend in time (level and slope) with Gaussian noise; ``order`` adds AR lags."""

    name = "trend"
    trend: int = 1


@dataclass(frozen=True)
class Seasonal(TimeSeriesRegression):
    """A level plus ``harmonics`` Fourier terms of ``period`` observations (required); ``trend`` and
    ``order`` add a slope and AR lags."""

    name = "seasonal"
    period: float = 0.0
    harmonics: int = 2

    def __post_init__(self) -> None:
        if not self.period:
            raise ModelError("seasonal: give its period in observations, e.g. seasonal:period=24")
        super().__post_init__()


@dataclass(frozen=True)
class Poisson(_Exact):
    """Counts: each column ~ Poisson(rate), rate ~ Gamma(alpha0, beta0) (beta0 a rate), independent
    columns. ``post`` = (seen, a [C], b [C]); the first ``warmup`` rows sharpen the prior and are
    not scored (module docstring)."""

    name = "poisson"
    warmup: int = 5
    alpha0: float = 1.0
    beta0: float = 0.01

    def __post_init__(self) -> None:
        _check_warmup(self.name, self.warmup, 0)
        for key in ("alpha0", "beta0"):
            _check_positive(self.name, key, getattr(self, key))

    @property
    def dim(self) -> int:
        return self.n_columns

    def parameter_names(self) -> list[str]:
        return [f"rate[{j}]" for j in range(self.n_columns)]

    def featurize(self, data: torch.Tensor) -> torch.Tensor:
        self.check_width(data)
        y = data.to(torch.float64)
        bad = ~torch.isfinite(y) | (y < 0) | (y != torch.round(y)) | (y > 2**53)
        if bool(bad.any()):
            i, j = (int(v) for v in torch.nonzero(bad)[0])
            raise ModelError(f"poisson: counts must be whole numbers >= 0; row {i}, column {j} has {float(y[i, j])!r}")
        return y

    def exact_init(self) -> torch.Tensor:
        c = self.n_columns
        return torch.cat([torch.zeros(1, dtype=torch.float64), torch.full((c,), float(self.alpha0), dtype=torch.float64),
                          torch.full((c,), float(self.beta0), dtype=torch.float64)])

    def exact_update(self, post: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, float]:
        c = self.n_columns
        a, b = post[1 : 1 + c], post[1 + c :]
        skip = self.exact_conditioned(post, rows.shape[0])
        if skip:
            a, b = a + rows[:skip].sum(0), b + skip
        scored = rows[skip:]
        n, s = scored.shape[0], scored.sum(0)
        lp = 0.0
        if n:
            lp = float((torch.lgamma(a + s) - torch.lgamma(a) + a * torch.log(b) - (a + s) * torch.log(b + n)).sum()
                       - torch.lgamma(scored + 1.0).sum())
        seen = torch.tensor([float(post[0]) + rows.shape[0]], dtype=torch.float64)
        return torch.cat([seen, a + s, b + n]), lp

    def exact_restart(self, post: torch.Tensor) -> torch.Tensor:
        """A restart at a change point: one pseudo-observation at the incumbent's mean rate (the
        new rate's prior in the old one's units), no warm-up of its own."""
        c = self.n_columns
        new = self.exact_init()
        if int(post[0]) >= self.warmup:
            rate = post[1 : 1 + c] / post[1 + c :]
            new[0], new[1 : 1 + c], new[1 + c :] = float(self.warmup), rate, 1.0
        return new

    def exact_row_log_predictive(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        c = self.n_columns
        a, b = post[1 : 1 + c], post[1 + c :]
        return (torch.lgamma(a + rows) - torch.lgamma(a) - torch.lgamma(rows + 1.0) + a * torch.log(b / (b + 1.0))
                - rows * torch.log(b + 1.0)).sum(-1)

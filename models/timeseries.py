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
from functools import lru_cache
from typing import ClassVar

import numpy as np
import torch

from models.base import LOG_2PI, Model, ModelError, check_counts
from models.native import kernels


def skip_counted(post: torch.Tensor, rows: torch.Tensor, warmup: int) -> torch.Tensor | None:
    """``Model.exact_skip`` of an exchangeable model whose ``post[0]`` counts its rows (for its
    warm-up): the posterior stays and the count goes on; None inside the warm-up, whose rows fix
    the frame."""
    if int(post[0]) < warmup:
        return None
    new = post.clone()
    new[0] += rows.shape[0]
    return new


def _check_warmup(name: str, warmup: int, least: int) -> None:
    if not (isinstance(warmup, int) and least <= warmup <= 10_000):
        raise ModelError(f"{name}: warmup must be an integer in [{least}, 10000], got {warmup!r}")


def _check_positive(name: str, key: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise ModelError(f"{name}: {key} must be a positive number, got {value!r}")


#: the prior settings of the models in a frame (coefficient scale, the noise variance's
#: InvGamma(alpha0, beta0)) are in standardised units: beyond these bounds the evidence loses its
#: digits (lgamma(alpha0 + n/2) - lgamma(alpha0) cancels: 0.04 nats off at 1e13) or overflows
FRAME_PRIOR_RANGE = (1e-6, 1e6)


def _check_frame_prior(name: str, model) -> None:
    lo, hi = FRAME_PRIOR_RANGE
    for key in ("coef_scale", "alpha0", "beta0"):
        value = getattr(model, key)
        _check_positive(name, key, value)
        if not lo <= value <= hi:
            raise ModelError(f"{name}: {key} is in the series' standardised units and must be in [{lo:g}, {hi:g}], "
                             f"got {value!r}")


def _check_one_column(name: str, n_columns: int) -> None:
    if n_columns != 1:
        raise ModelError(f"{name} models one column (a univariate series), the stream has {n_columns}: "
                         "give the stream one column, or use gaussian or gmm for several")


def _check_finite(name: str, y: torch.Tensor) -> torch.Tensor:
    """``y`` itself, or a ModelError naming the first value that is not a finite number."""
    if not y.requires_grad and bool(np.isfinite(y.numpy()).all()):  # (numpy: a few us less a row, point by point)
        return y
    bad = ~torch.isfinite(y)
    if bool(bad.any()):
        i, j = (int(v) for v in torch.nonzero(bad)[0])
        raise ModelError(f"{name}: values must be finite numbers; row {i}, column {j} has {float(y[i, j])!r}", row=i, column=j)
    return y


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


#: a warm-up without spread (every row equal) whose values have more digits than ``_resolution``
#: reads takes this fraction of |its value| as its unit (``flat_unit``)
FLAT_UNIT = 0.1


def _resolution(values: list[float]) -> float:
    """The step the values are recorded in: 1 when all are integers (round thousands too), 0.1 with
    one decimal (0.1 + 0.2's float noise is not a digit), ..., down to 1e-12; 0 when they carry
    more digits than that, or more than float64 resolves (10^15 steps)."""
    for k in range(13):
        xs = [v * 10.0 ** k for v in values]
        if any(abs(x) >= 1e15 for x in xs):
            break
        if all(abs(x - round(x)) <= 1e-6 + 1e-15 * abs(x) and (round(x) != 0 or x == 0) for x in xs):
            return 10.0 ** -k  # (a value that rounds to 0 at this step is not recorded in it: 3e-7 is 3 x 1e-7)
    return 0.0


def flat_unit(centre: float, values: list[float]) -> float:
    """The unit of a warm-up without spread (its rows all ``centre``, or so close that their
    squared deviations underflow): the step the values are recorded in (1 for integers, so 1 for
    zeros; 0.01 for 0.25), never more than |centre|; where the values carry more digits than a
    step can be read from, a tenth of |centre|.

    Why: a flat warm-up has no spread to take a unit from, and the unit sets how much noise the
    prior expects (s2 ~ InvGamma(alpha0, beta0) in units^2), which fades only like 1 / rows.
    The unit was |centre|: a gauge flat at 5 then 6 was a step of 0.2 units, inside the prior's
    noise, and not found (a new user, 2026-11-28), and integer readings flat for the warm-up and
    then 45 +- 0.7 had their noise taken for 7x too large for hundreds of rows, so a +3 shift was
    missed. A tenth of the value found those but not 86400 -> 86401 or 1000 -> 1001 (a second
    trial the same day); the recorded step finds all of them, and integers that flicker by one
    after a flat warm-up (2 +- 0.45, 45 +- 0.7, 86400 +- 0.45, 1000 +- 2) give no change
    (tests/test_timeseries.py)."""
    step = _resolution(values)
    if centre == 0:
        return step
    return min(step, abs(centre)) if step > 0 else FLAT_UNIT * abs(centre)


#: a warm-up row this many sds of the other warm-up rows from their mean is a wild reading
#: (``_clean_warmup``): for five Gaussian rows 1 stream in 500 has one that far by chance, for
#: Student-t(3) rows 1 in 130, for lognormal(0, 1) rows 1 in 25 (its long right tail)
WARMUP_OUTLIER_SDS = 20.0


def _clean_warmup(buf: torch.Tensor) -> torch.Tensor:
    """The warm-up rows ``buf [W]`` the models fix their frame from and condition on, with wild
    ones replaced by the median of the others: the row farthest from the mean of the others, in
    their sd, if beyond ``WARMUP_OUTLIER_SDS``, then the next among the rest, up to max(1, W // 20)
    rows and while 3 others remain. The warm-up's rows are conditioned on and never scored, so the
    detector could neither report nor take out a reading there, and one spike among the first
    five (a cold start: 2,500 among 250 +- 20 ms) widened the frame 50-fold and the noise the
    models expect until a restart won: a change at the warm-up's end on every model of the default
    portfolio, point by point and in chunks (README, "Outliers"). The same rule for every model
    with a warm-up of its own, so a stream's models condition on the same rows. Unchanged where
    the others do not vary (a gauge of a few values: no spread to measure against) and where no
    row is that far. (Two spikes in five hide each other: the other's spread is wide.)"""
    keep = torch.ones(buf.shape[0], dtype=torch.bool)
    out = buf
    for _ in range(max(1, buf.shape[0] // 20)):
        idx = torch.nonzero(keep).flatten()
        m = idx.shape[0]
        if m < 4:
            break
        x = buf[idx]
        c = x - x.mean()
        # each row against the others: their mean and (m - 2)-dof variance, by removing it from the sums
        ss = (c * c).sum()
        var = (ss - c * c * m / (m - 1)) / (m - 2)
        # (others that do not vary, to rounding: no spread to measure against)
        spread = var > 1e-9 * ss / (m - 1)
        z = torch.where(spread, c.abs() * m / (m - 1) / var.clamp_min(1e-300).sqrt(), torch.zeros_like(c))
        i = int(torch.argmax(z))
        if not float(z[i]) > WARMUP_OUTLIER_SDS:
            break
        keep[idx[i]] = False
        out = out.clone() if out is buf else out
        out[idx[i]] = buf[keep].quantile(0.5)
    return out


def _warmup_frame(buf: torch.Tensor) -> tuple[float, float]:
    """(centre, scale) of the frame from the warm-up rows ``buf``: their mean and standard deviation
    (n - 1); a constant warm-up takes ``flat_unit`` as its scale."""
    centre = float(buf[0] + (buf - buf[0]).mean())
    sd = float(torch.sqrt(((buf - centre) ** 2).sum() / (buf.shape[0] - 1)))
    return centre, sd if sd > 0 else flat_unit(centre, buf.tolist())


class _Framed(_Exact):
    """A univariate exact model in a frame fixed by its warm-up (module docstring): ``post`` starts
    (seen, centre, scale)."""

    def featurize(self, data: torch.Tensor) -> torch.Tensor:
        self.check_width(data)
        return _check_finite(self.name, data.to(torch.float64))

    def frame(self, post: torch.Tensor) -> tuple[float, float] | None:
        """(centre, scale) of the reference frame, None during the warm-up."""
        return (float(post[1]), float(post[2])) if int(post[0]) >= self.warmup else None

    def _warm(self, post: torch.Tensor, y: list[float]) -> tuple[int, float, float, list[float], int, bool]:
        """For a chunk's values ``y``: (rows seen before it, centre, scale, the warm-up buffer, the index
        of its first row after the warm-up, whether the warm-up ended in it). The warm-up's rows are
        collected, and when they are complete the frame is fixed from them (the caller then
        conditions on the buffer)."""
        k = self.warmup
        head = post[:3].tolist()
        seen, centre, scale = int(head[0]), head[1], head[2]
        buf = post[3 : 3 + k].tolist()
        first, ended = 0, False
        if seen < k:
            first = min(k - seen, len(y))
            buf[seen : seen + first] = y[:first]
            if seen + first == k:  # (the rows kept: a wild one replaced, ``_clean_warmup``)
                clean = _clean_warmup(torch.tensor(buf, dtype=torch.float64))
                centre, scale = _warmup_frame(clean)
                buf, ended = clean.tolist(), True
        return seen, centre, scale, buf, first, ended


@dataclass(frozen=True)
class TimeSeriesRegression(_Framed):
    """A univariate series regressed on its past, time and seasonal terms (module docstring).
    ``post`` = (seen, centre, scale, warm-up buffer [warmup], lags [order], then per component
    (``_components``; one, except ``seasonal`` without a period): log weights [K] (only where
    K > 1), (a, b) [K, 2], R [K, D, D], z [K, D]); with one component the layout it always had."""

    name = "ts"
    order: int = 0
    trend: int = 0
    period: float = 0.0
    harmonics: int = 1
    warmup: int = 5
    coef_scale: float = 10.0
    alpha0: float = 1.0
    beta0: float = 1.0

    #: settings of the family that this model does not take (each would make it another model:
    #: ``level:trend=1`` is ``trend``), each with the model that has it
    not_taken: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        n = self.name
        _check_one_column(n, self.n_columns)
        for key, other in self.not_taken.items():
            if getattr(self, key) != type(self).__dataclass_fields__[key].default:
                raise ModelError(f"{n}: no setting {key!r} (that is {other})")
        if not (isinstance(self.order, int) and 0 <= self.order <= 64):
            raise ModelError(f"{n}: order must be an integer in [0, 64], got {self.order!r}")
        if self.trend not in (0, 1):
            raise ModelError(f"{n}: trend must be 0 or 1, got {self.trend!r}")
        if not (math.isfinite(self.period) and (self.period == 0 or self.period >= 2)):
            raise ModelError(f"{n}: period must be 0 (none) or at least 2 observations, got {self.period!r}")
        self._check_harmonics()
        _check_warmup(n, self.warmup, 2)
        _check_frame_prior(n, self)

    def _check_harmonics(self) -> None:
        if not (isinstance(self.harmonics, int) and 1 <= self.harmonics <= 32 and 2 * self.harmonics <= max(self.period, 2)):
            raise ModelError(f"{self.name}: harmonics must be an integer in [1, 32] and at most period / 2, "
                             f"got {self.harmonics!r}")

    # --- shape -------------------------------------------------------------------------------
    def _components(self) -> tuple[tuple[tuple[float, int], ...], ...]:
        """The seasons of each component of the model, each season (period, harmonics): one
        component, of one season (``period``, ``harmonics``) ((0, 0) without one), but ``seasonal``
        without a period has one per candidate period (and with ``pairs=1`` one per calendar pair
        of periods, a daily cycle within a weekly one: two seasons at once). The components share the
        frame, the lags and the data; each has its own posterior (R, z, a, b), updated together in one batched QR."""
        return (((float(self.period), self.harmonics if self.period else 0),),)

    def _harmonics(self, count: int | None = None) -> int:
        """The most harmonics (summed over a component's seasons) among the first ``count``
        components (None: all of them)."""
        return max(sum(h for _, h in comp) for comp in self._components()[:count])

    @property
    def n_coef(self) -> int:
        return self._width()

    @property
    def dim(self) -> int:
        return self.n_coef + 1  # coefficients and the noise variance

    def parameter_names(self) -> list[str]:
        names = ["intercept"] + (["slope"] if self.trend else [])
        names += [f"{f}[{h}]" for h in range(1, self._harmonics() + 1) for f in ("sin", "cos")]
        return names + [f"ar[{i}]" for i in range(1, self.order + 1)] + ["noise_var"]

    # --- posterior layout ----------------------------------------------------------------------
    #: component counts of earlier versions' states that this model still reads: a stream whose
    #: state was saved with fewer components (``seasonal`` before its operational periods) goes on
    #: with that many, the first of ``_components``, bit for bit as before, restarts included
    legacy_components: ClassVar[tuple[int, ...]] = ()

    def _width(self, c: int | None = None) -> int:
        """Coefficients of a state with the first ``c`` components (None: all; their most harmonics set it)."""
        return 1 + self.trend + 2 * self._harmonics(c) + self.order

    def _size(self, c: int) -> int:
        """The length of a state with the first ``c`` components."""
        return self._offsets(c)[4] + c * self._width(c)

    def _count(self, post: torch.Tensor) -> int:
        """The components of the state ``post``: this version's, or a legacy layout's."""
        c = len(self._components())
        for n in (c,) + self.legacy_components:
            if post.numel() == self._size(n):
                return n
        raise ModelError(f"{self.name}: a state of {post.numel()} numbers is not this model's ({self._size(c)}): "
                         "saved by another model or version")

    def _offsets(self, c: int) -> tuple[int, int, int, int, int]:
        """Where the pieces of a state with ``c`` components start (``_parts``): (lags, logw, ab,
        r, z); buf starts at 3, logw is there only with several components."""
        d, o_lags = self._width(c), 3 + self.warmup
        o_w = o_lags + self.order
        o_ab = o_w + (c if c > 1 else 0)
        o_r = o_ab + 2 * c
        return o_lags, o_w, o_ab, o_r, o_r + c * d * d

    def _parts(self, post: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views into ``post``: buf [warmup], lags [order], logw [K] (only with several components:
        their posterior log weights), ab [K, 2], r [K, D, D], z [K, D]."""
        c = self._count(post)
        d = self._width(c)
        o_lags, o_w, o_ab, o_r, o_z = self._offsets(c)
        parts = {"buf": post[3:o_lags], "lags": post[o_lags:o_w]}
        if c > 1:
            parts["logw"] = post[o_w:o_ab]
        parts["ab"] = post[o_ab:o_r].view(c, 2)
        parts["r"] = post[o_r:o_z].view(c, d, d)
        parts["z"] = post[o_z : o_z + c * d].view(c, d)
        return parts

    def _join(self, head: torch.Tensor, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        pieces = [head, parts["buf"], parts["lags"]] + ([parts["logw"]] if "logw" in parts else [])
        return torch.cat(pieces + [parts["ab"].flatten(), parts["r"].flatten(), parts["z"].flatten()])

    def exact_init(self, components: int | None = None) -> torch.Tensor:
        """The prior's state, with this version's components (or ``components``, a legacy count)."""
        c = components or len(self._components())
        d = self._width(c)
        parts = {"buf": torch.zeros(self.warmup, dtype=torch.float64), "lags": torch.zeros(self.order, dtype=torch.float64),
                 "ab": torch.tensor([[self.alpha0, self.beta0]] * c, dtype=torch.float64),
                 "r": (torch.eye(d, dtype=torch.float64) / self.coef_scale).expand(c, d, d),
                 "z": torch.zeros(c, d, dtype=torch.float64)}
        if c > 1:
            parts["logw"] = torch.full((c,), -math.log(c), dtype=torch.float64)
        return self._join(torch.zeros(3, dtype=torch.float64), parts)

    def exact_restart(self, post: torch.Tensor) -> torch.Tensor:
        """A restart at a change point keeps the incumbent's scale, fixed from data before the
        change, and so needs no warm-up of its own: it is scored from its first row, under the
        prior in the old regime's units, centred where the incumbent expected the next row
        (``_next_mean``): a new level within a few old standard deviations of the old regime's
        is likely, one 1e6 away is not. Its lags are the incumbent's (the rows before it, in the
        moved frame), its time index starts at ``warmup`` (where a new series' first scored row
        is), the weights of several components at their prior. During the incumbent's own warm-up
        there is no frame yet: the prior, with a warm-up.

        Why centred there and not at the warm-up's centre: the frame's centre is where the series
        began, and a series that grew or wandered is far from it in the warm-up's sds. The prior
        of the intercept, N(0, s2 coef_scale^2), then conflicts with the data, and the conjugate
        posterior pays for it in the noise variance: a rising series (+350 a step, noise 200,
        `sim:trend-shift`) was 140 frame units from its centre at its level shift at 200; `trend`'s
        restart there took s2 for 24 times the truth after 5 rows and 19 times after 100 (b grew by
        140^2 / (2 coef_scale^2) = 98), predicted about 1 nat a row worse than a fresh `trend` on
        the same rows, and lost the stream's weight to `ar` within 60 rows. Moving the centre
        (not the scale) leaves the evidence in the data's units as it is: log scale per row."""
        new = self.exact_init(self._count(post))
        if int(post[0]) >= self.warmup:
            shift = self._next_mean(post)
            new[0], new[1], new[2] = float(self.warmup), float(post[1]) + shift * float(post[2]), post[2]
            if self.order:
                o_lags, o_w = self._offsets(self._count(post))[:2]
                new[o_lags:o_w] = self._parts(post)["lags"] - shift
        return new

    def _next_mean(self, post: torch.Tensor) -> float:
        """The predictive mean of the state's next row, in the frame (``_predictor``)."""
        return self._predictor(post)(self._parts(post)["lags"], int(post[0]))

    def _predictor(self, post: torch.Tensor):
        """``predict(lags, t)``: the predictive mean of a row at time index ``t`` after ``lags``, in
        the frame: each component's posterior mean of the coefficients (solved once, here) on the
        row's features, mixed by the components' weights."""
        parts = self._parts(post)
        count = len(parts["ab"])
        mean = torch.linalg.solve_triangular(parts["r"], parts["z"][..., None], upper=True)[..., 0]  # [K, D]
        weight = torch.softmax(parts["logw"], 0) if "logw" in parts else torch.ones(1, dtype=torch.float64)

        def predict(lags: torch.Tensor, t: int) -> float:
            phi, _ = self._design(torch.zeros(1, dtype=torch.float64), lags, t, count)  # [K, 1, D]
            return float((weight * (phi[:, 0, :] * mean).sum(-1)).sum())

        return predict

    def exact_shift(self, post: torch.Tensor) -> torch.Tensor | None:
        """A restart at a level shift: the series' level jumps to a new value and everything else
        holds. The posterior ``post`` (the incumbent's, given the rows before the change) with the
        intercept's jump, N(0, s2 coef_scale^2), added to its variance: the slope, the seasonal
        terms, the lags' coefficients and the noise variance keep what the old regime taught (and
        several components their weights: the period is not what changed), and the lags and the
        time index go on. Exact: a Gaussian jump independent of the rest leaves (a, b) of the noise
        variance as they were. The detector compares it after one training row, its one new
        parameter (``service.detect.detector.SHIFT_TRAIN``). None during the warm-up (no frame yet).

        The new level was drawn from the prior N(0, s2 coef_scale^2) around the warm-up's centre
        until 2026-12-07: where the series had moved far from it (a trend after 200 rows, a random
        walk) the data after the shift conflicted with that prior and the noise variance paid for it
        (``exact_restart``)."""
        if int(post[0]) < self.warmup:
            return None
        new = post.clone()
        parts = self._parts(new)  # views into ``new``
        # R is upper triangular: its first row is all the intercept's information, and adding
        # coef_scale^2 to the intercept's variance (over s2) scales that row, and z's first entry
        # (z = R m, the mean kept), by 1 / sqrt(1 + coef_scale^2 R00^2): the rank-one downdate of
        # R^T R by (R^T R e0)(R^T R e0)^T coef_scale^2 / (1 + coef_scale^2 R00^2)
        f = 1.0 / torch.sqrt(1.0 + (self.coef_scale * parts["r"][:, 0, 0]) ** 2)
        parts["r"][:, 0] *= f[:, None]
        parts["z"][:, 0] *= f
        return new

    def exact_kink(self, post: torch.Tensor, jump: bool = False) -> torch.Tensor | None:
        """A restart at a change of slope (a kink): the series goes on from the level it had
        reached, at a new rate; everything else holds. With t0 the time index of the next row,
        the level there, L = intercept + t0 slope, keeps its posterior (as do the seasonal terms,
        the lags' coefficients and the noise variance), and the slope's information is replaced
        by its prior, N(0, s2 coef_scale^2), drawn afresh. Exact: the coefficients
        (intercept, slope, rest) = M (slope, L, rest), so [R | z] in those becomes R M, brought
        back to triangular by a QR (R M = Q T, z -> Q^T z); the slope is then the first, its row
        is all its information and is set to the prior's; then back to (intercept, slope, ...)
        the same way. One new parameter, as for a level shift (``SHIFT_TRAIN``). A level that
        jumps while the slope holds is ``exact_shift``; a slope change at a level that holds is
        this. With ``jump`` the level also jumps there, by N(0, s2 coef_scale^2) (a break: both at
        once, two new parameters; added to L's posterior covariance, then back to the square root).
        None without a slope (``trend`` 0) or during the warm-up (no frame yet)."""
        if not self.trend or int(post[0]) < self.warmup:
            return None
        new = post.clone()
        parts = self._parts(new)
        t0 = float(post[0])
        d = parts["r"].shape[-1]
        to_level = torch.eye(d, dtype=torch.float64)  # (intercept, slope, ...) = M (slope, L, ...)
        to_level[:2, :2] = torch.tensor([[-t0, 1.0], [1.0, 0.0]], dtype=torch.float64)
        back = torch.eye(d, dtype=torch.float64)  # (slope, L, ...) = M^-1 (intercept, slope, ...)
        back[:2, :2] = torch.tensor([[0.0, 1.0], [1.0, t0]], dtype=torch.float64)
        r, z = parts["r"], parts["z"]
        q, t = torch.linalg.qr(r @ to_level)
        zt = (q.transpose(-1, -2) @ z[..., None])[..., 0]
        t[:, 0] = 0.0
        t[:, 0, 0] = 1.0 / self.coef_scale
        zt[:, 0] = 0.0
        if jump:
            mean = torch.linalg.solve_triangular(t, zt[..., None], upper=True)
            cov = torch.cholesky_inverse(t, upper=True)  # (T^T T)^-1
            cov[:, 1, 1] += self.coef_scale ** 2
            t = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(cov)), upper=True)
            zt = (t @ mean)[..., 0]
        q2, r2 = torch.linalg.qr(t @ back)
        r[:] = r2
        z[:] = (q2.transpose(-1, -2) @ zt[..., None])[..., 0]
        return new

    # --- features ----------------------------------------------------------------------------
    def _design(self, z: torch.Tensor, lags: torch.Tensor, t0: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Features ``[K, B, D]`` of standardised values ``z [B]`` whose predecessors' last ``order``
        values are ``lags`` (oldest first), the first at time ``t0``, for each of the first ``count``
        components (a state's, ``_count``; a
        component with fewer harmonics than the most has zeros in the others' places: a
        coefficient no row informs keeps its prior and adds nothing to the evidence); and the
        lags after them."""
        b, p = z.shape[0], self.order
        t = torch.arange(t0, t0 + b, dtype=torch.float64)
        seq = torch.cat([lags, z])
        parts = [torch.ones(b, 1, dtype=torch.float64)] + ([t[:, None]] if self.trend else [])
        parts += [seq[p - i - 1 : p - i - 1 + b, None] for i in range(p)]  # lag i + 1 of each row
        shared = torch.cat(parts, 1) if len(parts) > 1 else parts[0]  # [B, 1 + trend + order]
        freq, keep = _frequencies(self._components()[:count])
        lead = 1 + self.trend
        if freq.shape[1] == 0:
            return shared.expand(freq.shape[0], b, shared.shape[1]).contiguous(), seq[len(seq) - p :]
        # every component's harmonics at once: angle [K, B, H], then (sin, cos) interleaved per harmonic,
        # zero where a component has fewer harmonics than the most (the same values as one by one)
        angle = freq[:, None, :] * t[None, :, None]
        waves = (torch.stack([torch.sin(angle), torch.cos(angle)], -1) * keep[:, None, :, None]).flatten(2)
        k = freq.shape[0]
        out = torch.cat([shared[None, :, :lead].expand(k, b, lead), waves, shared[None, :, lead:].expand(k, b, p)], 2)
        return out, seq[len(seq) - p :]

    # --- exact updates -----------------------------------------------------------------------
    def _mix(self, parts: dict[str, torch.Tensor], lps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log of the components' mixed predictive, the new log weights) from each component's."""
        if "logw" not in parts:
            return lps[0], None
        joint = parts["logw"] + lps
        lp = torch.logsumexp(joint, 0)
        return lp, joint - lp

    def exact_update(self, post: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, float]:
        native = kernels()
        if native is not None and int(post[0]) >= self.warmup:
            return self._update_framed(native, post, rows)
        parts = self._parts(post)
        y = rows[:, 0]
        seen, k = int(post[0]), self.warmup
        centre, scale = float(post[1]), float(post[2])
        buf = parts["buf"].clone()
        lags, ab, r, zc = parts["lags"], parts["ab"], parts["r"], parts["z"]
        first = 0
        if seen < k:  # warm-up: collect, and at its end fix the frame and condition on the rows
            first = min(k - seen, y.shape[0])
            buf[seen : seen + first] = y[:first]
            if seen + first == k:
                buf = _clean_warmup(buf)  # (a wild reading replaced)
                centre, scale = _warmup_frame(buf)
                phi, lags = self._design((buf - centre) / scale, lags, 0, len(ab))
                r, zc, ab, _ = _srif_nig(r, zc, ab, phi, (buf - centre) / scale)
        lp, logw = 0.0, parts.get("logw")
        if first < y.shape[0]:
            zv = (y[first:] - centre) / scale
            phi, lags = self._design(zv, lags, seen + first, len(ab))
            r, zc, ab, lps = _srif_nig(r, zc, ab, phi, zv)
            mixed, logw = self._mix(parts, lps)
            lp = float(mixed) - zv.shape[0] * math.log(scale)
        new = {"buf": buf, "lags": lags, "ab": ab, "r": r, "z": zc}
        if logw is not None:
            new["logw"] = logw
        return self._join(torch.tensor([seen + y.shape[0], centre, scale], dtype=torch.float64), new), lp

    def exact_skip(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        """``Model.exact_skip``: the time index goes on past the rows, and an autoregression's lags
        take each row's predictive mean in its place (the components' posterior means of the
        coefficients, mixed by their weights): the value the rows after it would have read had it
        been ordinary. The coefficients, the noise variance and the components' weights stay. None
        inside the warm-up (no frame yet)."""
        if self.frame(post) is None:
            return None
        seen, b = int(post[0]), int(rows.shape[0])
        new = post.clone()
        new[0] = seen + b
        if self.order:
            count = self._count(post)
            lags = self._parts(post)["lags"]
            predict = self._predictor(post)  # (the coefficients' means solved once for the rows)
            for i in range(b):
                guess = predict(lags, seen + i)
                _, lags = self._design(torch.tensor([guess], dtype=torch.float64), lags, seen + i, count)
            o_lags, o_w = self._offsets(count)[:2]
            new[o_lags:o_w] = lags
        return new

    def _update_framed(self, native, post: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, float]:
        """``exact_update`` once the frame is fixed, in numpy around the C kernel (``nig_update``): the
        same steps as the torch path (the design, the update, the components' mix), without its few
        dozen small tensor operations (45 -> 15 us a one-row update of ``level``: point by point the
        detector makes about 28 of them a row). The same evidence to rounding (tests/test_native.py)."""
        v = post.numpy()
        c = self._count(post)
        o_lags, o_w, o_ab, o_r, o_z = self._offsets(c)  # ``_parts``' layout
        seen, centre, scale = int(v[0]), float(v[1]), float(v[2])
        zv = (rows[:, 0].numpy() - centre) / scale
        b = zv.shape[0]
        phi, lags = self._design_np(zv, v[o_lags:o_w], seen, c)
        out, lps = np.empty_like(v), np.empty(c)
        out[:3] = (seen + b, centre, scale)
        out[3:o_lags] = v[3:o_lags]
        out[o_lags:o_w] = lags
        native.nig_update_into(v, (o_r, o_z, o_ab), phi, zv, out, lps)
        if c == 1:
            mixed = float(lps[0])
        else:
            joint = v[o_w : o_w + c] + lps
            top = float(joint.max())
            mixed = top + math.log(float(np.exp(joint - top).sum()))
            out[o_w : o_w + c] = joint - mixed
        return torch.from_numpy(out), mixed - b * math.log(scale)

    def _design_np(self, z: np.ndarray, lags: np.ndarray, t0: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``_design`` in numpy: features [K, B, D] and the lags after the rows."""
        b, p, lead = z.shape[0], self.order, 1 + self.trend
        t = np.arange(t0, t0 + b, dtype=np.float64)
        seq = np.concatenate([lags, z]) if p else z
        shared = np.empty((b, lead + p))  # [B, 1 + trend + order]
        shared[:, 0] = 1.0
        if self.trend:
            shared[:, 1] = t
        for i in range(p):
            shared[:, lead + i] = seq[p - i - 1 : p - i - 1 + b]  # lag i + 1 of each row
        freq, keep = _frequencies_np(self._components()[:count])
        k = freq.shape[0]
        if freq.shape[1] == 0:
            return (shared[None] if k == 1 else np.broadcast_to(shared, (k, b, lead + p))), seq[len(seq) - p :]
        angle = freq[:, None, :] * t[None, :, None]
        waves = (np.stack([np.sin(angle), np.cos(angle)], -1) * keep[:, None, :, None]).reshape(k, b, -1)
        out = np.concatenate([np.broadcast_to(shared[None, :, :lead], (k, b, lead)), waves,
                              np.broadcast_to(shared[None, :, lead:], (k, b, p))], 2)
        return out, seq[len(seq) - p :]

    def exact_row_log_predictive(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Each row's one-step Student-t predictive given ``post`` (no update between rows; an
        autoregression reads the rows before it as its lags), mixed over the components by
        their weights; 0 during the warm-up."""
        fr = self.frame(post)
        if fr is None:
            return torch.zeros(rows.shape[0], dtype=torch.float64)
        centre, scale = fr
        parts = self._parts(post)
        a, b = parts["ab"][:, :1], parts["ab"][:, 1:]  # [K, 1]
        zv = (rows[:, 0] - centre) / scale
        phi, _ = self._design(zv, parts["lags"], int(post[0]), len(parts["ab"]))
        m = torch.linalg.solve_triangular(parts["r"], parts["z"][..., None], upper=True)
        u = torch.linalg.solve_triangular(parts["r"].transpose(-1, -2), phi.transpose(-1, -2), upper=False)
        var = (b / a) * (1.0 + (u * u).sum(-2))  # [K, B]
        nu = 2.0 * a
        q = (zv - (phi @ m)[..., 0]) ** 2 / var
        each = (torch.lgamma((nu + 1) / 2) - torch.lgamma(nu / 2) - 0.5 * torch.log(nu * math.pi * var)
                - (nu + 1) / 2 * torch.log1p(q / nu) - math.log(scale))
        return each[0] if "logw" not in parts else torch.logsumexp(parts["logw"][:, None] + each, 0)


@lru_cache(maxsize=64)
def _frequencies(comps: tuple[tuple[tuple[float, int], ...], ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """For components (each a tuple of seasons (period, harmonics)): the angular frequencies
    2 pi h / period of each season's harmonics in turn [K, H] (H the most a component has; 0 past
    a component's own) and which of them it has (1.0/0.0) [K, H]. Shared: not to be written to."""
    most = max(sum(h for _, h in comp) for comp in comps)
    freq = torch.zeros(len(comps), most, dtype=torch.float64)
    keep = torch.zeros(len(comps), most, dtype=torch.float64)
    for i, comp in enumerate(comps):
        j = 0
        for period, harmonics in comp:
            for h in range(1, harmonics + 1):
                freq[i, j] = 2.0 * math.pi * h / period
                keep[i, j] = 1.0
                j += 1
    return freq, keep


@lru_cache(maxsize=64)
def _auto_components(harmonics: int, periods: tuple[float, ...],
                     pairs: tuple[tuple[float, float], ...] = ()) -> tuple[tuple[tuple[float, int], ...], ...]:
    """``seasonal``'s components without a period: one season (period, harmonics) for each of
    ``periods``, then two for each of ``pairs`` (outer, inner); harmonics at most (period - 1) / 2."""
    def season(p: float) -> tuple[float, int]:
        return (p, min(harmonics, int((p - 1) // 2)))
    return tuple((season(p),) for p in periods) + tuple((season(a), season(b)) for a, b in pairs)


@lru_cache(maxsize=64)
def _frequencies_np(comps: tuple[tuple[tuple[float, int], ...], ...]) -> tuple[np.ndarray, np.ndarray]:
    """``_frequencies`` as numpy arrays (shared: not to be written to)."""
    freq, keep = _frequencies(comps)
    return freq.numpy(), keep.numpy()


def _srif_nig(r, z, ab, phi, y):
    """One block of the Normal-Inverse-Gamma regression, for K components at once: r [K, D, D],
    z [K, D], ab [K, 2], phi [K, B, D], y [B] -> (R', z', ab', log p(y | past) [K]). In C by Givens
    rotations (``NativeKernels.nig_update``) where the kernels are built: a one-row update is a
    few dozen tensor operations here, and the detector makes about 20 of them a row (every
    challenger of every default model); ``_srif_nig_torch`` (the stacked QR) is the fallback and
    the reference (tests/test_native.py: the same evidence to rounding)."""
    native = kernels()
    if native is None:
        return _srif_nig_torch(r, z, ab, phi, y)
    r2, z2, ab2, lp = native.nig_update(r.numpy(), z.numpy(), ab.numpy(), phi.numpy(), y.numpy())
    return torch.from_numpy(r2), torch.from_numpy(z2), torch.from_numpy(ab2), torch.from_numpy(lp)


def _srif_nig_torch(r, z, ab, phi, y):
    """``_srif_nig`` by the QR of the stacked [R z; phi y] (the reference)."""
    k, d = r.shape[0], r.shape[-1]
    n = y.shape[0]
    top = torch.cat([r, z[..., None]], -1)
    below = torch.cat([phi, y.expand(k, n)[..., None]], -1)
    tri = torch.linalg.qr(torch.cat([top, below], -2), mode="r").R  # at least one row of y: [K, D+1, D+1]
    r2, z2, e = tri[:, :d, :d], tri[:, :d, d], tri[:, d, d]
    a, b = ab[:, 0], ab[:, 1]
    a2, b2 = a + 0.5 * n, b + 0.5 * e * e
    logdet = (torch.log(torch.abs(torch.diagonal(r, dim1=-2, dim2=-1))).sum(-1)
              - torch.log(torch.abs(torch.diagonal(r2, dim1=-2, dim2=-1))).sum(-1))
    lp = (torch.lgamma(a2) - torch.lgamma(a) + a * torch.log(b) - a2 * torch.log(b2) + logdet - 0.5 * n * LOG_2PI)
    return r2, z2, torch.stack([a2, b2], -1), lp


@dataclass(frozen=True)
class Level(TimeSeriesRegression):
    """A constant level with Gaussian noise, in the series' own frame (no trend, no season, no lags)."""

    name = "level"
    not_taken = {"order": "`ar`", "trend": "`trend`", "period": "`seasonal`", "harmonics": "`seasonal`"}


@dataclass(frozen=True)
class Autoregressive(TimeSeriesRegression):
    """AR(order): the level plus the last ``order`` values (default 1)."""

    name = "ar"
    order: int = 1
    not_taken = {"trend": "`trend:order=K`", "period": "`seasonal`", "harmonics": "`seasonal`"}


@dataclass(frozen=True)
class Trend(TimeSeriesRegression):
    """A linear trend in time (level and slope) with Gaussian noise; ``order`` adds AR lags."""

    name = "trend"
    trend: int = 1
    not_taken = {"period": "`seasonal:trend=1`", "harmonics": "`seasonal:trend=1`"}


#: ``seasonal`` without a period averages over these periods, in observations: the seasons of
#: the usual sampling calendars: quarterly data with a yearly cycle (4), daily with a weekly one
#: (7), monthly with a yearly one (12), hourly with a daily one (24), weekly with a yearly one
#: (365.25 / 7 = 52.18 weeks; Fourier terms need no whole number, and 52 drifts by a week every
#: 5.5 years); and those of operational metrics: 15-minute data with a daily cycle (96), hourly
#: with a weekly one (168), 5-minute with a daily one (288), daily with a yearly one (365.25) and
#: per-minute with a daily one (1,440). Fixed by the calendar, not chosen per series. (Without the
#: last five, three days of per-minute latency with a daily cycle gave 9-17 stream changes where
#: there was one, every few hours a bend of the cycle read as a change: ``seasonal:period=1440``
#: found the one alone.)
AUTO_PERIODS = (4.0, 7.0, 12.0, 24.0, 365.25 / 7, 96.0, 168.0, 288.0, 365.25, 1440.0)
#: ``local-seasonal`` averages over the first five (its components are periods x discounts: with
#: all ten, 50 filters a row; it is not in the default portfolio, and was judged with these)
LOCAL_PERIODS = AUTO_PERIODS[:5]
#: ``seasonal:pairs=1`` also averages over these pairs of calendar cycles at once (outer, inner):
#: a daily cycle within a weekly one, at hourly (168, 24), 15-minute (672, 96), 5-minute
#: (2,016, 288) and per-minute (10,080, 1,440) sampling, and a weekly one within a yearly one,
#: daily (365.25, 7). One period of the list cannot hold both. Not in the default: over less
#: than its outer period a pair's long terms are a smooth curve that passes for growth, and
#: growing traffic got a false change about every week (README)
AUTO_PAIRS = ((168.0, 24.0), (672.0, 96.0), (2016.0, 288.0), (10080.0, 1440.0), (365.25, 7.0))


@dataclass(frozen=True)
class Seasonal(TimeSeriesRegression):
    """A level plus ``harmonics`` Fourier terms of ``period`` observations; ``trend`` and ``order``
    add a slope and AR lags.

    Without a period (``period=0``, the default) the period is unknown and averaged over: the
    model is the mixture over ``AUTO_PERIODS`` (and ``AUTO_PAIRS`` with ``pairs=1``) with equal
    prior weights, each component a ``seasonal`` of that period (harmonics at most (period - 1) /
    2; a pair's component has both seasons' terms), and by default one AR lag
    (``order=1``): the level wanders with the last value, as real seasonal metrics' levels do,
    instead of following one straight line for years (with a fixed level and slope the model
    reads every bend of a long trend as a change: 25 false alarms on 43 years of weekly CO2,
    none with the lag). Exact as well: with w_k the period's posterior weight given the rows since
    the warm-up (every component conditions on the warm-up rows, and the weights start
    equal after them: the periods compete on the rows after the warm-up, as the stream's models
    do, ``log_model_probabilities`` of their evidences, which all leave the warm-up out),

        p(chunk | past) = sum_k w_k p_k(chunk | past),   w_k' = w_k p_k(chunk | past) / p(chunk | past),

    and a row's predictive is the same mixture of the components' Student-t predictives. The
    components are updated together (``TimeSeriesRegression._components``): one batched QR per
    chunk. A restart restarts every component with the prior weights; a level shift shifts
    every component and keeps the weights (the period is not what changed)."""

    name = "seasonal"
    #: a state saved before the operational periods joined ``AUTO_PERIODS`` (2026-11-27) holds the
    #: first five: the stream goes on with those (their width: with ``harmonics`` above 25, the five
    #: have fewer coefficients than the ten, ``_width``)
    legacy_components: ClassVar[tuple[int, ...]] = (5,)
    period: float = 0.0
    harmonics: int = 2
    order: int = -1  # -1: the default: 1 without a period (above), 0 with one
    pairs: int = 0  # 1: also average over ``AUTO_PAIRS`` (two cycles at once); without a period only

    def __post_init__(self) -> None:
        if self.order == -1:
            object.__setattr__(self, "order", 0 if self.period else 1)
        super().__post_init__()
        if self.pairs not in (0, 1) or isinstance(self.pairs, bool):
            raise ModelError(f"seasonal: pairs must be 0 or 1 (1: also the pairs of calendar cycles), got {self.pairs!r}")
        if self.pairs and self.period:
            raise ModelError("seasonal: pairs=1 averages over calendar cycles, so it takes no period; for one known "
                             "pair give the outer period with harmonics enough for the inner one "
                             "(seasonal:period=168,harmonics=8 holds a daily cycle within a weekly one)")

    def _check_harmonics(self) -> None:
        if self.period:
            super()._check_harmonics()
        elif not (isinstance(self.harmonics, int) and 1 <= self.harmonics <= 32):
            raise ModelError(f"seasonal: harmonics must be an integer in [1, 32], got {self.harmonics!r}")

    def _components(self) -> tuple[tuple[tuple[float, int], ...], ...]:
        if self.period:
            return super()._components()
        return _auto_components(self.harmonics, AUTO_PERIODS, AUTO_PAIRS if self.pairs else ())

    @property
    def training_dim(self) -> int:
        """The rows a restart sees before it is compared (``service.detect.detector.training_rows``):
        the parameters of the largest one-season component. The mixture's predictive is proper
        once those components' are; counting a pair's extra season would take a restart from 7
        rows to 11 (harmonics 2), and every default stream's resolution with it."""
        singles = sum(len(c) == 1 for c in self._components())  # (they come first: ``_auto_components``)
        return self._width(singles) + 1

    def period_probabilities(self, post: torch.Tensor) -> dict[float | tuple[float, ...], float] | None:
        """The posterior probability of each period (a pair of cycles: (outer, inner)) given the
        rows so far; None with a fixed period."""
        if self.period:
            return None
        return {comp[0][0] if len(comp) == 1 else tuple(p for p, _ in comp): float(w)
                for comp, w in zip(self._components()[: self._count(post)], torch.exp(self._parts(post)["logw"]))}


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
        return check_counts(self.name, data)

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

    def exact_skip(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        """``Model.exact_skip``: the counts are exchangeable (``skip_counted``)."""
        return skip_counted(post, rows, self.warmup)

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


#: ``local-trend`` without a discount averages over these (module ``LocalTrend``): memories of
#: about 10, 20, 50 and 100 rows and a straight line (1), the usual range of trend discounts
#: (West and Harrison 1997, 6.3: 0.9 to 0.99); fixed, not chosen per series
AUTO_DISCOUNTS = (0.9, 0.95, 0.98, 0.99, 1.0)


@dataclass(frozen=True)
class LocalTrend(_Framed):
    """A local linear trend: a level and a slope that both drift, with Gaussian noise (a dynamic
    linear model, West and Harrison 1997, sections 4.5 and 6.3), in the series' own frame.

        z_t = level_t + e_t,   e_t ~ N(0, s2)
        (level_t, slope_t) = G (level_{t-1}, slope_{t-1}) + w_t,   G = [[1, 1], [0, 1]]

    with the state's evolution variance set by a discount factor d: the prior of the state at t is
    its posterior at t - 1 moved by G with its covariance divided by d (W_t = G C_{t-1} G^T
    (1 / d - 1)), so about the last 1 / (1 - d) rows inform it. Everything is scaled by the noise
    variance s2 ~ InvGamma(alpha0, beta0), and the state's prior before the first row is
    N(0, s2 coef_scale^2 I) in the frame, so the model is conjugate: each row's one-step
    predictive is a Student-t with 2 a degrees of freedom, and the evidence, their product, is
    exact. (C, and so W_t, do not depend on the data's values, only on how many rows came: given
    s2 the model is a Gaussian process, which ``tests/test_timeseries.py`` checks it against,
    dense.) How fast a trend drifts is not known in advance, so without a ``discount`` the model
    is the mixture over ``AUTO_DISCOUNTS`` with equal prior weights, exact as ``seasonal``'s
    mixture over periods is (each component conditions on the warm-up rows; the weights follow
    the components' predictives after it). Where ``trend`` reads a curved rise as a run of
    changes of its fixed slope, this one follows it; a jump is still a surprise. The frame and
    the warm-up as for the other models (module docstring). ``post`` = (seen, centre, scale,
    warm-up buffer [warmup], log weights [K], then per component m [2], C [3]: c00, c01, c11, a, b)."""

    name = "local-trend"
    #: ``exact_skip`` is exact, but the detector does not take rows out with it: measured on readings
    #: 10 sd out in bursts (200/204, 200/203/206, 208/212, 200/201) before a +5 sd shift at 300,
    #: chunks of 1-50, data seeds 0-5 (120 runs), skipping cut the false changes 80 -> 33 and lost
    #: the shift in 9 more runs (109 -> 100; chunks of 50: 1 -> 11 missed); ``local-seasonal``
    #: (which inherits this) 43 -> 18 false changes, the shift lost in 13 more. A level that adapts
    #: forgets a wild reading within about 1 / (1 - discount) rows, so the evidence that it was an
    #: outlier grows slowly (6 nats after 95 rows, against 18 needed for a pair), the suspect holds
    #: the challengers meanwhile, and the shift then retires it and is placed at the readings.
    skips_outliers = False
    discount: float = 0.0  # 0: average over AUTO_DISCOUNTS
    warmup: int = 5
    coef_scale: float = 10.0
    alpha0: float = 1.0
    beta0: float = 1.0

    def __post_init__(self) -> None:
        n = self.name
        _check_one_column(n, self.n_columns)
        if not (isinstance(self.discount, (int, float)) and not isinstance(self.discount, bool)
                and (self.discount == 0 or 0.5 <= self.discount <= 1.0)):
            raise ModelError(f"{n}: discount must be 0 (average over {', '.join(map(str, AUTO_DISCOUNTS))}) or a number "
                             f"in [0.5, 1] (1: a straight line), got {self.discount!r}")
        _check_warmup(n, self.warmup, 2)
        _check_frame_prior(n, self)

    @property
    def discounts(self) -> tuple[float, ...]:
        return (float(self.discount),) if self.discount else AUTO_DISCOUNTS

    @property
    def dim(self) -> int:
        return 3  # level, slope, noise variance

    def parameter_names(self) -> list[str]:
        return ["level", "slope", "noise_var"]

    def _states(self, post: torch.Tensor) -> tuple[list[float], list[list[float]]]:
        k, c = self.warmup, len(self.discounts)
        p = post.tolist()
        logw = p[3 + k : 3 + k + c]
        flat = p[3 + k + c :]
        return logw, [flat[7 * j : 7 * j + 7] for j in range(c)]

    def _join(self, head: list[float], buf: list[float], logw: list[float], states: list[list[float]]) -> torch.Tensor:
        return torch.tensor(head + buf + logw + [v for st in states for v in st], dtype=torch.float64)

    def _prior_states(self) -> tuple[list[float], list[list[float]]]:
        c2, c = float(self.coef_scale) ** 2, len(self.discounts)
        return [-math.log(c)] * c, [[0.0, 0.0, c2, 0.0, c2, float(self.alpha0), float(self.beta0)] for _ in range(c)]

    def exact_init(self) -> torch.Tensor:
        logw, states = self._prior_states()
        return self._join([0.0, 0.0, 1.0], [0.0] * self.warmup, logw, states)

    @staticmethod
    def _log_t(e: float, q: float, a: float, b: float) -> float:
        """log of the one-step predictive of a residual ``e`` with scale-free variance ``q``: a
        Student-t, 2 a degrees of freedom, scale^2 q b / a."""
        return (math.lgamma(a + 0.5) - math.lgamma(a) - 0.5 * math.log(2.0 * math.pi * b * q)
                - (a + 0.5) * math.log1p(e * e / (2.0 * b * q)))

    @classmethod
    def _step(cls, st: list[float], y: float, d: float) -> float:
        """One row into a component's state ``st`` (changed in place); its one-step log predictive."""
        m0, m1, c00, c01, c11, a, b = st
        a0 = m0 + m1
        r00, r01, r11 = (c00 + 2.0 * c01 + c11) / d, (c01 + c11) / d, c11 / d
        q = r00 + 1.0
        e = y - a0
        lp = cls._log_t(e, q, a, b)
        k0, k1 = r00 / q, r01 / q
        st[:] = [a0 + k0 * e, m1 + k1 * e, r00 - k0 * r00, r01 - k0 * r01, r11 - k1 * r01, a + 0.5, b + 0.5 * e * e / q]
        return lp

    def exact_update(self, post: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, float]:
        logw, states = self._states(post)
        ds = self.discounts
        y = rows[:, 0].tolist()
        seen, centre, scale, buf, first, ended = self._warm(post, y)
        if ended:  # condition on the warm-up's rows
            for st, d in zip(states, ds):
                for v in buf:
                    self._step(st, (v - centre) / scale, d)
        lp = 0.0
        for v in y[first:]:
            z = (v - centre) / scale
            joint = [w + self._step(st, z, d) for w, st, d in zip(logw, states, ds)]
            top = max(joint)
            mixed = top + math.log(sum(math.exp(j - top) for j in joint))
            logw = [j - mixed for j in joint]
            lp += mixed - math.log(scale)
        return self._join([float(seen + len(y)), centre, scale], buf, logw, states), lp

    def exact_row_log_predictive(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Each row's predictive given ``post`` alone (no update between rows: row h of the chunk is
        forecast h steps ahead), mixed over the components by their weights; 0 during the warm-up."""
        fr = self.frame(post)
        if fr is None:
            return torch.zeros(rows.shape[0], dtype=torch.float64)
        centre, scale = fr
        logw, states = self._states(post)
        each = []
        for w, (m0, m1, c00, c01, c11, a, b), d in zip(logw, states, self.discounts):
            out = []
            for y in rows[:, 0].tolist():
                m0 = m0 + m1
                c00, c01, c11 = (c00 + 2.0 * c01 + c11) / d, (c01 + c11) / d, c11 / d
                q = c00 + 1.0
                e = (y - centre) / scale - m0
                out.append(w + self._log_t(e, q, a, b) - math.log(scale))
            each.append(out)
        return torch.logsumexp(torch.tensor(each, dtype=torch.float64), 0)

    def exact_skip(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        """``Model.exact_skip``: each row a missing observation (West and Harrison 1997, section
        10.5): every component's state moves one step (its mean by G, its covariance by G and the
        discount), nothing is learned from the value; the noise's a, b and the weights stay. Exact:
        the rows after it are scored as the model scores them with the row left out. None inside
        the warm-up (no frame yet)."""
        if int(post[0]) < self.warmup:
            return None
        logw, states = self._states(post)
        for st, d in zip(states, self.discounts):
            for _ in range(int(rows.shape[0])):
                m0, m1, c00, c01, c11, a, b = st
                st[:5] = [m0 + m1, m1, (c00 + 2.0 * c01 + c11) / d, (c01 + c11) / d, c11 / d]
        return self._join([float(post[0]) + int(rows.shape[0]), float(post[1]), float(post[2])],
                          post[3 : 3 + self.warmup].tolist(), logw, states)

    def exact_restart(self, post: torch.Tensor) -> torch.Tensor:
        """A restart at a change point keeps the incumbent's scale (no warm-up of its own) and
        starts from the prior in it, centred where the incumbent expected the next row (its
        components' level plus slope, mixed by their weights; as ``TimeSeriesRegression.
        exact_restart``, for a series that has moved far from where it began), with the prior
        weights; during the incumbent's own warm-up, the prior with a warm-up."""
        new = self.exact_init()
        if int(post[0]) >= self.warmup:
            new[: 3 + self.warmup] = post[: 3 + self.warmup]
            logw, states = self._states(post)
            w = torch.softmax(torch.tensor(logw, dtype=torch.float64), 0).tolist()
            ahead = sum(wk * (st[0] + st[1]) for wk, st in zip(w, states))
            new[1] = float(post[1]) + ahead * float(post[2])
        return new

    def exact_shift(self, post: torch.Tensor) -> torch.Tensor | None:
        """A restart at a level shift: the level jumps by N(0, s2 coef_scale^2) before the next row,
        the slope, the noise and the weights hold (each component's posterior with coef_scale^2
        added to the level's variance: exact). None during the warm-up (no frame yet)."""
        if int(post[0]) < self.warmup:
            return None
        logw, states = self._states(post)
        for st in states:
            st[2] += float(self.coef_scale) ** 2
        return self._join(post[:3].tolist(), post[3 : 3 + self.warmup].tolist(), logw, states)


def _log_sum_exp(x: np.ndarray) -> float:
    """log sum exp(x) of a [K] array, as a float."""
    top = float(x.max())
    return top + math.log(float(np.exp(x - top).sum()))


@dataclass(frozen=True)
class LocalSeasonal(LocalTrend):
    """A local linear trend with a season: ``local-trend``'s level and slope that drift, plus
    ``harmonics`` Fourier terms of ``period`` observations, and Gaussian noise (a dynamic linear
    model with component discounting, West and Harrison 1997, sections 6.3 and 8.5):

        z_t = level_t + sum_h s_{h,t} + phi z_{t-1} + e_t,   e_t ~ N(0, s2)
        (level, slope)_t = [[1, 1], [0, 1]] (level, slope)_{t-1} + w_t,
        (s_h, s*_h)_t = rotation by 2 pi h / period of (s_h, s*_h)_{t-1} + w*_t,

    the trend block's evolution variance set by ``discount`` (its part of the moved covariance
    divided by it), the season's by ``season_discount`` (1, the default: a fixed seasonal shape, as
    ``seasonal``'s Fourier terms; below 1 the shape may drift), phi static (``order`` 1, the
    default; 0: no AR term). The AR term reads the last value (0, the warm-up mean, before the
    first): without it a few weeks' dip below the season of weekly CO2 read as a level shift (two
    false alarms; none with it). Where ``seasonal`` holds its level with an AR(1) lag and
    ``seasonal:trend=1`` draws one straight line for years, this one follows growth that bends, with
    its season on top: hourly traffic growing with a daily cycle, weekly CO2. Conjugate in the noise
    variance as ``local-trend`` is (each row's one-step predictive a Student-t, the evidence exact;
    C, and so W_t, depend on the data only through the AR term's regressors, known one step ahead,
    so the evidence is the dense Gaussian's with them fixed at the observed values, which
    ``tests/test_timeseries.py`` checks it against).
    Without a ``discount`` the trend's discount is averaged over ``AUTO_DISCOUNTS``; without a
    ``period``, the period over ``LOCAL_PERIODS`` (harmonics at most (period - 1) / 2), as
    ``seasonal`` over its calendar periods: the components are every (period, discount) pair, equal prior weights, exact
    (each conditions on the warm-up rows; the weights follow their predictives after it). All
    components are filtered together, as one batch of small matrices. ``post`` = (seen, centre,
    scale, warm-up buffer [warmup], the last value in the frame, log weights [K], then per component
    m [P], C [P, P], a, b), P = 2 + 2 x the largest number of harmonics + ``order`` (a component with
    fewer harmonics keeps the rest at 0)."""

    name = "local-seasonal"
    period: float = 0.0  # 0: average over LOCAL_PERIODS
    harmonics: int = 3
    season_discount: float = 1.0
    order: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.name
        if not (isinstance(self.period, (int, float)) and not isinstance(self.period, bool) and math.isfinite(self.period)
                and (self.period == 0 or self.period >= 3)):
            raise ModelError(f"{n}: period must be 0 (average over {', '.join(f'{p:g}' for p in LOCAL_PERIODS)}) "
                             f"or at least 3 observations, got {self.period!r}")
        if not (isinstance(self.harmonics, int) and not isinstance(self.harmonics, bool) and 1 <= self.harmonics <= 32
                and (not self.period or 2 * self.harmonics < self.period)):
            raise ModelError(f"{n}: harmonics must be an integer in [1, 32], below period / 2, got {self.harmonics!r}")
        if self.order not in (0, 1) or isinstance(self.order, bool):
            raise ModelError(f"{n}: order must be 0 or 1 (an AR(1) term on the last value), got {self.order!r}")
        if not (isinstance(self.season_discount, (int, float)) and not isinstance(self.season_discount, bool)
                and 0.5 <= self.season_discount <= 1.0):
            raise ModelError(f"{n}: season_discount must be a number in [0.5, 1] (1: a fixed seasonal shape), "
                             f"got {self.season_discount!r}")

    @property
    def seasons(self) -> tuple[tuple[float, int], ...]:
        """(period, harmonics) of each season the model averages over (one with a ``period``)."""
        if self.period:
            return ((float(self.period), self.harmonics),)
        return tuple((p, min(self.harmonics, int((p - 1) // 2))) for p in LOCAL_PERIODS)

    @property
    def components(self) -> tuple[tuple[float, int, float], ...]:
        """(period, harmonics, trend discount) of each component."""
        return tuple((p, h, d) for p, h in self.seasons for d in self.discounts)

    @property
    def _p(self) -> int:
        return 2 + 2 * max(h for _, h in self.seasons) + self.order

    def parameter_names(self) -> list[str]:
        return ["level", "slope", "noise_var"]

    def period_probabilities(self, post: torch.Tensor) -> dict[float, float] | None:
        """The posterior probability of each period given the rows so far (summed over the trend's
        discounts); None with a fixed period."""
        if self.period:
            return None
        w = np.exp(self._unpack(post)[1])
        out: dict[float, float] = {}
        for (p, _, _), v in zip(self.components, w):
            out[p] = out.get(p, 0.0) + float(v)
        return out

    def _system(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """G [K, P, P], F [K, P] and the trend discounts [K] of the components."""
        comps, p = self.components, self._p
        g = np.zeros((len(comps), p, p))
        f = np.zeros((len(comps), p))
        g[:, 0, 0] = g[:, 0, 1] = g[:, 1, 1] = f[:, 0] = 1.0
        for c, (period, h, _) in enumerate(comps):
            for j in range(1, h + 1):
                w, i = 2.0 * math.pi * j / period, 2 * j
                g[c, i : i + 2, i : i + 2] = [[math.cos(w), math.sin(w)], [-math.sin(w), math.cos(w)]]
                f[c, i] = 1.0
        if self.order:
            g[:, -1, -1] = 1.0  # the AR coefficient: static; its regressor, the last value, is set per row
        return g, f, np.array([d for _, _, d in comps])

    def _unpack(self, post: torch.Tensor):
        """(last value in the frame, log weights [K], m [K, P], C [K, P, P], a [K], b [K])."""
        k, c, p = self.warmup, len(self.components), self._p
        x = post.numpy()
        logw = x[4 + k : 4 + k + c].copy()
        st = x[4 + k + c :].reshape(c, p + p * p + 2)
        return (float(x[3 + k]), logw, st[:, :p].copy(), st[:, p : p + p * p].reshape(c, p, p).copy(), st[:, -2].copy(),
                st[:, -1].copy())

    def _pack(self, head, buf, last: float, logw, m, cov, a, b) -> torch.Tensor:
        c = len(logw)
        st = np.concatenate([m, cov.reshape(c, -1), a[:, None], b[:, None]], axis=1)
        return torch.from_numpy(np.concatenate([np.asarray(head, dtype=np.float64), np.asarray(buf, dtype=np.float64),
                                                [last], logw, st.ravel()]))

    def exact_init(self) -> torch.Tensor:
        c, p = len(self.components), self._p
        cov = np.zeros((c, p, p))
        for i, (_, h, _) in enumerate(self.components):
            cov[i, : 2 + 2 * h, : 2 + 2 * h] = np.eye(2 + 2 * h) * float(self.coef_scale) ** 2
        if self.order:
            cov[:, -1, -1] = float(self.coef_scale) ** 2
        return self._pack([0.0, 0.0, 1.0], [0.0] * self.warmup, 0.0, np.full(c, -math.log(c)), np.zeros((c, p)), cov,
                          np.full(c, float(self.alpha0)), np.full(c, float(self.beta0)))

    def _moved(self, cov: np.ndarray, g: np.ndarray, d: np.ndarray) -> np.ndarray:
        """R_t: the covariance moved by G, its trend block divided by the trend's discount and its
        season block by ``season_discount`` (component discounting: W_t block-diagonal; the AR
        coefficient is static)."""
        r = g @ cov @ g.transpose(0, 2, 1)
        r[:, :2, :2] /= d[:, None, None]
        if self.season_discount != 1.0:
            e = self._p - self.order  # the season's block ends where the AR coefficient's (static) begins
            r[:, 2:e, 2:e] /= self.season_discount
        return r

    @staticmethod
    def _log_t_batch(e, q, a, b) -> np.ndarray:
        """``LocalTrend._log_t`` for every component ([K] arrays). The components have seen the same
        rows, so a is one number (lgamma once); elementwise otherwise."""
        if bool((a == a[0]).all()):
            c = math.lgamma(float(a[0]) + 0.5) - math.lgamma(float(a[0]))
        else:
            lg = np.vectorize(math.lgamma)
            c = lg(a + 0.5) - lg(a)
        return c - 0.5 * np.log(2.0 * math.pi * b * q) - (a + 0.5) * np.log1p(e * e / (2.0 * b * q))

    def _ahead(self, m, cov, last: float, g, f, d):
        """One step ahead of every component: the state's mean and covariance moved (a, R), R F and
        the predictive's scale-free variance q = F R F + 1 ([K]); ``last`` is the row before (the AR
        term's regressor, written into ``f``)."""
        if self.order:
            f[:, -1] = last
        am = np.einsum("kij,kj->ki", g, m)
        r = self._moved(cov, g, d)
        rf = np.einsum("kij,kj->ki", r, f)
        return am, r, rf, np.einsum("ki,ki->k", f, rf) + 1.0

    def _filter(self, m, cov, a, b, z: float, last: float, g, f, d):
        """One row ``z`` (in the frame; ``last`` the row before it, the AR term's regressor) into every
        component (in place); their one-step log predictives [K]."""
        am, r, rf, q = self._ahead(m, cov, last, g, f, d)
        e = z - np.einsum("ki,ki->k", f, am)
        lp = self._log_t_batch(e, q, a, b)
        gain = rf / q[:, None]
        m[:] = am + gain * e[:, None]
        new = r - gain[:, :, None] * rf[:, None, :]
        cov[:] = 0.5 * (new + new.transpose(0, 2, 1))
        b += 0.5 * e * e / q
        a += 0.5
        return lp

    def exact_update(self, post: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, float]:
        last, logw, m, cov, a, b = self._unpack(post)
        g, f, d = self._system()
        y = rows[:, 0].tolist()
        seen, centre, scale, buf, first, ended = self._warm(post, y)
        if ended:  # condition on the warm-up's rows; the row before the first: the warm-up mean
            last = 0.0
            for v in buf:
                z = (v - centre) / scale
                self._filter(m, cov, a, b, z, last, g, f, d)
                last = z
        lp = 0.0
        for v in y[first:]:
            z = (v - centre) / scale
            joint = logw + self._filter(m, cov, a, b, z, last, g, f, d)
            last = z
            mixed = _log_sum_exp(joint)
            logw = joint - mixed
            lp += mixed - math.log(scale)
        return self._pack([float(seen + len(y)), centre, scale], buf, last, logw, m, cov, a, b), lp

    def exact_row_log_predictive(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Each row's predictive given ``post`` alone (row h of the chunk forecast h steps ahead, its AR
        term reading the row before it), mixed over the components by their weights; 0 during the
        warm-up."""
        fr = self.frame(post)
        if fr is None:
            return torch.zeros(rows.shape[0], dtype=torch.float64)
        centre, scale = fr
        last, logw, m, cov, a, b = self._unpack(post)
        g, f, d = self._system()
        out = []
        for v in rows[:, 0].tolist():
            m, cov, _, q = self._ahead(m, cov, last, g, f, d)
            z = (v - centre) / scale
            e = z - np.einsum("ki,ki->k", f, m)
            out.append(_log_sum_exp(logw + self._log_t_batch(e, q, a, b)) - math.log(scale))
            last = z
        return torch.tensor(out, dtype=torch.float64)

    def exact_skip(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        """``Model.exact_skip``: each row a missing observation, as in ``LocalTrend.exact_skip``: every
        component's state moves one step (a, R), nothing is learned from the value. The AR term's
        next regressor, the row's own value, becomes its predictive mean (mixed over the components
        by their weights), as ``ar``'s lags do: exact for ``order=0``; with the AR term the rows
        after it read the value it would have had were it ordinary. None inside the warm-up."""
        if int(post[0]) < self.warmup:
            return None
        last, logw, m, cov, a, b = self._unpack(post)
        g, f, d = self._system()
        w = np.exp(logw)
        for _ in range(int(rows.shape[0])):
            m, cov, _, _ = self._ahead(m, cov, last, g, f, d)
            cov = 0.5 * (cov + cov.transpose(0, 2, 1))
            last = float((w * np.einsum("ki,ki->k", f, m)).sum())
        return self._pack([float(post[0]) + int(rows.shape[0]), float(post[1]), float(post[2])],
                          post[3 : 3 + self.warmup].tolist(), last, logw, m, cov, a, b)

    def exact_restart(self, post: torch.Tensor) -> torch.Tensor:
        """A restart at a change point keeps the incumbent's scale and the last value (the AR term's
        regressor goes on) and starts from the prior in it, centred where the incumbent expected
        the next row (as ``LocalTrend.exact_restart``; the last value in the moved frame), with the
        prior weights; during the incumbent's own warm-up, the prior with a warm-up."""
        new = self.exact_init()
        if int(post[0]) >= self.warmup:
            new[: 4 + self.warmup] = post[: 4 + self.warmup]
            last, logw, m, cov, _, _ = self._unpack(post)
            g, f, d = self._system()
            am = self._ahead(m, cov, last, g, f, d)[0]
            w = np.exp(logw - logw.max())
            ahead = float((w * np.einsum("ki,ki->k", f, am)).sum() / w.sum())
            new[1] = float(post[1]) + ahead * float(post[2])
            new[3 + self.warmup] = last - ahead
        return new

    def exact_shift(self, post: torch.Tensor) -> torch.Tensor | None:
        """A restart at a level shift: the level jumps by N(0, s2 coef_scale^2) before the next row;
        the slope, the season, the AR term, the noise and the weights hold (exact). None during the
        warm-up."""
        if int(post[0]) < self.warmup:
            return None
        last, logw, m, cov, a, b = self._unpack(post)
        cov[:, 0, 0] += float(self.coef_scale) ** 2
        return self._pack(post[:3].tolist(), post[3 : 3 + self.warmup].tolist(), last, logw, m, cov, a, b)

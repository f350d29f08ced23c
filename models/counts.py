"""Overdispersed counts with exact evidence: ``negbin`` (alias ``negative-binomial``).

**Model.** A univariate count series, y_t ~ NegBin(r, p) independently given (r, p):

    P(y | r, p) = Gamma(y + r) / (Gamma(r) y!) p^r (1 - p)^y,   mean mu = r (1 - p) / p,
    variance mu + mu^2 / r,

so 1 / r is the squared coefficient of variation *beyond* Poisson noise (dimensionless: the same
r means the same overdispersion at counts of 3 and of 3e6; r -> infinity is Poisson). The
dispersion r takes one of a log-spaced grid of values, ``per_decade`` a decade from ``r_min`` to
``r_max`` (defaults 0.1 .. 1e8, 3 a decade: 28 values), and given r, p ~ Beta(a_r, b_r), which
is conjugate: after rows with count n and sum S, p | r ~ Beta(a_r + n r, b_r + S), and

    log p(rows | r, past) = log B(a + n r, b + S) - log B(a, b) + sum log Gamma(y + r) / (Gamma(r) y!).

The model is the finite mixture over the grid: its evidence is still exact. Each r keeps its
Beta posterior and its log evidence w_r = log pi(r) + log p(y_1..t | r); a chunk's log
predictive is logsumexp_r(w_r + log p(chunk | r, past)) - logsumexp_r(w_r).

**Prior (a frame from the warm-up, like the regressions').** Counts of any magnitude: a fixed
Beta on p would put the mean mu = r (1 - p) / p near r, and weigh the dispersions by how near
their implied mean falls to the data, not by how well they fit. So the prior is fixed from the
first ``warmup`` rows (default 5), whose mean (at least 1 / warmup, as if one count had been
seen) is the frame's ``scale`` c: given r, p ~ Beta(r alpha0 / c, alpha0), whose mean mu has, as
r -> infinity, the Gamma(alpha0, rate alpha0 / c) prior (mean c; alpha0 = 1: exponential) of a
Poisson rate; and the weights pi(r) are set so that every r has the same prior density of mu at
c (pi(r) proportional to 1 / f_r(c), f_r the beta-prime density of mu under r; then r given
mu = c is uniform on the grid): the prior prefers no dispersion near the data. y -> the same
counts: the prior is on mu / c, so ``frame`` gives (centre 0, scale c), shown by
``GET /v1/streams/{s}`` and ``cusp replay``. As for the regressions, the warm-up rows are then
conditioned on (they update every r's posterior and weight), not scored: the evidence is the
partial evidence log p(y_{k+1..n} | y_1..k), exact.

A restart at a change point keeps the frame (c) and starts from the prior in it: a new mean
anywhere from about 0 to several c is plausible, with the prior's weights over r.

Refused: non-integer, negative or non-finite values (a ``ModelError`` naming the row), several
columns (use ``poisson`` for several independent count columns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from models.base import ModelError, check_counts
from models.timeseries import _check_positive, _check_warmup, _Exact, skip_counted


def _stirling_tail(z: torch.Tensor) -> torch.Tensor:
    """lgamma(z) - [(z - 1/2) log z - z + log(2 pi) / 2] for z >= 100: 1/(12 z) - 1/(360 z^3) +
    1/(1260 z^5), truncated below 1/(1680 z^7) < 1e-17."""
    iz = 1.0 / z
    iz2 = iz * iz
    return iz * (1.0 / 12 - iz2 * (1.0 / 360 - iz2 / 1260))


def lgamma_ratio(x, y) -> torch.Tensor:
    """lgamma(x + y) - lgamma(x) for x > 0, y >= 0, without the cancellation of two large lgammas
    (x = 1e8: lgamma(x) ~ 1.7e9, whose rounding alone is 2e-7): for x >= 100 from Stirling's series,
    (x + y - 1/2) log1p(y / x) + y log x - y + tail(x + y) - tail(x); lgamma below."""
    x, y = torch.broadcast_tensors(torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64))
    big = x >= 100.0
    xb = torch.where(big, x, torch.full_like(x, 100.0))
    zb = xb + y
    stirling = (zb - 0.5) * torch.log1p(y / xb) + y * torch.log(xb) - y + (_stirling_tail(zb) - _stirling_tail(xb))
    return torch.where(big, stirling, torch.lgamma(x + y) - torch.lgamma(x))


def _lgamma_drop(x, y) -> torch.Tensor:
    """lgamma(x) - lgamma(x + y) for x > 0, y >= 0 of moderate size beside x's: for x >= 100,
    -(x - 1/2) log1p(y / x) - y log(x + y) + y + tail(x) - tail(x + y), each term of the size of
    the result (no two ~x log x terms that cancel)."""
    x, y = torch.broadcast_tensors(torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64))
    big = x >= 100.0
    xb = torch.where(big, x, torch.full_like(x, 100.0))
    zb = xb + y
    stirling = -(xb - 0.5) * torch.log1p(y / xb) - y * torch.log(zb) + y + (_stirling_tail(xb) - _stirling_tail(zb))
    return torch.where(big, stirling, torch.lgamma(x) - torch.lgamma(x + y))


def betaln(x, y) -> torch.Tensor:
    """log B(x, y), as lgamma(min) + [lgamma(max) - lgamma(max + min)]: with one argument ~1e9
    (r = 1e8, or the sum of a million counts) no two ~x log x terms cancel."""
    x, y = torch.broadcast_tensors(torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64))
    lo, hi = torch.minimum(x, y), torch.maximum(x, y)
    return torch.lgamma(lo) + _lgamma_drop(hi, lo)


def nb_log_norm(r, y) -> torch.Tensor:
    """log [Gamma(y + r) / (Gamma(r) y!)], the negative binomial's coefficient, for r up to 1e12 and
    counts up to 2^53: from the larger of r and y + 1, the other as its increment."""
    r, y = torch.broadcast_tensors(torch.as_tensor(r, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64))
    big_r = r >= y + 1.0
    r_side = lgamma_ratio(r, y) - torch.lgamma(y + 1.0)
    yb = torch.where(big_r, torch.zeros_like(y), y)
    y_side = lgamma_ratio(yb + 1.0, r - 1.0) - torch.lgamma(r)
    return torch.where(big_r, r_side, y_side)


@dataclass(frozen=True)
class NegativeBinomial(_Exact):
    """Overdispersed counts (module docstring). ``post`` = (seen, c, warm-up buffer [warmup],
    log weight w [R], a [R], b [R]) with R the grid's size; c = 0 until the warm-up is done."""

    name = "negbin"
    warmup: int = 5
    alpha0: float = 1.0
    r_min: float = 0.1
    r_max: float = 1e8
    per_decade: int = 3

    def __post_init__(self) -> None:
        n = self.name
        if self.n_columns != 1:
            raise ModelError(f"{n} models one count series, the stream has {self.n_columns} columns: give it one "
                             "column, or use poisson for several independent count columns")
        _check_warmup(n, self.warmup, 1)
        for key in ("alpha0", "r_min", "r_max"):
            _check_positive(n, key, getattr(self, key))
        if not self.r_min <= self.r_max <= 1e12:
            raise ModelError(f"{n}: r_max must be at least r_min and at most 1e12, got r_min={self.r_min!r}, "
                             f"r_max={self.r_max!r}")
        if not (isinstance(self.per_decade, int) and 1 <= self.per_decade <= 20):
            raise ModelError(f"{n}: per_decade must be an integer in [1, 20], got {self.per_decade!r}")
        if len(self.grid()) > 400:
            raise ModelError(f"{n}: the dispersion grid r_min..r_max at per_decade={self.per_decade} has "
                             f"{len(self.grid())} values, at most 400")

    # --- shape ---------------------------------------------------------------------------------
    def grid(self) -> torch.Tensor:
        """The dispersions r: ``per_decade`` a decade from ``r_min``, up to ``r_max`` (included)."""
        lo, hi = math.log10(self.r_min), math.log10(self.r_max)
        steps = int(math.floor((hi - lo) * self.per_decade + 1e-9))
        g = [10.0 ** (lo + j / self.per_decade) for j in range(steps + 1)]
        if hi - math.log10(g[-1]) > 1e-9:
            g.append(self.r_max)
        return torch.tensor(g, dtype=torch.float64)

    @property
    def dim(self) -> int:
        return 2  # the mean and the dispersion

    def parameter_names(self) -> list[str]:
        return ["p", "r"]

    def featurize(self, data: torch.Tensor) -> torch.Tensor:
        self.check_width(data)
        return check_counts(self.name, data)

    # --- posterior layout --------------------------------------------------------------------------
    def _parts(self, post: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        k, r = self.warmup, len(self.grid())
        o = 2 + k
        return post[2:o], post[o : o + r], post[o + r : o + 2 * r], post[o + 2 * r : o + 3 * r]

    def exact_init(self) -> torch.Tensor:
        r = len(self.grid())
        return torch.zeros(2 + self.warmup + 3 * r, dtype=torch.float64)

    def prior(self, c: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log pi(r), a_r, b_r) in the frame of scale ``c`` (module docstring), pi normalised."""
        r = self.grid()
        a = r * (self.alpha0 / c)
        b = torch.full_like(r, float(self.alpha0))
        # the beta-prime density of mu = r o at c, o = (1 - p) / p ~ BetaPrime(b, a):
        # f_r(c) = o^(b - 1) (1 + o)^(-a - b) / (B(b, a) r) at o = c / r
        o = c / r
        log_beta = betaln(b, a)
        log_f = (b - 1) * torch.log(o) - (a + b) * torch.log1p(o) - log_beta - torch.log(r)
        w = -log_f
        return w - torch.logsumexp(w, 0), a, b

    def frame(self, post: torch.Tensor) -> tuple[float, float] | None:
        """(centre 0, scale c): the prior is on the mean over c; None during the warm-up."""
        return (0.0, float(post[1])) if int(post[0]) >= self.warmup else None

    def exact_restart(self, post: torch.Tensor) -> torch.Tensor:
        """The prior in the incumbent's frame, scored from its first row (no warm-up of its own);
        during the incumbent's warm-up, the prior with a warm-up."""
        new = self.exact_init()
        if int(post[0]) >= self.warmup:
            c = float(post[1])
            w, a, b = self.prior(c)
            new[0], new[1] = float(self.warmup), c
            _, nw, na, nb = self._parts(new)
            nw.copy_(w), na.copy_(a), nb.copy_(b)
        return new

    # --- exact updates -----------------------------------------------------------------------------
    def _score(self, w, a, b, y) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """Condition on counts ``y [B]``: (w', a', b', log p(y | past)) of the mixture."""
        r = self.grid()
        n, s = y.shape[0], y.sum()
        per_r = betaln(a + n * r, b + s) - betaln(a, b) + nb_log_norm(r[:, None], y[None, :]).sum(1)
        w2 = w + per_r
        lp = float(torch.logsumexp(w2, 0) - torch.logsumexp(w, 0))
        w2 = w2 - torch.logsumexp(w2, 0)  # kept normalised: w is the posterior over r
        return w2, a + n * r, b + s, lp

    def exact_update(self, post: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, float]:
        y = rows[:, 0]
        seen, k = int(post[0]), self.warmup
        c = float(post[1])
        buf, w, a, b = (t.clone() for t in self._parts(post))
        first = 0
        if seen < k:  # warm-up: collect; at its end fix the frame and condition on the rows
            first = min(k - seen, y.shape[0])
            buf[seen : seen + first] = y[:first]
            if seen + first == k:
                c = max(float(buf.mean()), 1.0 / k)
                w, a, b = self.prior(c)
                w, a, b, _ = self._score(w, a, b, buf)
        lp = 0.0
        if first < y.shape[0]:
            w, a, b, lp = self._score(w, a, b, y[first:])
        head = torch.tensor([seen + y.shape[0], c], dtype=torch.float64)
        return torch.cat([head, buf, w, a, b]), lp

    def exact_skip(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        """``Model.exact_skip``: the counts are exchangeable (``skip_counted``)."""
        return skip_counted(post, rows, self.warmup)

    def exact_row_log_predictive(self, post: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Each row's beta-negative-binomial mixture predictive given ``post``; 0 during the warm-up."""
        if int(post[0]) < self.warmup:
            return torch.zeros(rows.shape[0], dtype=torch.float64)
        r = self.grid()[:, None]
        _, w, a, b = (t[:, None] for t in self._parts(post))
        y = rows[:, 0][None, :]
        per = betaln(a + r, b + y) - betaln(a, b) + nb_log_norm(r, y)
        return torch.logsumexp(w + per, 0)  # w is normalised

    def posterior_dispersion(self, post: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the grid r, the posterior probability of each r)."""
        return self.grid(), torch.exp(self._parts(post)[1])


@dataclass(frozen=True)
class NegativeBinomialAlias(NegativeBinomial):
    """``negative-binomial``: the same model as ``negbin``."""

    name = "negative-binomial"

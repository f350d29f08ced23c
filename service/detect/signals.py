"""The nomination signals: small objects, river-style (``update`` them chunk by chunk, read them).
They decide nothing; they nominate candidate change points, which challengers then test
(``Detector.update``, step 2). Each is pure arithmetic on floats, so a test can pin it to exact
indices (tests/test_signals.py).

- ``RunningLevel``: the incumbent's log predictive per observation, exponentially weighted
  (a plain mean over the first chunks), with its per-observation variance; ``z`` of a chunk
  against it (the surprise signal: |z| >= ``DetectorConfig.surprise`` nominates the chunk).
- ``StepSpike``: the same running mean and variance of the annealing steps a chunk needed; a
  chunk far above it nominates itself.
- ``Cusum``: a two-sided CUSUM of the (winsorised) z-scores with drift 0.5; when a side's
  excursion crosses ``DetectorConfig.cusum`` it nominates the chunk where the excursion began
  (small sustained shifts, point-by-point data).
- ``Windows``: the mean log predictive per observation of the last ``W`` rows (each chunk
  winsorised as for the CUSUM) against the level before them, for a few window lengths ``W``;
  one that lies ``DetectorConfig.surprise`` standard errors off nominates the window's first
  chunk (a sustained change too small per row for the CUSUM, whose drift of 0.5 sd a row it
  never exceeds, and slow enough for the running level to follow: a fall in volatility, where
  each row is only about 0.5 sd more likely than before).

- ``FlatRun``: runs of one repeated value in a column (a stuck sensor, a gauge that stopped
  updating), against how often the column repeated its value before: a run that rare nominates
  its first row. A value stuck near the mean is no surprise to the log predictive (each row is
  more likely than before, and only slowly more), so the other signals nominated such a run
  24-44 rows late or not at all.

- ``shares_moved``: a mixture's components' shares of new rows (their mean responsibilities)
  against their shares of older rows, a two-sample G-test (chi-square, K - 1 degrees of
  freedom) at the quantile of ``threshold`` standard normal deviations, its statistic divided
  by the stream's own dispersion of shares between runs of rows (``shares_dispersion``: rows that
  come in bursts). Clusters that drop out of a mixture's
  data (7 clusters, then 3 of them) leave its log predictive per observation where it was: the
  rows lose log(7/3) to the weights and gain as much in entropy. Their shares show it.

The detector's state holds one of each of the first three and a ``FlatRun`` and saves their fields
(``DetectorState.to_bytes``); ``Windows`` keeps nothing (it reads the detector's recent chunks),
nor does ``shares_moved`` (the detector gives it the incumbent's shares of the chunk and of a
sample of its reservoir).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: the per-observation variance below which a level is treated as this (no division by zero)
MIN_VAR = 1e-12
#: CUSUM drift: a side grows only while |z| exceeds this on average
DRIFT = 0.5


def weight(smoothing: float, count: int) -> float:
    """The newest chunk's weight in a running mean after ``count`` chunks: a plain mean at first
    (1 / (count + 1)), then ``smoothing``."""
    return max(smoothing, 1.0 / (count + 1))


@dataclass
class RunningLevel:
    """Running level of the incumbent's log predictive per observation since the last (re)start:
    ``mean``, ``var`` (per observation: a chunk of B rows has variance var / B about the mean)
    and ``count`` (chunks taken since the start; ``reset`` sets it to 0, and the next chunk then
    restarts the mean at its own value)."""

    count: int = 0
    mean: float = 0.0
    var: float = 0.0

    def update(self, x: float, rows: int, w: float) -> "RunningLevel":
        if self.count == 0:
            self.mean, self.var = x, 0.0
        else:
            d = x - self.mean
            self.mean += w * d
            self.var = (1 - w) * (self.var + w * rows * d * d)
        self.count += 1
        return self

    @property
    def spread(self) -> float:
        """Per-observation standard deviation."""
        return math.sqrt(max(self.var, MIN_VAR))

    def sd(self, rows: int) -> float:
        """Standard deviation of a chunk of ``rows`` observations' mean about the level."""
        return math.sqrt(max(self.var, MIN_VAR) / rows)

    def z(self, x: float, rows: int) -> float:
        """How many standard deviations a chunk's log predictive per observation ``x`` lies from
        the level (negative: the data became less likely)."""
        return (x - self.mean) / self.sd(rows)

    def reset(self) -> None:
        self.count = 0


@dataclass
class StepSpike:
    """Running mean and variance of the annealing steps per chunk."""

    mean: float = 0.0
    var: float = 0.0

    def update(self, steps: float, w: float, first: bool) -> "StepSpike":
        if first:
            self.mean, self.var = steps, 0.0
        else:
            d = steps - self.mean
            self.mean += w * d
            self.var = (1 - w) * (self.var + w * d * d)
        return self

    def fires(self, steps: float, k: float) -> bool:
        """More steps than the mean plus ``k`` standard deviations (at least 0.5) plus one."""
        return steps > self.mean + k * math.sqrt(max(self.var, 0.25)) + 1.0


@dataclass
class Cusum:
    """Two-sided CUSUM of z-scores: ``lo`` (<= 0) and ``hi`` (>= 0), and the indices (into the
    detector's recent chunks) where the current excursion of each side began."""

    lo: float = 0.0
    hi: float = 0.0
    lo_from: int = 0
    hi_from: int = 0

    def update(self, z: float, index: int) -> "Cusum":
        """Take the z-score of the chunk at ``index``; an excursion starting now starts there."""
        if self.lo == 0.0:
            self.lo_from = index
        if self.hi == 0.0:
            self.hi_from = index
        self.lo = min(0.0, self.lo + z + DRIFT)
        self.hi = max(0.0, self.hi + z - DRIFT)
        return self

    def alarms(self, threshold: float) -> list[int]:
        """Where the excursions that reached ``threshold`` began (low side first); each side that
        alarmed starts again from 0."""
        out = []
        if self.lo <= -threshold:
            out.append(self.lo_from)
            self.lo = 0.0
        if self.hi >= threshold:
            out.append(self.hi_from)
            self.hi = 0.0
        return out

    def dropped_oldest(self) -> None:
        """The oldest recent chunk was dropped: indices move down by one."""
        self.lo_from, self.hi_from = max(0, self.lo_from - 1), max(0, self.hi_from - 1)

    def reset(self) -> None:
        self.lo, self.hi = 0.0, 0.0


@dataclass(frozen=True)
class Windows:
    """Window shifts: ``lengths`` (rows, shortest first). ``nominate(chunks)`` takes the recent
    chunks, oldest first, each (log predictive, rows, level, spread): the incumbent's log
    predictive of the chunk and the running level and per-observation sd before it (spread 0:
    none yet). For each length W, the shortest suffix of two or more chunks with at least W rows
    is a window; each chunk's log predictive per observation is clipped to within
    ``threshold`` of its sd (spread / sqrt(rows)) of the level before the window, as the CUSUM's
    z-scores are, so one wild row moves it little; the window fires when its mean lies
    ``threshold`` standard errors (spread / sqrt(rows in it)) or more from that level, either side.
    Returns the indices of the first chunks of the windows that fired, each once, shortest first.
    Stateless: it reads the chunks the detector keeps anyway."""

    lengths: tuple[int, ...]
    threshold: float

    def nominate(self, chunks: list[tuple[float, int, float, float]]) -> list[int]:
        out: list[int] = []
        if len(chunks) < 2:
            return out
        for w in self.lengths:
            rows, i = 0, len(chunks)
            while i > 0 and (rows < w or len(chunks) - i < 2):
                i -= 1
                rows += chunks[i][1]
            if rows < w:
                break  # the chunks kept hold no window this long (nor a longer one)
            _, _, level, spread = chunks[i]
            if spread <= 0.0:
                continue
            total = 0.0
            for lp, b, _, _ in chunks[i:]:
                half = self.threshold * spread / math.sqrt(b)
                total += b * min(max(lp / b, level - half), level + half)
            z = (total / rows - level) / (spread / math.sqrt(rows))
            if abs(z) >= self.threshold and i not in out:
                out.append(i)
        return out


@dataclass
class FlatRun:
    """Runs of one value repeated exactly, per column. ``last``: each column's last value; ``run``:
    how many rows the column has held it (its current run); ``start``: the stream index of the
    run's first row; ``fired``: whether the run has nominated already. ``repeats`` and ``pairs``:
    since the regime began (``reset``), over the runs that ended, the rows equal to the row before
    and the rows compared, per column.

    A run of L rows is L - 1 repeats in a row. Its probability is the predictive of a repeat rate
    with a Beta(1/2, 1/2) prior updated on the column's ``repeats`` out of ``pairs``:
    prod_{i < L - 1} (repeats + 1/2 + i) / (pairs + 1 + i), about p^(L - 1) with p = (repeats +
    1/2) / (pairs + 1) once the history is long, and far larger while it is short (with no
    history, a run of 19 has probability 0.13: a first run of small counts is no surprise).
    ``update`` returns the stream index of each run (one per column at most) whose probability
    fell to ``tail`` or below, once per run and only from its third row on. Readings of a continuous quantity repeat about as often as their
    resolution allows (two decimals at an sd of 0.5: 1 row in 180), so three equal readings
    in a row are rare; small counts repeat most rows (Poisson 0.05: 95 %), so they take a run of
    hundreds. The signal only nominates: a challenger restarted at the run then has to win on
    evidence, as for every other signal."""

    last: list[float] = field(default_factory=list)
    run: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    fired: list[bool] = field(default_factory=list)
    repeats: list[int] = field(default_factory=list)
    pairs: list[int] = field(default_factory=list)

    def update(self, rows, first: int, tail: float) -> list[int]:
        """Take the raw rows ``[T, C]`` (an array or lists of the columns' values) of a chunk whose
        first row has stream index ``first``; the run starts that nominate (sorted, each once).
        ``tail`` 0 (a ``surprise`` so large that its normal tail underflows): none ever does."""
        x = np.asarray(rows, dtype=np.float64)
        if x.size == 0:
            return []
        t, width = x.shape
        if len(self.last) != width:  # the first rows (or a state from before this signal)
            self.last, self.run, self.start = [float(v) for v in x[0]], [0] * width, [first] * width
            self.fired, self.repeats, self.pairs = [False] * width, [0] * width, [0] * width
        # each row against the row before it (the first against the column's last value, if any)
        same = x == np.concatenate([np.asarray(self.last)[None], x[:-1]])
        same[0] &= np.asarray(self.run) > 0
        log_tail = math.log(tail) if tail > 0 else -math.inf
        if t <= 8:  # a few rows (point by point): row by row, without the arrays' overhead (the same counts)
            return self._few(x.tolist(), same.tolist(), first, log_tail)
        out: set[int] = set()
        quiet = ~same.any(axis=0)
        for c in range(width):
            if quiet[c]:  # no repeat (most columns of continuous readings): every row ends a run
                if self.run[c]:
                    self.repeats[c] += self.run[c] - 1
                    self.pairs[c] += self.run[c]
                self.pairs[c] += t - 1
                self.last[c], self.run[c], self.start[c], self.fired[c] = float(x[-1, c]), 1, first + t - 1, False
                continue
            # the chunk's runs in this column: the one in progress goes on up to the first row that
            # differs from the row before it, where a new run starts (whole runs at once: a chunk of
            # 10,000 rows of a few values took 0.2 s a column row by row)
            breaks = np.flatnonzero(~same[:, c])
            lengths = np.diff(np.r_[0, breaks, t])
            lengths[0] += self.run[c]
            starts = np.r_[self.start[c], first + breaks]
            fired = [self.fired[c]] + [False] * len(breaks)
            if lengths[0] == 0:  # no run in progress (the column's first row): nothing ends here
                lengths, starts, fired = lengths[1:], starts[1:], fired[1:]
            # the repeats and pairs of the runs that ended before each run
            repeats = self.repeats[c] + np.r_[0, np.cumsum(lengths[:-1] - 1)]
            pairs = self.pairs[c] + np.r_[0, np.cumsum(lengths[:-1])]
            long = np.flatnonzero(lengths >= 3)
            for i, length, rep, pair in zip(long.tolist(), lengths[long].tolist(), repeats[long].tolist(),
                                            pairs[long].tolist()):
                if fired[i]:
                    continue
                # a run's probability only falls as it grows: its length at the chunk's end decides
                if _log_run(rep, pair, length) <= log_tail:
                    fired[i] = True
                    out.add(int(starts[i]))
            self.last[c], self.run[c], self.start[c], self.fired[c] = float(x[-1, c]), int(lengths[-1]), int(starts[-1]), fired[-1]
            self.repeats[c], self.pairs[c] = int(repeats[-1]), int(pairs[-1])
        return sorted(out)

    def _few(self, rows: list[list[float]], same: list[list[bool]], first: int, log_tail: float) -> list[int]:
        out: set[int] = set()
        for k, (row, eq) in enumerate(zip(rows, same)):
            for c, v in enumerate(row):
                if eq[c]:
                    self.run[c] += 1
                else:
                    if self.run[c]:  # a run ended: its repeats, and the change of value after it
                        self.repeats[c] += self.run[c] - 1
                        self.pairs[c] += self.run[c]
                    self.last[c], self.run[c], self.start[c], self.fired[c] = v, 1, first + k, False
                if self.run[c] >= 3 and not self.fired[c]:
                    if _log_run(self.repeats[c], self.pairs[c], self.run[c]) <= log_tail:
                        self.fired[c] = True
                        out.add(self.start[c])
        for c in range(len(self.last)):
            self.last[c] = float(rows[-1][c])
        return sorted(out)

    def defer(self, starts: list[int]) -> None:
        """The runs that began at ``starts`` nominate again at their next row (their nomination came
        when the detector could not use it: a warm-up chunk, or before the level counted)."""
        for c, at in enumerate(self.start):
            if at in starts:
                self.fired[c] = False

    def reset(self) -> None:
        """A new regime: the repeat rates start again (the current runs go on)."""
        self.repeats, self.pairs = [0] * len(self.last), [0] * len(self.last)


def _log_run(repeats: int, pairs: int, length: int) -> float:
    """log P(a run of ``length`` rows) after ``repeats`` repeats in ``pairs`` pairs (``FlatRun``):
    prod_{i < length - 1} (repeats + 1/2 + i) / (pairs + 1 + i)."""
    r, m, n = repeats + 0.5, pairs + 1.0, length - 1.0
    return math.lgamma(r + n) - math.lgamma(r) - math.lgamma(m + n) + math.lgamma(m)


def chi2_quantile(df: int, z: float) -> float:
    """The chi-square quantile with ``df`` degrees of freedom at the standard normal quantile ``z``
    (Wilson and Hilferty's cube: within 3 % of the exact at z = 3 for 1 or 2 degrees of freedom,
    closer for more; further out, above it, a test that fires less: tests/test_signals.py)."""
    k = float(max(df, 1))
    return k * max(1.0 - 2.0 / (9.0 * k) + z * math.sqrt(2.0 / (9.0 * k)), 0.0) ** 3


def shares_moved(new, new_rows: int, old, old_rows: int, particle_weights, threshold: float,
                 dispersion: float = 1.0) -> tuple[bool, float]:
    """(fires, G): did a mixture's components take other shares of the new rows than of the old
    ones? ``new`` and ``old`` ``[M, K]``: each particle's components' shares (mean
    responsibilities, ``component_shares``) of ``new_rows`` and ``old_rows`` rows;
    ``particle_weights`` ``[M]`` (normalised). The two-sample G statistic, averaged over the
    particles and divided by ``dispersion`` (``shares_dispersion``: how much more than independent
    rows' the shares of runs of rows vary in this stream), against ``chi2_quantile(K - 1,
    threshold)``. Each particle is compared with itself, so neither its weights nor its labels
    enter. Mean responsibilities vary less than a multinomial's counts, so the test is
    conservative on independent rows of one mixture."""
    k = int(new.shape[1])
    if k < 2 or new_rows < 1 or old_rows < 1:
        return False, 0.0
    pool = (new_rows * new + old_rows * old) / (new_rows + old_rows)
    g = float((particle_weights * (_g(new, pool, new_rows) + _g(old, pool, old_rows))).sum()) / max(dispersion, 1.0)
    return g >= chi2_quantile(k - 1, threshold), g


def shares_dispersion(blocks, rows: int, particle_weights) -> float:
    """How much more the shares of runs of ``rows`` consecutive rows vary than independent rows'
    would: ``blocks`` ``[M, J, K]``, each particle's shares of J such runs (J >= 2). Their G
    statistic against their pooled shares per degree of freedom ((J - 1)(K - 1)), averaged over
    the particles; at least 1 (1 with fewer than 2 runs). Rows that come in bursts (a cluster's
    rows in runs of 20-50) make a chunk's shares swing far beyond the chi-square's: a new user's
    trial saw 34-38 false alarms per 10,000 such rows in chunks of 50 without it."""
    m, j, k = blocks.shape
    if j < 2 or k < 2 or rows < 1:
        return 1.0
    g = _g(blocks, blocks.mean(1, keepdim=True), rows).sum(-1)  # [M]
    return max(1.0, float((particle_weights * g).sum()) / ((j - 1) * (k - 1)))


def _g(shares, pool, rows: int):
    """The G statistic's terms of ``shares`` (``[..., K]``) of ``rows`` rows against ``pool``:
    2 rows sum_k share_k log(share_k / pool_k), summed over the last axis."""
    return 2.0 * rows * (shares * (shares.clamp_min(1e-300).log() - pool.clamp_min(1e-300).log())).sum(-1)

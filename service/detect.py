"""Change-point detection from SGAIS evidence: a Bayes-factor test between "the model
continues" and "the model restarted at candidate time t".

Per chunk the incumbent SGAIS instance gives log p(chunk | history) (its log predictive).
Cheap signals nominate candidate change points: a chunk whose log predictive per
observation is far from its running level (|z| >= ``surprise``, both directions: a
variance drop makes data *more* likely) or whose annealing-step count spikes. A candidate
starts a **challenger**: a fresh SGAIS instance of the same model, from the prior, fed the
same chunks from t on. After a short training sample (``train`` observations, so that the
comparison does not hinge on how vague the prior is: a partial / intrinsic Bayes factor),

    log BF(t) = [log Z_challenger(t..now) - log Z_challenger(t..t+train)]
                - sum of the incumbent's log predictives over the same chunks

and with a prior probability p of a change at the candidate (hazard h = 1/expected run
length per observation, p = 1 - (1-h)^B for a first chunk of B rows) the posterior
probability of a change at t is sigmoid(log BF + log(p / (1-p))). When it reaches
``threshold`` an Event is reported with that probability as its confidence. With ``adapt``
the challenger replaces the incumbent (its posterior and its history since t), so later
changes are measured against the new regime; the running log-evidence then continues as
log p(y_<t | incumbent) + log p(y_t.. | challenger), the evidence of the model with a
change at t.

A candidate whose first chunk is a training sample on its own (at least ``train`` rows) also
gets a **short-memory** restart: from the posterior given the rows just before it (as many as
its first chunk), compared from its first chunk on (log BF = log p(y_t.. | memory) - the
incumbent's log predictives). Changes that add to the old regime (new mixture components, a
new class balance) keep what still holds, so a restart from the prior, which must learn the
old parameters again, legitimately loses to the incumbent, while a model of the whole history
is slow to give the new part weight; the short memory wins within the chunk. The two
restarts of a candidate share its prior probability of a change (each log(2) less). When a
short memory wins for a unimodal model, the new incumbent is still the restart from the
prior at the change: the memory is old-regime rows, and an incumbent that kept them would
lose to the next restart a few chunks on when the change replaced the old regime.

Candidates come late or early: a CUSUM excursion may begin in noise chunks before the
change. A challenger that ages out while ahead nominates the chunk where its own advantage
began (``_where``), and every challenger is judged against the running level from before its
first chunk (kept with the recent chunks), not the level since, which follows the change. A
short memory that wins at once sits at its nomination, one chunk late when the change's
first chunk did not stand out; ``_earlier`` moves it back when a change one chunk earlier
has the higher evidence.

For models whose posterior has poor local modes (``model.multimodal``: mixtures) a winning
restart must also show that the data moved, not the incumbent: ``_data_moved``.

A challenger retires when it is clearly losing (log BF < ``retire_log_bf``) or older than
``max_age`` observations. Everything random comes from the detector's own generator, saved
with its state; challengers' rows are not saved (they are the stream's own chunks since t,
re-read from the input stream on restore), so the state stays small.

    det = Detector(sampler, DetectorConfig())
    dstate = det.init(seed)
    step = det.update(dstate, seq, chunk, inc_before, inc_after, result)
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from collections.abc import Sequence
from typing import Any, Callable

import torch

from service.sgais import (
    ChunkResult, ExactState, Reservoir, ReservoirWrites, Sampler, SGAISConfig, SGAISState, build_sampler, load_state,
)
from service.sgais.config import ConfigError

MAGIC = "cusp-detector-1"
#: a change's location moves off the chunk boundary the detector found only when another row of
#: that chunk or the one before is more probable by more than this (``Detector._refine``)
SUPPORT_NATS = 3.0


@dataclass(frozen=True)
class DetectorConfig:
    """expected_run_length: prior mean observations between changes (hazard = 1/this);
    threshold: posterior probability of a change needed to report it; max_challengers:
    challengers alive at once; adapt: replace the incumbent by the winning challenger;
    surprise: |z| of a chunk's log predictive per observation, against its running level,
    that nominates a candidate at that chunk; cusum: threshold of a two-sided CUSUM of those
    z-scores (drift 0.5) that nominates the chunk where its excursion began (small
    sustained shifts, point-by-point data); level_shift: a change is reported only if the
    incumbent's mean log predictive per observation since the candidate is this many standard
    errors off its level before it (0: off; it keeps a restart that merely escapes a poor
    posterior mode from counting as a change); step_spike: annealing steps above running mean + this many
    sd that nominate one; train: observations a challenger sees before it is compared (at
    least its first chunk; 0 = max(10, 2 x parameters)); retire_log_bf: a challenger whose
    log BF falls below this is dropped; max_age: observations after which a challenger is
    dropped (0 = 20 x train; at least 8 of its first chunks; at most the reservoir capacity); warmup: chunks of running level needed
    after a start or a change before nominating; smoothing: weight of the newest chunk in
    the running levels (before ``warmup`` chunks, a chunk whose log predictive per
    observation falls below the mean so far is a candidate); enabled: run the detector at all."""

    enabled: bool = True
    expected_run_length: float = 1000.0
    threshold: float = 0.99
    max_challengers: int = 3
    adapt: bool = True
    surprise: float = 3.0
    cusum: float = 5.0
    level_shift: float = 3.0
    step_spike: float = 3.0
    train: int = 0
    retire_log_bf: float = -5.0
    max_age: int = 0
    warmup: int = 5
    smoothing: float = 0.1

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(f"detector: {msg}")

        need(isinstance(self.enabled, bool), "enabled must be true or false")
        need(isinstance(self.adapt, bool), "adapt must be true or false")
        need(_num(self.expected_run_length) and self.expected_run_length > 1, "expected_run_length must be a number > 1")
        need(_num(self.threshold) and 0.5 <= self.threshold < 1.0, "threshold must be a probability in [0.5, 1)")
        need(_int(self.max_challengers) and 1 <= self.max_challengers <= 16, "max_challengers must be an integer in [1, 16]")
        need(_num(self.surprise) and self.surprise > 0, "surprise must be a positive number")
        need(_num(self.cusum) and self.cusum > 0, "cusum must be a positive number")
        need(_num(self.level_shift) and self.level_shift >= 0, "level_shift must be a number >= 0")
        need(_num(self.step_spike) and self.step_spike > 0, "step_spike must be a positive number")
        need(_int(self.train) and 0 <= self.train <= 1_000_000, "train must be an integer in [0, 1000000]")
        need(_num(self.retire_log_bf) and self.retire_log_bf < 0, "retire_log_bf must be a negative number")
        need(_int(self.max_age) and 0 <= self.max_age <= 10_000_000, "max_age must be an integer in [0, 10000000]")
        need(_int(self.warmup) and 2 <= self.warmup <= 10_000, "warmup must be an integer in [2, 10000]")
        need(_num(self.smoothing) and 0 < self.smoothing < 1, "smoothing must be in (0, 1)")

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> "DetectorConfig":
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        bad = sorted(set(values) - known)
        if bad:
            raise ConfigError(f"unknown detector setting(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
        try:
            return cls(**values)
        except TypeError as exc:  # pragma: no cover - defensive
            raise ConfigError(f"detector: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class Event:
    """A detected change point. location: index (0-based, over the whole stream) of the first
    observation of the new regime; chunk: the chunk that starts with it; seq: that chunk's
    sequence number; detected_at: observations seen when it was reported; delay:
    detected_at - location; confidence: posterior probability of the change; log_bayes_factor:
    the challenger's log Bayes factor against the incumbent; adapted: whether the model
    restarted there."""

    location: int
    chunk: int
    seq: int
    detected_at: int
    delay: int
    confidence: float
    log_bayes_factor: float
    log_prior_odds: float
    adapted: bool

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Challenger:
    """A restart of the model at ``start`` (observation index), fed the chunks ``seqs``."""

    start: int
    chunk: int
    seqs: list[int]
    state: SGAISState
    base_log_evidence: float  # the stream's running log-evidence before its first chunk
    first_rows: int
    level: float = 0.0  # the incumbent's running level (log predictive per observation) when it started
    spread: float = 0.0  # and its per-observation sd (0: started during warm-up, no level yet)
    incumbent_all: float = 0.0  # the incumbent's log predictives over all the challenger's chunks
    train_log_z: float | None = None  # its log Z when training ended (None: still training)
    incumbent_lp: float = 0.0  # incumbent's log predictives since training ended
    compared: int = 0  # chunks compared since training ended
    diffs: list[float] = field(default_factory=list)  # per chunk fed from start: its log predictive - the incumbent's
    log_bf: float = 0.0
    memory: int = 0  # leading entries of ``seqs`` fed before ``start`` (a short-memory restart); 0: from the prior
    memory_rows: int = 0
    old_seqs: list[int] = field(default_factory=list)  # chunks just before ``start``, and the incumbent's
    old_fit: float = 0.0  # fit of them (mean log predictive per row) when the challenger started
    reservoir: Reservoir | None = None  # not saved: re-read from the stream's chunks


@dataclass
class Recent:
    """A recent chunk, kept so that a challenger can start where a CUSUM excursion began."""

    seq: int
    chunk: int
    start: int
    base: float
    lp: float  # the incumbent's log predictive of it
    rows: torch.Tensor | None = None  # not saved: re-read from the stream's chunks
    # the running level and per-observation sd before this chunk (spread 0: none yet, or from
    # an earlier regime), the baseline of a challenger that starts here
    level: float = 0.0
    spread: float = 0.0
    # the incumbent's saved state before this chunk, for the exact method only (a few hundred
    # bytes): where within a chunk a change began (``Detector._refine``)
    state: bytes | None = None


@dataclass
class DetectorState:
    """rng: the detector's generator state; offset_n / offset_log_evidence: what the current
    incumbent does not cover since it restarted (0 before any change); chunks: chunks seen;
    level/var/steps_mean/steps_var/count: running level of the incumbent's log predictive per
    observation and of annealing steps since the last (re)start; challengers."""

    rng: torch.Tensor
    offset_n: int = 0
    offset_log_evidence: float = 0.0
    chunks: int = 0
    count: int = 0
    level: float = 0.0
    var: float = 0.0
    steps_mean: float = 0.0
    steps_var: float = 0.0
    events: int = 0
    cusum_lo: float = 0.0
    cusum_hi: float = 0.0
    lo_from: int = 0  # index into recent where the excursions began
    hi_from: int = 0
    challengers: list[Challenger] = field(default_factory=list)
    recent: list[Recent] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        head = {
            "magic": MAGIC, "offset_n": self.offset_n, "offset_log_evidence": self.offset_log_evidence.hex(),
            "chunks": self.chunks, "count": self.count, "level": self.level.hex(), "var": self.var.hex(),
            "steps_mean": self.steps_mean.hex(), "steps_var": self.steps_var.hex(), "events": self.events,
            "cusum": [self.cusum_lo.hex(), self.cusum_hi.hex(), self.lo_from, self.hi_from],
            "recent": [[r.seq, r.chunk, r.start, r.base.hex(), r.lp.hex(), r.level.hex(), r.spread.hex()]
                       + ([base64.b64encode(r.state).decode()] if r.state is not None else []) for r in self.recent],
            "rng": base64.b64encode(self.rng.numpy().tobytes()).decode(),
            "challengers": [
                {"start": c.start, "chunk": c.chunk, "seqs": c.seqs, "base": c.base_log_evidence.hex(),
                 "first_rows": c.first_rows, "level": [c.level.hex(), c.spread.hex(), c.incumbent_all.hex()], "train": None if c.train_log_z is None else c.train_log_z.hex(),
                 "inc": c.incumbent_lp.hex(), "compared": c.compared, "bf": c.log_bf.hex(),
                 "diffs": [d.hex() for d in c.diffs], "memory": [c.memory, c.memory_rows],
                 "old": [c.old_seqs, c.old_fit.hex()],
                 "state": base64.b64encode(c.state.to_bytes()).decode()}
                for c in self.challengers
            ],
        }
        return json.dumps(head, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "DetectorState":
        """Challengers come back without their rows; ``Detector.restore`` refills them."""
        h = json.loads(raw)
        if h.get("magic") != MAGIC:
            raise ValueError("not a cusp detector state")
        f = float.fromhex
        rng = torch.frombuffer(bytearray(base64.b64decode(h["rng"])), dtype=torch.uint8).clone()
        chs = [
            Challenger(start=c["start"], chunk=c["chunk"], seqs=list(c["seqs"]), base_log_evidence=f(c["base"]),
                       first_rows=c["first_rows"], level=f(c["level"][0]), spread=f(c["level"][1]),
                       incumbent_all=f(c["level"][2]), train_log_z=None if c["train"] is None else f(c["train"]),
                       incumbent_lp=f(c["inc"]), compared=c["compared"], log_bf=f(c["bf"]),
                       diffs=[f(d) for d in c["diffs"]], memory=c.get("memory", [0, 0])[0],
                       memory_rows=c.get("memory", [0, 0])[1], old_seqs=list(c.get("old", [[], ""])[0]),
                       old_fit=f(c["old"][1]) if "old" in c else 0.0,
                       state=load_state(base64.b64decode(c["state"])))
            for c in h["challengers"]
        ]
        return cls(rng=rng, offset_n=h["offset_n"], offset_log_evidence=f(h["offset_log_evidence"]), chunks=h["chunks"],
                   count=h["count"], level=f(h["level"]), var=f(h["var"]), steps_mean=f(h["steps_mean"]),
                   steps_var=f(h["steps_var"]), events=h["events"], challengers=chs,
                   cusum_lo=f(h["cusum"][0]), cusum_hi=f(h["cusum"][1]), lo_from=h["cusum"][2], hi_from=h["cusum"][3],
                   recent=[Recent(seq=r[0], chunk=r[1], start=r[2], base=f(r[3]), lp=f(r[4]),
                                  level=f(r[5]) if len(r) > 5 else 0.0, spread=f(r[6]) if len(r) > 6 else 0.0,
                                  state=base64.b64decode(r[7]) if len(r) > 7 else None)
                           for r in h["recent"]])

    def oldest_seq(self) -> int | None:
        """The first input seq a restore needs (None: no challengers)."""
        return min([c.seqs[0] for c in self.challengers if c.seqs] + [r.seq for r in self.recent], default=None)


@dataclass(frozen=True)
class Refined:
    """A change placed at a row (``Detector._refine``): its stream index, the index into the recent
    chunks of the chunk holding it, the stream-wide log-evidence up to it, and a restart there:
    its posterior and log-evidence after ``rows`` (featurized, from the change to now)."""

    location: int
    chunk: int
    base: float
    post: torch.Tensor
    log_evidence: float
    rows: torch.Tensor


@dataclass
class Step:
    """What one chunk did to the detector. result: the incumbent's ChunkResult with ``n`` and
    ``log_evidence`` made stream-wide (changes included); promoted: the challenger state the
    incumbent must become, with ``writes`` rewriting its reservoir (None: keep the incumbent)."""

    state: DetectorState
    result: ChunkResult
    events: list[Event]
    promoted: SGAISState | None = None
    reservoir: Reservoir | None = None
    writes: ReservoirWrites | None = None


def training_rows(model, config: DetectorConfig) -> int:
    """Observations a restart sees before it is compared (``DetectorConfig.train``; 0 = auto). A
    restart must not be charged for the vagueness of its prior. A model with a frame from data
    (models/timeseries.py) restarts in the incumbent's frame, so its prior is already in the
    data's units, and the minimal training sample of an intrinsic Bayes factor suffices (Berger
    and Pericchi 1996): as many rows as parameters (coefficients and noise variance). Others:
    max(10, 2 x parameters). It is also the stream's resolution: changes of several models closer
    than this (or than a chunk) are one change (``model_averaged_changes``'s window)."""
    framed = bool(getattr(model, "warmup", 0))
    return config.train or (model.dim if framed else max(10, 2 * model.dim))


def stream_window(models, config: DetectorConfig, chunk_rows: int = 0) -> int:
    """The stream's resolution: events of its ``models`` closer than this are one change (the
    largest ``training_rows``, at least ``chunk_rows``); ``model_averaged_changes``'s window offline,
    in replay, in the API and in ``cusp.Detector`` alike."""
    return max(chunk_rows, max(training_rows(m, config) for m in models))


class Detector:
    """Stateless like Sampler: everything that changes lives in DetectorState."""

    def __init__(self, sampler: Sampler, config: DetectorConfig | None = None):
        self.sampler = sampler
        self.config = config or DetectorConfig()
        model = sampler.model
        self.train = training_rows(model, self.config)
        # a challenger must keep all its rows in its reservoir (no sampling), so it retires
        # before outgrowing the capacity; then promoting it hands over its exact history
        self.max_age = self.config.max_age or 20 * self.train
        self.capacity = sampler.config.reservoir_capacity
        self.log_hazard = -math.log(self.config.expected_run_length)
        self.multimodal = bool(getattr(model, "multimodal", False))
        self.exact = getattr(sampler, "method", "sgais") == "exact"

    def init(self, seed: int) -> DetectorState:
        g = torch.Generator().manual_seed(int(seed))
        return DetectorState(rng=g.get_state())

    # ------------------------------------------------------------------------------------
    def restore(self, state: DetectorState, rows_of: Callable[[list[int]], dict[int, torch.Tensor]]) -> DetectorState:
        """Refill challengers' reservoirs and the recent chunks from the raw rows of their input
        chunks: ``rows_of(seqs)`` -> {seq: rows [B, C]}, asked once for every seq needed."""
        need = sorted({q for c in state.challengers for q in c.seqs} | {r.seq for r in state.recent})
        raw = rows_of(need) if need else {}
        for c in state.challengers:
            rows = self.sampler.model.featurize(torch.cat([raw[q] for q in c.seqs])) if c.seqs else None
            c.reservoir = self._reservoir(rows)
            if c.reservoir.size != c.state.n:
                raise ValueError(f"challenger at {c.start}: {c.reservoir.size} rows for n={c.state.n}")
        for r in state.recent:
            r.rows = raw[r.seq]
        return state

    def _reservoir(self, rows: torch.Tensor | None) -> Reservoir:
        return Reservoir(self.sampler.config.reservoir_capacity, self.sampler.model.feature_width,
                         None if rows is None else rows.to(torch.float64))

    def with_memory(self, rows: int) -> bool:
        """Does a candidate whose first chunk has ``rows`` rows get a short-memory restart too?
        Only when that chunk is a training sample on its own: with smaller chunks (point by
        point) a restart that is compared at once is placed by its nomination, often a few
        rows late, and the restart from the prior, placed by its own comparison, does better."""
        return rows >= self.train

    def _kinds(self, first: Recent) -> tuple[bool, ...]:
        """The restarts a candidate at ``first`` gets: from the prior, and with a short memory."""
        return (False, True) if self.with_memory(int(first.rows.shape[0])) else (False,)

    def restart_log_prior_odds(self, rows: int) -> float:
        """The prior odds of one restart: a change at the candidate is split evenly between the
        ways its new regime may start (from the prior, or from a short memory, when it has one)."""
        return self.log_prior_odds(rows) - (math.log(2.0) if self.with_memory(rows) else 0.0)

    def log_prior_odds(self, rows: int) -> float:
        """log p/(1-p) with p = 1 - (1 - h)^rows: a change within the candidate's first chunk."""
        log_none = rows * math.log1p(-math.exp(self.log_hazard))
        return math.log(-math.expm1(log_none)) - log_none

    # ------------------------------------------------------------------------------------
    def update(self, state: DetectorState, seq: int, chunk: torch.Tensor, before: SGAISState,
               after: SGAISState, result: ChunkResult) -> Step:
        """One chunk: ``before``/``after`` are the incumbent's states around it and ``result``
        its ChunkResult. Pure: ``state`` is not modified (challengers are copied)."""
        cfg = self.config
        g = torch.Generator()
        g.set_state(state.rng)
        new = replace(state, challengers=[replace(c) for c in state.challengers], chunks=state.chunks + 1,
                      recent=list(state.recent))
        b = result.rows
        scored = b - result.conditioned  # rows in the log predictive (not a model's warm-up)
        start = new.offset_n + before.n  # stream index of this chunk's first observation
        base = new.offset_log_evidence + before.log_evidence
        lp = result.log_predictive

        # 1. feed the chunk to every challenger; retire losers and the old. One that ages out
        # while ahead started too early (a CUSUM excursion that began in noise before the
        # change): its own comparison says where its advantage began, a candidate for step 2.
        kept: list[Challenger] = []
        again: list[int] = []
        for c in new.challengers:
            if not self._feed(c, chunk, seq, lp):
                continue  # a challenger that cannot take the data is no evidence of a change
            if c.compared and c.log_bf < cfg.retire_log_bf:
                continue
            if c.state.n > self.capacity or c.state.n - c.memory_rows > max(self.max_age, 8 * c.first_rows):
                at = self._where(c)
                if c.compared and c.log_bf > 0.0 and at > 0:
                    again.append(c.seqs[c.memory + at])
                continue
            kept.append(c)
        new.challengers = kept

        # 2. nominate candidates: this chunk when it stands out from the running level, or
        # where a CUSUM excursion of those z-scores began
        counted = new.count >= cfg.warmup
        if scored:
            new.recent.append(Recent(seq=seq, chunk=new.chunks - 1, start=start, base=base, lp=lp, rows=chunk,
                                     level=new.level, spread=math.sqrt(max(new.var, 1e-12)) if counted else 0.0,
                                     state=before.to_bytes() if self.exact and b > 1 else None))
        x, steps = lp / max(scored, 1), float(result.annealing_steps)
        if not scored:
            pass  # a warm-up chunk, conditioned on: nothing to compare
        elif counted:
            sd = math.sqrt(max(new.var, 1e-12) / scored)
            z = (x - new.level) / sd
            spike = steps > new.steps_mean + cfg.step_spike * math.sqrt(max(new.steps_var, 0.25)) + 1.0
            starts = [len(new.recent) - 1] if abs(z) >= cfg.surprise or spike else []
            z = max(-cfg.surprise, min(cfg.surprise, z))  # winsorised: one outlier moves neither level nor CUSUM much
            if new.cusum_lo == 0.0:
                new.lo_from = len(new.recent) - 1
            if new.cusum_hi == 0.0:
                new.hi_from = len(new.recent) - 1
            new.cusum_lo = min(0.0, new.cusum_lo + z + 0.5)
            new.cusum_hi = max(0.0, new.cusum_hi + z - 0.5)
            # an excursion that began before the rows kept starts where a memory and earlier
            # rows still fit before it (for ``_data_moved``)
            first, before_rows = 0, 0
            while self.multimodal and first < len(new.recent) - 1 and before_rows < 2 * max(self.train, b):
                before_rows += int(new.recent[first].rows.shape[0])
                first += 1
            if new.cusum_lo <= -cfg.cusum:
                starts.append(max(new.lo_from, first))
                new.cusum_lo = 0.0
            if new.cusum_hi >= cfg.cusum:
                starts.append(max(new.hi_from, first))
                new.cusum_hi = 0.0
            starts += [j for j, r in enumerate(new.recent) if r.seq in again and j >= first]
            taken = {c.start for c in new.challengers}
            for i in sorted(set(starts)):
                if new.recent[i].start in taken:
                    continue
                for memory in self._kinds(new.recent[i]):
                    if len(new.challengers) >= cfg.max_challengers:
                        weakest = self._weakest(new.challengers)
                        if not weakest.compared:
                            break  # all still training: keep the earlier candidates
                        new.challengers.remove(weakest)
                    c = self._challenger(g, new.recent, i, memory, before, frame=before)
                    if c is not None:
                        # the baseline is the level before the candidate: a CUSUM start lies
                        # chunks back, and the level since has followed the change part way
                        r = new.recent[i]
                        c.level, c.spread = (r.level, r.spread) if r.spread > 0.0 else (new.level, math.sqrt(max(new.var, 1e-12)))
                        new.challengers.append(c)
            x = new.level + z * sd
        elif new.count >= 1 and x < new.level:
            # still learning: a stationary stream's log predictive per observation rises as the
            # posterior sharpens, so a chunk below the level so far is a candidate already
            for memory in self._kinds(new.recent[-1]):
                if len(new.challengers) < cfg.max_challengers:
                    c = self._challenger(g, new.recent, len(new.recent) - 1, memory, before, frame=before)
                    if c is not None:
                        c.level = new.level
                        new.challengers.append(c)

        # 3. did one win? (An earlier restart also beats an incumbent that a later change hurts,
        # so the winner's own comparison places the change: ``_where``.)
        events: list[Event] = []
        while True:
            best, best_post = None, -math.inf
            for c in new.challengers:
                post = c.log_bf + self.restart_log_prior_odds(c.first_rows)
                if c.compared and post > best_post and self._moved(c):
                    best, best_post = c, post
            confidence = 0.0 if best is None else _sigmoid(best_post)
            if best is None or confidence < cfg.threshold or self._data_moved(best, after, new.recent, new.challengers):
                break
            new.challengers.remove(best)  # the incumbent moved, not the data: no change here
        step = Step(state=new, result=result, events=events)
        if best is not None and confidence >= cfg.threshold:
            # place the change where the winner's advantage starts; with adapt, restart there
            at = self._where(best)
            fed = best.seqs[best.memory:]
            i = next((j for j, r in enumerate(new.recent) if r.seq == fed[at]), None)
            winner = best
            # For unimodal models the new incumbent restarts from the prior even when a short
            # memory won: the memory is rows of the old regime, and an incumbent that keeps them
            # loses at once to the next restart when the change replaced the old regime (seen
            # as false alarms a few chunks after changes of regression coefficients). Mixtures
            # keep it: a restart from the prior may land in a poor mode.
            memory = best.memory > 0 and self.multimodal
            earlier = best.memory > 0 and not self.multimodal and at == 0 and i is not None and i > 0 \
                and self._earlier(g, new.recent, i, best, before)
            if earlier:
                i -= 1
            if i is not None and cfg.adapt and (at or earlier or (best.memory > 0 and not memory)):
                winner = self._challenger(g, new.recent, i, memory, frame=before)
                if winner is None or winner.seqs[winner.memory:] != [r.seq for r in new.recent[i:]]:
                    winner = best  # the restart failed on some chunk: keep the one that did not
            where = new.recent[i] if i is not None else None
            location = where.start if where is not None else best.start
            refined = self._refine(new.recent, i, before) if where is not None else None
            if refined is not None:
                where, location = new.recent[refined.chunk], refined.location
            n_total = new.offset_n + after.n
            events.append(Event(location=location, chunk=where.chunk if where else best.chunk,
                                seq=where.seq if where else fed[at],
                                detected_at=n_total, delay=n_total - location, confidence=confidence,
                                log_bayes_factor=best.log_bf, log_prior_odds=self.restart_log_prior_odds(best.first_rows),
                                adapted=cfg.adapt))
            new.events += 1
            new.challengers = []
            if cfg.adapt and self.multimodal:  # the new incumbent's rows stay, as rows before later candidates
                new.recent = [replace(r, spread=0.0) for r in new.recent if r.seq >= winner.seqs[0]]
            else:
                new.recent = []
            new.count, new.cusum_lo, new.cusum_hi = 0, 0.0, 0.0  # a new regime: the running level starts again
            if cfg.adapt and refined is not None and refined.rows.shape[0] <= self.capacity:
                # the exact method restarts at the row itself: the evidence is the incumbent's up
                # to it, then the restart's from it
                new.offset_n = refined.location
                new.offset_log_evidence = refined.base
                fresh = ExactState(post=refined.post, log_evidence=refined.log_evidence, n=int(refined.rows.shape[0]),
                                   chunks=len(winner.seqs), rng=winner.state.rng)
                reservoir = self._reservoir(refined.rows)
                step.promoted, step.reservoir = fresh, reservoir
                step.writes = ReservoirWrites(torch.arange(reservoir.size, dtype=torch.int64), reservoir.data.clone())
                after = fresh
            elif cfg.adapt:
                # the new regime's evidence is the winner's log Z less that of its memory (the
                # rows before the change it started from): log p(y_t.. | memory)
                new.offset_n = winner.start - winner.memory_rows
                new.offset_log_evidence = winner.base_log_evidence - (winner.train_log_z if winner.memory else 0.0)
                rows = winner.reservoir.data
                step.promoted, step.reservoir = winner.state, winner.reservoir
                step.writes = ReservoirWrites(torch.arange(rows.shape[0], dtype=torch.int64), rows.clone())
                after = winner.state
        elif scored:
            self._track(new, x, scored, steps)
        # keep the recent chunks a challenger may still start from
        end = start + b
        needed = min((q for c in new.challengers for q in c.old_seqs[:1] + c.seqs[:1]), default=None)
        keep = self.max_age + (2 * max(self.train, b) if self.multimodal else 0)  # a CUSUM start, a memory, rows before
        while len(new.recent) > 1 and new.recent[0].start < end - keep and (
                needed is None or new.recent[0].seq < needed):
            new.recent.pop(0)
            new.lo_from, new.hi_from = max(0, new.lo_from - 1), max(0, new.hi_from - 1)
        new.rng = g.get_state()
        step.result = replace(result, n=new.offset_n + after.n, log_evidence=new.offset_log_evidence + after.log_evidence)
        return step

    def _refine(self, recent: list[Recent], i: int, frame) -> "Refined | None":
        """Where within a chunk the change began, for the exact method (chunks place a change at
        their first row otherwise): the row j of chunk i, or of the chunk before it, that maximises
        log p(rows before j | incumbent) + log p(rows from j to now | a restart at j), the change's
        most probable place (the prior of a change is the same for every row), or the chunk's own
        first row when that is within ``SUPPORT_NATS`` of it (a likelihood ratio of e^3, about the
        95% level of a chi-square with one degree of freedom, 2 x 3 = 6 > 3.84); with what a
        restart there needs. None: nothing to refine (another method, rows of one, no saved state)."""
        lo = i - 1 if i > 0 and recent[i - 1].state is not None else i
        if not self.exact or recent[lo].state is None or any(r.rows is None for r in recent[lo:]):
            return None
        span = sum(int(r.rows.shape[0]) for r in recent[lo : i + 1])
        if span < 2:
            return None
        model = self.sampler.model
        rows = model.featurize(torch.cat([r.rows for r in recent[lo:]]).to(torch.float64))
        with torch.inference_mode():
            post = load_state(recent[lo].state).post
            fresh = model.exact_restart(frame.post)
            scores, befores = [], []
            before = 0.0
            for j in range(span):
                if j:
                    post, lp = model.exact_update(post, rows[j - 1 : j])
                    before += lp
                scores.append(before + model.exact_update(fresh, rows[j:])[1])
                befores.append(before)
            # the rows within SUPPORT_NATS of the best are the change's support set: of those, the
            # one nearest the chunk boundary the detector found (a boundary the data do not reject
            # stays where it was)
            top = max(scores)
            at = sum(int(r.rows.shape[0]) for r in recent[lo:i])
            j = min((k for k, v in enumerate(scores) if v >= top - SUPPORT_NATS), key=lambda k: (abs(k - at), k))
            before = befores[j]
            new_post, lp_new = model.exact_update(fresh, rows[j:])
        ends = [r.start + int(r.rows.shape[0]) for r in recent[lo:]]
        chunk = lo + next(k for k, e in enumerate(ends) if recent[lo].start + j < e)
        return Refined(location=recent[lo].start + j, chunk=chunk, base=recent[lo].base + before,
                       post=new_post, log_evidence=lp_new, rows=rows[j:])

    def _fit(self, state: SGAISState, rows: torch.Tensor) -> float:
        """Mean over raw ``rows`` of the log posterior predictive of each row under ``state``."""
        return self.sampler.log_fit(state, self.sampler.model.featurize(rows.to(torch.float64)))

    def _rows_before(self, recent: list[Recent], i: int) -> tuple[list[int], torch.Tensor | None]:
        """The chunks just before ``recent[i]``: at least ``train`` rows and as many as its own."""
        want, j, got = max(self.train, int(recent[i].rows.shape[0])), i, 0
        while j > 0 and got < want:
            j -= 1
            got += int(recent[j].rows.shape[0])
        if got < self.train:
            return [], None
        return [r.seq for r in recent[j:i]], torch.cat([r.rows for r in recent[j:i]])

    def _data_moved(self, c: Challenger, incumbent: SGAISState, recent: list[Recent],
                    others: list[Challenger] = ()) -> bool:
        """Is the winner's advantage about the data since the candidate? Two ways a restart wins
        although nothing changed, both seen with mixtures, whose posteriors have poor modes:
        the incumbent moved (its fit of the rows just before the challenger's own moved as
        much, in the same direction, as its fit of the rows since: particles leaving a poor
        mode improve every row), or the challenger is simply the better fit (it explains those
        earlier rows at least as well as the incumbent does, though it never saw them). After a
        change, a model of the new regime explains the old one worse. A short-memory restart
        did see rows of the old regime, so its sibling from the prior (same start, among
        ``others``) answers that question for it while it lives. (No earlier rows kept: True.)"""
        if not self.multimodal:
            return True  # one mode (log-concave or conjugate posteriors): nothing to escape
        rows = {r.seq: r.rows for r in recent}
        if not c.old_seqs or any(q not in rows for q in c.old_seqs):
            return True
        old = torch.cat([rows[q] for q in c.old_seqs])
        now = self._fit(incumbent, old)
        old_shift = now - c.old_fit
        new_shift = c.incumbent_all / (c.state.n - c.memory_rows) - c.level
        if c.spread > 0.0 and old_shift * new_shift > 0 and abs(old_shift) >= 0.5 * abs(new_shift):
            return False  # (not during warm-up, when a model still learning improves on every row)
        judge = c
        if c.memory:
            judge = next((o for o in others if o.start == c.start and not o.memory and o.train_log_z is not None), c)
        return self._fit(judge.state, old) < now

    def _moved(self, c: Challenger) -> bool:
        """Did the incumbent's own predictive move since the challenger started? A restart can
        beat an incumbent whose particles are stuck in a poor mode (mixtures) although nothing
        changed; a change of the data moves the incumbent's log predictive per observation off
        its running level (down, or up when the data become more concentrated)."""
        spread = c.spread
        if spread <= 0.0:
            return True
        n = c.state.n - c.memory_rows
        return abs(c.incumbent_all / n - c.level) * math.sqrt(n) / spread >= self.config.level_shift

    @staticmethod
    def _weakest(chs: list[Challenger]) -> Challenger:
        """The challenger to drop for a new candidate: the lowest log BF among those compared,
        else one still training (which the caller then keeps)."""
        return min(chs, key=lambda c: (not c.compared, c.log_bf))

    def _challenger(self, g: torch.Generator, recent: list[Recent], i: int, memory: bool = False,
                    incumbent: SGAISState | None = None, frame: SGAISState | None = None) -> Challenger | None:
        """A restart at ``recent[i]``, fed ``recent[i:]`` (up to this chunk). From the prior, or
        with ``memory`` from the posterior given the last rows before the change (at least
        ``train`` of them, and as many as the restart's first chunk has): a change that adds to
        the old regime (a new cluster, a new class balance) keeps what still holds, so it is
        not charged for learning the old parameters again, while a model with the whole
        history is slow to give the new part weight. None: not enough rows before ``i``.
        With ``incumbent`` (its state at the candidate) the challenger keeps its fit of those
        rows, for ``_data_moved``."""
        if memory and not self.with_memory(int(recent[i].rows.shape[0])):
            return None
        seed = int(torch.randint(0, 2**62, (1,), generator=g))
        first = recent[i]
        state = self.sampler.init(seed) if frame is None else self.sampler.restart(seed, frame)
        c = Challenger(start=first.start, chunk=first.chunk, seqs=[], state=state,
                       base_log_evidence=first.base, first_rows=int(first.rows.shape[0]), reservoir=self._reservoir(None))
        mem_seqs: list[int] = []
        if memory:
            mem_seqs, mem_rows = self._rows_before(recent, i)
            if mem_rows is None or mem_rows.shape[0] + c.first_rows > self.capacity:
                return None
        old_seqs, old_rows = self._rows_before(recent, i - len(mem_seqs)) if self.multimodal else ([], None)
        if incumbent is not None and old_rows is not None:
            c.old_seqs, c.old_fit = old_seqs, self._fit(incumbent, old_rows)
        if memory:
            for r in recent[i - len(mem_seqs):i]:
                if self._advance(c, r.rows, r.seq) is None:
                    return None
            c.memory, c.memory_rows, c.train_log_z = len(c.seqs), int(mem_rows.shape[0]), c.state.log_evidence
        for r in recent[i:]:
            if not self._feed(c, r.rows, r.seq, r.lp):
                break
        return c if c.seqs[c.memory:] else None

    def _advance(self, c: Challenger, rows: torch.Tensor, seq: int) -> ChunkResult | None:
        """One chunk into a challenger's sampler, reservoir and seqs (modified in place, the
        shared reservoir and list copied first); None if it cannot take it."""
        try:
            st, res, writes = self.sampler.update(c.state, rows, c.reservoir)
        except (ValueError, RuntimeError, FloatingPointError):
            return None
        c.reservoir = c.reservoir.copy()
        c.reservoir.apply(writes)
        c.state, c.seqs = st, [*c.seqs, seq]
        return res

    def _feed(self, c: Challenger, rows: torch.Tensor, seq: int, incumbent_lp: float) -> bool:
        """One chunk into a challenger, compared with the incumbent's log predictive of it;
        False if it cannot take it."""
        res = self._advance(c, rows, seq)
        if res is None:
            return False
        st = c.state
        # a restart's warm-up rows are not in its log predictive: compare it with the incumbent's
        # share of the rows it scored (its warm-up lies inside its training sample, so log BF is exact)
        c.diffs = [*c.diffs, res.log_predictive - incumbent_lp * (res.rows - res.conditioned) / res.rows]
        c.incumbent_all += incumbent_lp
        if c.train_log_z is None:
            if st.n >= self.train:
                c.train_log_z = st.log_evidence
        else:
            c.incumbent_lp += incumbent_lp
            c.compared += 1
            c.log_bf = (st.log_evidence - c.train_log_z) - c.incumbent_lp
        return True

    @staticmethod
    def _where(c: Challenger, support: float = 1.0) -> int:
        """Index into ``c.seqs`` of the first chunk of the new regime. The running sum of the
        challenger's log predictive minus the incumbent's falls or stays flat before a change
        (a restart does no better than a model with more data of the same regime) and climbs
        after it; the change is placed after the last chunk whose running sum is within
        ``support`` nats of its minimum (the late end of a 1-nat likelihood support set, since
        a flat stretch before the climb is still the old regime)."""
        sums, run = [0.0], 0.0
        for d in c.diffs[:-1]:
            run += d
            sums.append(run)
        low = min(sums)
        return max(k for k, v in enumerate(sums) if v <= low + support)

    def _earlier(self, g: torch.Generator, recent: list[Recent], i: int, best: Challenger, frame: SGAISState) -> bool:
        """A short memory that wins at once is placed at its own first chunk, which is where it
        was nominated: one chunk late when the change's first chunk was not surprising enough
        to nominate. Is a change one chunk earlier more probable? Same prior for either
        place, so compare log p(y_{i-1}.. | memory before i-1) with the incumbent's log
        predictive of chunk i-1 plus log p(y_i.. | memory before i)."""
        alt = self._challenger(g, recent, i - 1, True, frame=frame)
        if alt is None or not alt.memory:
            return False
        later = recent[i - 1].lp + best.state.log_evidence - best.train_log_z
        return alt.state.log_evidence - alt.train_log_z > later

    def _track(self, s: DetectorState, x: float, b: int, steps: float) -> None:
        """Running level (exponentially weighted; plain mean over the first chunks)."""
        w = max(self.config.smoothing, 1.0 / (s.count + 1))
        if s.count == 0:
            s.level, s.var, s.steps_mean, s.steps_var = x, 0.0, steps, 0.0
        else:
            d, ds = x - s.level, steps - s.steps_mean
            s.level += w * d
            s.var = (1 - w) * (s.var + w * b * d * d)
            s.steps_mean += w * ds
            s.steps_var = (1 - w) * (s.steps_var + w * ds * ds)
        s.count += 1


class OfflineRun:
    """One model with its detector over chunks in memory (``cusp replay --detect``, benchmarks,
    tests): ``step(chunk) -> (ChunkResult, events)`` with stream-wide ``n`` and log-evidence.
    Seeded like the service: ``seed`` is the model's seed, the detector's is derived from it."""

    def __init__(self, sampler: Sampler, seed: int, config: DetectorConfig | None = None):
        self.sampler = sampler
        self.detector = Detector(sampler, config) if (config or DetectorConfig()).enabled else None
        self.state, self.reservoir = sampler.init(seed), sampler.new_reservoir()
        self.dstate = self.detector.init(detector_seed(seed)) if self.detector else None
        self.chunks = 0

    def step(self, chunk: torch.Tensor) -> tuple[ChunkResult, list[Event]]:
        new, result, writes = self.sampler.update(self.state, chunk, self.reservoir)
        self.reservoir.apply(writes)
        events: list[Event] = []
        if self.detector is not None:
            step = self.detector.update(self.dstate, self.chunks, chunk, self.state, new, result)
            self.dstate, result, events = step.state, step.result, step.events
            if step.promoted is not None:
                new, self.reservoir = step.promoted, step.reservoir.copy()
        self.state = new
        self.chunks += 1
        return result, events


def detect_series(data, model_spec: str, chunk_size: int = 500, seed: int = 0, config: DetectorConfig | None = None,
                  sampler_config: SGAISConfig | None = None, target: int | None = None,
                  on_chunk: Callable[[ChunkResult, list[Event]], None] | None = None) -> list[Event]:
    """Run SGAIS with the detector over ``data [T, C]`` offline; the change points found."""
    from models import build_model

    x = torch.as_tensor(data, dtype=torch.float64)
    if x.dim() == 1:
        x = x[:, None]
    model = build_model(model_spec, x.shape[1], target)
    run = OfflineRun(build_sampler(model, sampler_config or SGAISConfig()), seed, config or DetectorConfig())
    events: list[Event] = []
    for lo in range(0, x.shape[0], chunk_size):
        result, found = run.step(x[lo : lo + chunk_size])
        events += found
        if on_chunk is not None:
            on_chunk(result, found)
    return events


def detect_stream(data, model_specs: Sequence[str] | None = None, chunk_size: int = 500, seed: int = 0,
                  config: DetectorConfig | None = None, sampler_config: SGAISConfig | None = None,
                  target: int | None = None) -> tuple[dict[str, list[Event]], list["StreamChange"]]:
    """A stream's models with their detectors over ``data [T, C]`` offline, seeded as the service
    seeds a stream's models (model i: ``service.runtime.seed_for(seed, i)``), and the stream's answer:
    (each model's events, the model-averaged change points). ``model_specs`` None: the default
    portfolio for the data's width (``models.registry.default_portfolio``)."""
    from models import build_model
    from models.registry import default_portfolio
    from service.runtime import seed_for

    x = torch.as_tensor(data, dtype=torch.float64)
    if x.dim() == 1:
        x = x[:, None]
    specs = list(model_specs or default_portfolio(x.shape[1]))
    cfg = config or DetectorConfig()
    runs = {spec: OfflineRun(build_sampler(build_model(spec, x.shape[1], target), sampler_config or SGAISConfig()),
                             seed_for(seed, i), cfg) for i, spec in enumerate(specs)}
    events: dict[str, list[Event]] = {spec: [] for spec in specs}
    answer = StreamAnswer(specs, stream_window([r.sampler.model for r in runs.values()], cfg), cfg.threshold)
    changes: list[StreamChange] = []
    for lo in range(0, x.shape[0], chunk_size):
        chunk = x[lo : lo + chunk_size]
        evidence, new = {}, {}
        for spec, run in runs.items():
            result, new[spec] = run.step(chunk)
            events[spec] += new[spec]
            evidence[spec] = (result.n, result.log_evidence)
        changes += answer.chunk(chunk.shape[0], evidence, new)
    return events, sorted(changes, key=lambda c: c.location)


@dataclass(frozen=True)
class StreamChange:
    """A change point of a stream with several models, averaged over them: location (from the
    model that weighs most in its support), detected_at (observations seen when the bound below
    first reached the threshold), confidence (that bound), and each supporting model's
    posterior probability and event confidence at that time."""

    location: int
    detected_at: int
    confidence: float
    support: dict[str, tuple[float, float]]

    def to_dict(self) -> dict:
        return asdict(self)


class StreamAnswer:
    """A stream's change points from its models' events, weighted by the models' posterior
    probabilities, one chunk at a time (the service's workers, ``cusp replay``, ``detect_stream``
    and ``cusp.Detector`` all use this class, so they give the same answer):

        P(change near l | data) = sum_m p(m | data) P(change near l | data, m)
                                >= sum over models m with an event within ``window`` of l of p(m | data) x its confidence

    (a model with no such event counts 0: a lower bound). After each chunk every event reported
    so far (each model's events are candidates, in the order they were first reported) that is not
    within ``window`` of a change already found is checked; the first whose bound reaches
    ``threshold`` becomes a stream change, located where the model that weighs most in its support
    put it. A misspecified model that misses a change (a 3-component mixture when 3 clusters
    become 5) does not hide it, and one that fires alone while the data overwhelmingly favour the
    others (posterior probability near 0) does not raise one. With one model p = 1 and its events
    are the stream's (less those within ``window`` of an earlier one).

    ``window``: the stream's resolution (``stream_window``: the largest training sample), widened
    to the largest chunk seen (changes inside one chunk are one change).

    The state (``to_dict``/``load``, versioned) keeps the last ``MAX_EVENTS`` events and the last
    ``MAX_CHANGES`` changes: enough for candidates that can still be decided, bounded however long
    the stream runs."""

    VERSION = 1
    MAX_EVENTS = 256
    MAX_CHANGES = 64

    def __init__(self, models: Sequence[str], window: int, threshold: float = 0.99,
                 log_prior: dict[str, float] | None = None):
        self.models = sorted(models)
        if not self.models:
            raise ValueError("a stream answer needs at least one model")
        self.window, self.threshold = int(window), float(threshold)
        self.log_prior = None if log_prior is None else {m: float(log_prior[m]) for m in self.models}
        self.events: list[tuple[int, int, str, float]] = []  # (detected_at, location, model, confidence), report order
        self.changes: list[int] = []  # locations of the changes found (the last MAX_CHANGES)
        self.n = 0

    def step(self, n: int, rows: int, log_evidence: dict[str, float] | None,
             events: dict[str, list[Event]] | None = None) -> list["StreamChange"]:
        """One chunk of ``rows`` observations: ``n`` observations seen after it, each model's
        running log-evidence (None when the models did not read the same data here: one
        dead-lettered the chunk), the events each model reported on it. Returns the stream
        changes found at this chunk."""
        self.window = max(self.window, int(rows))
        for m, evs in sorted((events or {}).items()):
            if m not in self.models:
                raise ValueError(f"events of model {m!r}, not one of the stream's {self.models}")
            self.events += sorted((int(e.detected_at), int(e.location), m, float(e.confidence)) for e in evs)
        self.events = self.events[-self.MAX_EVENTS:]
        self.n = int(n)
        if log_evidence is None:
            return []
        if set(log_evidence) != set(self.models):
            raise ValueError(f"log_evidence covers {sorted(log_evidence)}, the stream's models are {self.models}")
        from service.data import log_model_probabilities

        probs = log_model_probabilities({m: float(log_evidence[m]) for m in self.models}, self.log_prior)
        found: list[StreamChange] = []
        for _, loc, _, _ in sorted(self.events):  # candidates in the order they were first reported
            if any(abs(loc - c) <= self.window for c in self.changes):
                continue
            best: dict[str, tuple[float, float, int]] = {}
            for at, where, m, conf in self.events:
                if at <= n and abs(where - loc) <= self.window and conf > best.get(m, (0.0, 0.0, 0))[1]:
                    best[m] = (probs[m], conf, where)
            bound = sum(p * c for p, c, _ in best.values())
            if best and bound >= self.threshold:
                top = max(best, key=lambda m: best[m][0] * best[m][1])
                found.append(StreamChange(location=best[top][2], detected_at=int(n), confidence=min(bound, 1.0),
                                          support={m: (p, c) for m, (p, c, _) in best.items()}))
                self.changes = (self.changes + [best[top][2]])[-self.MAX_CHANGES:]
        return found

    def chunk(self, rows: int, evidence: dict[str, tuple[int, float] | None],
              events: dict[str, list[Event]] | None = None) -> list["StreamChange"]:
        """``step`` from each model's (observations seen, running log-evidence) after the chunk,
        None for a model that did not apply it (dead-lettered). Models are compared on the data
        they read: a model that has seen fewer observations than the others (it dead-lettered a
        chunk they took) is left out, with probability 0, from then on; its events no longer
        count. If no model applied the chunk, nothing is compared at it."""
        got = {m: (int(v[0]), float(v[1])) for m, v in evidence.items() if v is not None}
        if not got:
            return self.step(self.n + int(rows), rows, None, events)
        n = max(v[0] for v in got.values())
        return self.step(n, rows, {m: got[m][1] if m in got and got[m][0] == n else -math.inf for m in evidence}, events)

    def to_dict(self) -> dict:
        return {"v": self.VERSION, "n": self.n, "window": self.window, "events": [list(e) for e in self.events], "changes": list(self.changes)}

    def load(self, d: dict | None) -> "StreamAnswer":
        """This answer's state from ``to_dict`` (None: a new stream)."""
        if d is None:
            return self
        if d.get("v") != self.VERSION:
            raise ValueError(f"stream answer state version {d.get('v')!r}, this code reads {self.VERSION}")
        self.n, self.window = int(d["n"]), int(d["window"])
        self.events = [(int(a), int(l), str(m), float(c)) for a, l, m, c in d["events"]]
        self.changes = [int(c) for c in d["changes"]]
        return self


def model_averaged_changes(events: dict[str, list[Event]], log_evidence: dict[str, list[tuple[int, float]]],
                           window: int, threshold: float = 0.99,
                           log_prior: dict[str, float] | None = None) -> list[StreamChange]:
    """``StreamAnswer`` over whole traces: ``log_evidence[m]``: (observations seen, running
    log-evidence) after each chunk, the same n for every model (they read the same chunks); an
    event enters at the first chunk whose n reaches its ``detected_at``. Sorted by location."""
    names = sorted(events)
    if set(log_evidence) != set(names):
        raise ValueError(f"log_evidence covers {sorted(log_evidence)}, events {names}")
    if not names:
        return []
    ns = [n for n, _ in log_evidence[names[0]]]
    for m in names:
        if [n for n, _ in log_evidence[m]] != ns:
            raise ValueError(f"model {m!r}: its chunks end at other observation counts than {names[0]!r}'s")
    answer = StreamAnswer(names, window, threshold, log_prior)
    out: list[StreamChange] = []
    prev = -1
    for i, n in enumerate(ns):
        new = {m: [e for e in events[m] if prev < e.detected_at <= n] for m in names}
        out += answer.step(n, 0, {m: log_evidence[m][i][1] for m in names}, new)
        prev = n
    return sorted(out, key=lambda c: c.location)


def detector_seed(model_seed: int) -> int:
    """The detector's generator seed, derived from (and distinct from) its model's seed."""
    return (int(model_seed) * 6364136223846793005 + 1442695040888963407) % (2**63)

"""What the detector keeps and reports: ``Event``, ``Challenger``, ``Recent``, ``DetectorState``
(with its versioned codec), ``Refined`` and ``Step``."""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, field, fields, replace

import torch

from service.detect.signals import Cusum, FlatRun, RunningLevel, StepSpike
from service.sgais import ChunkResult, Reservoir, ReservoirWrites, SGAISState, load_state

MAGIC = "cusp-detector-1"
#: the same layout with challengers that start inside their first chunk (``Challenger.skip``):
#: written only when one does, so a version before it refuses such a state by name instead of
#: re-reading the skipped rows (a worker rolled back)
MAGIC_SKIP = "cusp-detector-2"
#: the same layout with a ``Standing`` (the no-change alternative of the last reported change, kept
#: while it is weighed): written only when there is one, so a version before it refuses such a
#: state by name instead of dropping it
MAGIC_STANDING = "cusp-detector-3"
#: the same layout with ``Suspect`` s (rows that may be outliers, weighed on): written only when
#: there are some, so a version before it refuses such a state by name instead of dropping it
MAGIC_SUSPECT = "cusp-detector-4"


@dataclass(frozen=True)
class Event:
    """A detected change point. location: index (0-based, over the whole stream) of the first
    observation of the new regime; chunk: the chunk that starts with it; seq: that chunk's
    sequence number; detected_at: observations seen when it was reported; delay:
    detected_at - location; confidence: posterior probability of the change; log_bayes_factor:
    the challenger's log Bayes factor against the incumbent; adapted: whether the model
    restarted there; row: location's row in chunk seq (0-based); location_time: that row's time
    (epoch seconds; the service sets it from the rows' times, None where nobody did); columns:
    with several columns, each one's mean and sd over the detector's rows before and after
    location (``service.detect.moves.column_moves``), None with one column."""

    location: int
    chunk: int
    seq: int
    detected_at: int
    delay: int
    confidence: float
    log_bayes_factor: float
    log_prior_odds: float
    adapted: bool
    row: int = 0
    location_time: float | None = None
    columns: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Event":
        """``to_dict``'s record, fields a later version added left out (a worker of this version
        beside a newer one in a rolling upgrade or a rollback reads its tallies)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(eq=False)
class Challenger:
    """A restart of the model at ``start`` (observation index), fed the chunks ``seqs``. Compared
    by identity: two restarts at one place (``Detector._kinds``) are different challengers."""

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
    shift: bool = False  # a level shift (``Detector._kinds``): the incumbent's posterior with a new level
    top_row: float = 0.0  # its largest advantage in one row of a compared chunk of several, over that chunk's next (``Detector._log_odds``)
    top_more: list[float] = field(default_factory=list)  # and of its 2, 3, .. most telling rows, over the next one's (``_top_excess``), with the old regime after them (``_followed``)
    top_burst: list[float] = field(default_factory=list)  # the same where those rows were a burst instead (``_bursts``)
    skip: int = 0  # rows of its first chunk before ``start`` (a restart inside a chunk, ``Detector._split``)
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
    # the incumbent's state before this chunk while the detector processes it (exact method, rows
    # of one, for a level-shift restart here); never saved, cleared before ``Detector.update`` returns
    before: SGAISState | None = None
    # the model's last reported change and its log odds before this chunk, while it was weighed on
    # (``Standing``): a change reported later in this chunk or after it sends the odds from here,
    # not those its rows moved (``Detector.update``)
    standing: tuple[int, float] | None = None


@dataclass
class Standing:
    """The model's last reported change, weighed on after the report (exact models that adapt,
    ``Detector._stand``): its ``location``, the posterior log odds of it against no change now
    (``log_odds``: the confidence it was reported with, then every later chunk's log predictive
    under the restarted model less that under ``state``), ``state`` (the incumbent that did not
    restart, brought up to date with the same chunks: the no-change alternative; ``_slim``'s
    bytes) and ``rows`` seen since the report. Each chunk kept (``Recent.standing``) records the
    (location, log odds) before it, so that a later change sends the odds from before its rows
    (neither hypothesis holds after a second change, and its rows counted against the first)."""

    location: int
    log_odds: float
    state: bytes
    rows: int = 0


@dataclass
class Suspect:
    """Rows that may be outliers, weighed on (exact models that adapt, ``Detector._watch``): their
    stream indices ``locations`` (oldest first), ``gain`` (the log Bayes factor of "they were
    outliers" against the incumbent: the log predictives of the rows after the first under
    ``state`` less those under the incumbent), ``rows`` after the first so far, and ``state``: the
    incumbent's posterior had it skipped them (``Model.exact_skip``) and learned every other row
    (``_slim``'s bytes); ``level``: the running level (mean, var, count) before the chunk of the
    first, which the detector goes back to if they are taken out."""

    locations: list[int]
    gain: float
    rows: int
    state: bytes
    level: tuple[float, float, int] = (0.0, 0.0, 0)
    post: torch.Tensor | None = field(default=None, compare=False, repr=False)  # ``state``'s posterior, decoded; not saved
    own: float = 0.0  # what the rows add to the evidence as outliers once taken out (``Detector._suspect``)


@dataclass
class DetectorState:
    """rng: the detector's generator state; offset_n / offset_log_evidence: what the current
    incumbent does not cover since it restarted (0 before any change); memory_rows: rows at the
    start of the incumbent's history that belong to the regime before its change (a mixture's
    short memory: the first ``memory_rows`` of its reservoir); chunks: chunks seen;
    level, steps, cusum: the nomination signals since the last (re)start (``signals.py``), and
    flat: the runs of repeated values (``FlatRun``);
    events: changes reported; challengers; recent: the chunks a challenger may start from;
    dropped: the exact method's rows of one that left ``recent``, kept to place a change
    (``Detector._trim``; for a model with level shifts the first holds the incumbent's state
    before it), re-read on restore like ``recent``; standing: the last reported change while it is
    weighed on (``Standing``), or None; suspects: rows that may be outliers, weighed on
    (``Suspect``), most probable first.

    Codec: ``to_bytes`` writes JSON (floats as hex, bit-exact) headed by ``magic``, which names
    the layout's version (``MAGIC``); ``from_bytes`` reads every version it knows and refuses
    others by name, so a worker never misreads a state written by another version."""

    rng: torch.Tensor
    offset_n: int = 0
    offset_log_evidence: float = 0.0
    memory_rows: int = 0
    chunks: int = 0
    level: RunningLevel = field(default_factory=RunningLevel)
    steps: StepSpike = field(default_factory=StepSpike)
    cusum: Cusum = field(default_factory=Cusum)
    events: int = 0
    challengers: list[Challenger] = field(default_factory=list)
    recent: list[Recent] = field(default_factory=list)
    dropped: list[Recent] = field(default_factory=list)
    standing: Standing | None = None
    suspects: list[Suspect] = field(default_factory=list)
    flat: FlatRun = field(default_factory=FlatRun)

    def copy(self) -> "DetectorState":
        """A copy whose signals, challengers, recent, dropped and suspects lists can change without touching this one."""
        f = self.flat
        return replace(self, level=replace(self.level), steps=replace(self.steps), cusum=replace(self.cusum),
                       challengers=[replace(c) for c in self.challengers], recent=list(self.recent), dropped=list(self.dropped),
                       suspects=list(self.suspects),
                       flat=FlatRun(list(f.last), list(f.run), list(f.start), list(f.fired), list(f.repeats), list(f.pairs)))

    def to_bytes(self) -> bytes:
        lv, st, cu = self.level, self.steps, self.cusum
        head = {
            "magic": MAGIC_SUSPECT if self.suspects else MAGIC_STANDING if self.standing is not None or any(r.standing is not None for r in self.recent + self.dropped)
            else MAGIC_SKIP if any(c.skip for c in self.challengers) else MAGIC, "offset_n": self.offset_n, "offset_log_evidence": self.offset_log_evidence.hex(),
            **({"memory_rows": self.memory_rows} if self.memory_rows else {}),
            "chunks": self.chunks, "count": lv.count, "level": lv.mean.hex(), "var": lv.var.hex(),
            "steps_mean": st.mean.hex(), "steps_var": st.var.hex(), "events": self.events,
            "cusum": [cu.lo.hex(), cu.hi.hex(), cu.lo_from, cu.hi_from],
            "recent": [[r.seq, r.chunk, r.start, r.base.hex(), r.lp.hex(), r.level.hex(), r.spread.hex()]
                       + ([base64.b64encode(r.state).decode()] if r.state is not None else []) for r in self.recent],
            **({"dropped": [[r.seq, r.chunk, r.start, r.base.hex(), r.lp.hex()]
                            + ([base64.b64encode(r.state).decode()] if r.state is not None else []) for r in self.dropped]}
               if self.dropped else {}),
            **({"standing": [self.standing.location, self.standing.log_odds.hex(), self.standing.rows,
                             base64.b64encode(self.standing.state).decode()]} if self.standing is not None else {}),
            **({"suspects": [[x.locations, x.gain.hex(), x.rows, base64.b64encode(x.state).decode(),
                              [x.level[0].hex(), x.level[1].hex(), x.level[2]], x.own.hex()] for x in self.suspects]}
               if self.suspects else {}),
            **{f"{name}_standing": [None if r.standing is None else [r.standing[0], r.standing[1].hex()] for r in rows]
               for name, rows in (("recent", self.recent), ("dropped", self.dropped))
               if any(r.standing is not None for r in rows)},
            # the flat-run signal (``FlatRun``) under a key of its own, without a new magic: a version
            # before it reads the rest as it was and loses only a run being counted (a nomination)
            **({"flat": [[float(v).hex() for v in self.flat.last], self.flat.run, self.flat.start,
                         [int(x) for x in self.flat.fired], self.flat.repeats, self.flat.pairs]} if self.flat.last else {}),
            "rng": base64.b64encode(self.rng.numpy().tobytes()).decode(),
            "challengers": [
                {"start": c.start, "chunk": c.chunk, "seqs": c.seqs, "base": c.base_log_evidence.hex(),
                 "first_rows": c.first_rows, "level": [c.level.hex(), c.spread.hex(), c.incumbent_all.hex()], "train": None if c.train_log_z is None else c.train_log_z.hex(),
                 "inc": c.incumbent_lp.hex(), "compared": c.compared, "bf": c.log_bf.hex(),
                 "diffs": [d.hex() for d in c.diffs], "memory": [c.memory, c.memory_rows],
                 "old": [c.old_seqs, c.old_fit.hex()], **({"shift": 1} if c.shift else {}),
                 **({"top": c.top_row.hex()} if c.top_row else {}), **({"tops": [t.hex() for t in c.top_more]} if c.top_more else {}),
                 **({"bursts": [t.hex() for t in c.top_burst]} if c.top_burst else {}),
                 **({"skip": c.skip} if c.skip else {}),
                 "state": base64.b64encode(c.state.to_bytes()).decode()}
                for c in self.challengers
            ],
        }
        return json.dumps(head, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "DetectorState":
        """Challengers come back without their rows; ``Detector.restore`` refills them."""
        h = json.loads(raw)
        if h.get("magic") not in DECODERS:
            raise ValueError(f"not a cusp detector state this version reads (magic {str(h.get('magic'))[:40]!r}; "
                             f"known: {', '.join(DECODERS)})")
        return DECODERS[h["magic"]](h)

    def oldest_seq(self) -> int | None:
        """The first input seq a restore needs (None: no challengers)."""
        return min([c.seqs[0] for c in self.challengers if c.seqs] + [r.seq for r in self.recent + self.dropped],
                   default=None)


def _decode_v1(h: dict) -> DetectorState:
    """Layouts ``cusp-detector-1`` to ``-4`` (the signals' fields flat at the top level; ``-2``: some
    challenger has ``skip``; ``-3``: a ``Standing``, and challengers with or without ``skip``; ``-4``: a
    ``Suspect``, with or without the others)."""
    f = float.fromhex
    rng = torch.frombuffer(bytearray(base64.b64decode(h["rng"])), dtype=torch.uint8).clone()
    chs = [
        Challenger(start=c["start"], chunk=c["chunk"], seqs=list(c["seqs"]), base_log_evidence=f(c["base"]),
                   first_rows=c["first_rows"], level=f(c["level"][0]), spread=f(c["level"][1]),
                   incumbent_all=f(c["level"][2]), train_log_z=None if c["train"] is None else f(c["train"]),
                   incumbent_lp=f(c["inc"]), compared=c["compared"], log_bf=f(c["bf"]),
                   diffs=[f(d) for d in c["diffs"]], memory=c.get("memory", [0, 0])[0],
                   memory_rows=c.get("memory", [0, 0])[1], old_seqs=list(c.get("old", [[], ""])[0]),
                   old_fit=f(c["old"][1]) if "old" in c else 0.0, shift=bool(c.get("shift", 0)),
                   top_row=f(c["top"]) if "top" in c else 0.0, top_more=[f(t) for t in c.get("tops", [])],
                   top_burst=[f(t) for t in c.get("bursts", [])],
                   skip=int(c.get("skip", 0)),
                   state=load_state(base64.b64decode(c["state"])))
        for c in h["challengers"]
    ]
    out = DetectorState(
        rng=rng, offset_n=h["offset_n"], offset_log_evidence=f(h["offset_log_evidence"]),
        memory_rows=h.get("memory_rows", 0), chunks=h["chunks"],
        level=RunningLevel(count=h["count"], mean=f(h["level"]), var=f(h["var"])),
        steps=StepSpike(mean=f(h["steps_mean"]), var=f(h["steps_var"])), events=h["events"], challengers=chs,
        cusum=Cusum(lo=f(h["cusum"][0]), hi=f(h["cusum"][1]), lo_from=h["cusum"][2], hi_from=h["cusum"][3]),
        recent=[Recent(seq=r[0], chunk=r[1], start=r[2], base=f(r[3]), lp=f(r[4]),
                       level=f(r[5]) if len(r) > 5 else 0.0, spread=f(r[6]) if len(r) > 6 else 0.0,
                       state=base64.b64decode(r[7]) if len(r) > 7 else None)
                for r in h["recent"]],
        dropped=[Recent(seq=r[0], chunk=r[1], start=r[2], base=f(r[3]), lp=f(r[4]),
                        state=base64.b64decode(r[5]) if len(r) > 5 else None) for r in h.get("dropped", [])],
        standing=None if "standing" not in h else Standing(
            location=int(h["standing"][0]), log_odds=f(h["standing"][1]), rows=int(h["standing"][2]),
            state=base64.b64decode(h["standing"][3])),
        suspects=[Suspect(locations=[int(v) for v in x[0]], gain=f(x[1]), rows=int(x[2]), state=base64.b64decode(x[3]),
                          level=(f(x[4][0]), f(x[4][1]), int(x[4][2])), own=f(x[5]) if len(x) > 5 else 0.0)
                  for x in h.get("suspects", ())])
    if "flat" in h:
        last, run, start, fired, repeats, pairs = h["flat"]
        out.flat = FlatRun([f(v) for v in last], [int(v) for v in run], [int(v) for v in start], [bool(v) for v in fired],
                           [int(v) for v in repeats], [int(v) for v in pairs])
    for name, rows in (("recent", out.recent), ("dropped", out.dropped)):
        for r, st in zip(rows, h.get(f"{name}_standing", ())):
            r.standing = None if st is None else (int(st[0]), f(st[1]))
    return out


#: layout magic -> decoder: every layout this version reads
DECODERS = {MAGIC: _decode_v1, MAGIC_SKIP: _decode_v1, MAGIC_STANDING: _decode_v1, MAGIC_SUSPECT: _decode_v1}


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
    incumbent must become, with ``writes`` rewriting its reservoir (None: keep the incumbent);
    pending: (location, posterior probability of a change there) of the challengers still open
    after this chunk (``Detector._pending``), for the stream's answer; standing: (location,
    posterior probability now) of the last change the model reported, while it is weighed on
    (``Detector._stand``; None otherwise), for the stream's answer too. Where rows were taken out
    as outliers (``Detector._watch``, ``result.outliers``), ``promoted`` is the incumbent without
    them and ``reservoir`` None (the incumbent's history stays)."""

    state: DetectorState
    result: ChunkResult
    events: list[Event]
    promoted: SGAISState | None = None
    reservoir: Reservoir | None = None
    writes: ReservoirWrites | None = None
    pending: list[tuple[int, float]] = field(default_factory=list)
    standing: tuple[int, float] | None = None

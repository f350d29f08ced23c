"""The stream's answer: its models' events weighted by their posterior probabilities, one chunk
at a time (``StreamAnswer``), and over whole traces (``model_averaged_changes``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from service.detect.state import Event


@dataclass(frozen=True)
class StreamChange:
    """A change point of a stream with several models, averaged over them: location (from the
    model that weighs most in its support), detected_at (observations seen when the probability of
    ``StreamAnswer`` first reached the threshold), confidence (that probability), and each supporting model's
    posterior probability (over its hypotheses no change and this change, ``_with_changes``) and
    event confidence at that time; location_time: the time of the
    observation at location, from that model's event (epoch seconds; None where the events had
    none); columns: that event's column summary (``Event.columns``, ``service.detect.moves``)."""

    location: int
    detected_at: int
    confidence: float
    support: dict[str, tuple[float, float]]
    location_time: float | None = None
    columns: dict | None = None

    @property
    def delay(self) -> int:
        """Observations seen after location when it was found (a model's event has the same)."""
        return self.detected_at - self.location

    def to_dict(self) -> dict:
        return {**asdict(self), "delay": self.delay}


@dataclass(frozen=True)
class StreamWithdrawal:
    """A stream change the evidence later rejected (``StreamAnswer``, ``WITHDRAW``): location and
    detected_at as the change had them, withdrawn_at (observations seen when it was withdrawn,
    ``HORIZON`` resolutions after it was found), confidence (its probability then, below
    ``WITHDRAW``), and each supporting model's (posterior probability, its probability of the
    change) then; location_time as the change had it."""

    location: int
    detected_at: int
    withdrawn_at: int
    confidence: float
    support: dict[str, tuple[float, float]]
    location_time: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """In words, as the workers log it and ``cusp replay`` prints it."""
        support = ", ".join(f"{m} p={p:.3g} probability {c:.3g}" for m, (p, c) in sorted(self.support.items()))
        return (f"change point at observation {self.location} (found at {self.detected_at}) withdrawn at "
                f"{self.withdrawn_at}: its probability is {self.confidence:.4f} now ({support})")


#: the least probability the stream must give an open candidate for ``notes`` to name it
NOTE_STREAM_FLOOR = 0.01


class StreamAnswer:
    """A stream's change points from its models' events, weighted by the models' posterior
    probabilities, one chunk at a time (the service's workers, ``cusp replay``, ``detect_stream``
    and ``cusp.Detector`` all use this class, so they give the same answer):

        P(change near l | data) = sum_m p(m | data) P(change near l | data, m)

    over the hypotheses (model m, no change near l) and (model m, its change near l): a model
    with an event within ``window`` of l counts with its confidence and its running evidence,
    which holds the change it restarted at (the confidence it reported, then, while the model
    weighs its last change on, its probability now: ``Detector._stand``); one without counts with its open challengers'
    highest probability c of a change within ``window`` of l at this chunk (``Detector._pending``),
    or 0, and with its evidence over both hypotheses, its running (no-change) evidence / (1 - c)
    (``_with_changes``; changes elsewhere are left out). After each chunk every event reported
    so far (each model's events are candidates, in the order they were first reported) that is not
    within ``window`` of a change already found is checked; the first whose probability reaches
    ``threshold`` becomes a stream change, located where the reporting model that weighs most in
    its support put it; a candidate before a change reported at this chunk waits for a chunk without
    new reports (the reporting model has restarted, its rivals not yet: the probabilities say nothing
    about earlier places until they have). A misspecified model that misses a change (a 3-component mixture when 3 clusters
    become 5) does not hide it, and one that fires alone while the data overwhelmingly favour the
    others (posterior probability near 0) does not raise one. With one model p = 1 and its events
    are the stream's (less those within ``window`` of an earlier one). Two models that report one
    change at about the same time and place it a little apart (no model with a change at both
    places) support one candidate, and are one change once it is found; a candidate is judged for
    ``HORIZON`` resolutions after its first report (``_settled``).

    A change found is judged once more ``HORIZON`` resolutions after it was found, when its models'
    view of it is final (each weighs its own change on for ``max_age`` rows, ``Detector._stand``):
    its probability is taken again as it was for the report, with the models' probabilities and
    event confidences now, and where it is below ``WITHDRAW`` the change is withdrawn
    (``StreamWithdrawal``, in ``withdrawn`` after that chunk): it leaves ``changes``, and the
    service, ``cusp replay``, ``detect_stream`` and ``cusp.Detector`` list it apart. Why: a model
    that adopts a change takes the weight for a while (it restarted, its rivals not yet), and where
    it was wrong the rows after it say so (a per-minute cycle's first two hours, 120 and 128, found
    at 0.998 and 0.999, at 0.00 a horizon later; `level` following a change of dispersion in counts
    at 499 and 550; a price walk at 13). Judged earlier, a true change can still dip: `ar`'s shift
    at 250 fell to 0.35 at 21 rows after it was found and ended at 0.99; at the horizon, across the
    metric set (3 seeds), its real series, counts and price walks, the 5 changes below 0.5 were all
    false (0.04 or below), and the 34 true ones judged were all at 1.00 (``docs/benchmarks.md``,
    session 46). A change the models now place at another change found within a horizon of it,
    withdrawn already, stays (``_placed_elsewhere``): one change two models placed apart keeps one
    place.

    ``window``: the stream's resolution (``stream_window``: the largest training sample), widened
    to the largest chunk seen (changes inside one chunk are one change).

    The state (``to_dict``/``load``, versioned) keeps the last ``MAX_EVENTS`` events and the last
    ``MAX_CHANGES`` changes: enough for candidates that can still be decided, bounded however long
    the stream runs."""

    VERSION = 1
    #: a candidate is judged for this many resolutions after its first report (``_settled``)
    HORIZON = 20
    #: a change whose probability a horizon after it was found is below this is withdrawn
    WITHDRAW = 0.5
    MAX_EVENTS = 256
    MAX_CHANGES = 64
    #: the column summaries kept (``moves``), of the newest events
    MAX_MOVES = 32

    def __init__(self, models: Sequence[str], window: int, threshold: float = 0.99,
                 log_prior: dict[str, float] | None = None, explain: bool = False):
        self.models = sorted(models)
        if not self.models:
            raise ValueError("a stream answer needs at least one model")
        self.window, self.threshold = int(window), float(threshold)
        self.log_prior = None if log_prior is None else {m: float(log_prior[m]) for m in self.models}
        # (detected_at, location, model, confidence, location time or None), in report order
        self.events: list[tuple[int, int, str, float, float | None]] = []
        self.changes: list[int] = []  # locations of the changes found (the last MAX_CHANGES)
        self.found: list[int] = []  # and the observations seen when each was found
        self.confidence: list[float | None] = []  # and each one's confidence when found (None: a state from before)
        # and the observations after which each is judged (``_judge``; fixed when it is found, so a
        # window widened later does not judge it twice), None once judged
        self.due: list[int | None] = []
        self.gone: list[int] = []  # the locations of the changes withdrawn (the last MAX_CHANGES)
        # "model@location" -> that event's column summary (``Event.columns``), for the newest events kept
        # (``MAX_MOVES``): a change takes the summary of the event that placed it
        self.moves: dict[str, dict] = {}
        # the changes withdrawn at the last chunk (not part of the state: the service stores them as they are made)
        self.withdrawn: list[StreamWithdrawal] = []
        self.n = 0
        # the posterior model probabilities at the last chunk this object compared, and the
        # observations then (not part of the state: the service keeps the last ones beside it)
        self.probabilities: dict[str, float] | None = None
        self.compared_n: int | None = None
        # the most probable candidate that stayed below ``threshold``, (probability, location, each
        # supporting model's (p, confidence), and the place each put it), for ``cusp replay`` to say
        # why a model's event is no stream change (a new user saw two events and silence); not part
        # of the state
        self.nearest: tuple[float, int, dict[str, tuple[float, float]], dict[str, int]] | None = None
        # likewise the place of the models' open challengers that one model found most probable,
        # where none reported (that probability, the stream's there, location, each model's (p,
        # probability there)), and the chunks taken: for ``notes``, not part of the state. ``open``
        # is followed only with ``explain`` (``cusp.Detector``, ``cusp replay``): the workers never
        # ask for notes, and weighing every open challenger cost about 0.14 ms a chunk (5 models)
        self.explain = explain
        self.open: tuple[float, float, int, dict[str, tuple[float, float]]] | None = None
        self.taken = 0

    def step(self, n: int, rows: int, log_evidence: dict[str, float] | None,
             events: dict[str, list[Event]] | None = None,
             pending: dict[str, list[tuple[int, float]]] | None = None,
             standing: dict[str, tuple[int, float] | None] | None = None) -> list["StreamChange"]:
        """One chunk of ``rows`` observations: ``n`` observations seen after it, each model's
        running log-evidence (None when the models did not read the same data here: one
        dead-lettered the chunk), the events each model reported on it, each model's open
        challengers after it (``Step.pending``: (location, probability); not kept), and each
        model's last reported change weighed on with this chunk (``Step.standing``: (location,
        probability now), or None): that event counts with its probability now from here on.
        Returns the stream changes found at this chunk."""
        self.window = max(self.window, int(rows))
        self.taken += 1
        for m, evs in sorted((events or {}).items()):
            if m not in self.models:
                raise ValueError(f"events of model {m!r}, not one of the stream's {self.models}")
            self.events += sorted((int(e.detected_at), int(e.location), m, float(e.confidence),
                                   None if e.location_time is None else float(e.location_time)) for e in evs)
            self.moves.update({f"{m}@{int(e.location)}": e.columns for e in evs if e.columns})
        self.events = self.events[-self.MAX_EVENTS:]
        # (those of the events kept, the newest MAX_MOVES: a wide stream's are kilobytes each; both change
        # only when events come, so a chunk without any, most of them, is not scanned)
        if self.moves and any((events or {}).values()):
            kept = {f"{m}@{loc}" for _, loc, m, _, _ in self.events}
            self.moves = dict([(k, v) for k, v in self.moves.items() if k in kept][-self.MAX_MOVES:])
        for m, now in sorted((standing or {}).items()):
            if now is None or m not in self.models:
                continue
            # the model's last event at that place (its latest report there)
            k = max((k for k, e in enumerate(self.events) if e[2] == m and e[1] == int(now[0])), default=None)
            if k is not None:
                at, loc, _, _, when = self.events[k]
                self.events[k] = (at, loc, m, float(now[1]), when)
        self.n = int(n)
        self.withdrawn = []
        if log_evidence is None:
            return []
        if set(log_evidence) != set(self.models):
            raise ValueError(f"log_evidence covers {sorted(log_evidence)}, the stream's models are {self.models}")
        from service.data import log_model_probabilities

        probs = log_model_probabilities({m: float(log_evidence[m]) for m in self.models}, self.log_prior)
        self.probabilities, self.compared_n = dict(probs), int(n)
        opened = {m: [(int(w), float(c)) for w, c in places] for m, places in (pending or {}).items()
                  if self.explain and m in probs and places}
        for loc in sorted({w for places in opened.values() for w, _ in places}):
            # the stream's probability of a change there, weighed as for reported events (``_with_changes``)
            there = {m: max(c for w, c in places if abs(w - loc) <= self.window) for m, places in opened.items()
                     if any(abs(w - loc) <= self.window for w, _ in places)}
            weights = _with_changes(probs, there)
            bound, top = sum(weights[m] * c for m, c in there.items()), max(there.values())
            # (a candidate the stream gives under NOTE_STREAM_FLOOR is never the one a note names: chosen
            # after the floor, a weightless model's noise at 0.90 displaced a near miss at 0.80, a review)
            if bound >= NOTE_STREAM_FLOOR and (self.open is None or (top, bound) > self.open[:2]):
                self.open = (top, bound, loc, {m: (weights[m], c) for m, c in there.items()})
        self._judge(n, probs, pending)
        found: list[StreamChange] = []
        # a model that reports a change at this chunk restarted there, its rivals not yet: for a chunk
        # or two the probabilities swing to it, and they say nothing about earlier places (seen: 5-minute
        # latency with a daily cycle, +40 at 500; at 504 `level` and `trend` had restarted, `seasonal`,
        # 93 nats down in that one chunk, adopted it at 508; in between `trend` weighed 1 and its three
        # earlier reports, at 224, 356 and 392, became stream changes). So a candidate before this
        # chunk's new reports waits for a chunk without them.
        fresh = [int(e.location) for evs in (events or {}).values() for e in evs]
        settle = min(fresh) - self.window if fresh else None
        for at0, loc, *_ in sorted(self.events, key=lambda e: e[:4]):  # candidates in the order they were first reported
            if any(abs(loc - c) <= self.window for c in self.changes):
                continue
            if settle is not None and loc < settle:
                continue
            if self._settled(n, loc, at0):
                continue
            weighed = self._weigh(n, loc, at0, probs, pending, self.changes)
            if weighed is None:
                continue
            bound, top, best = weighed
            support = {m: (p, c) for m, (p, c, _, _) in best.items()}
            if bound >= self.threshold:
                found.append(StreamChange(location=best[top][2], detected_at=int(n), confidence=min(bound, 1.0),
                                          support=support, location_time=best[top][3],
                                          columns=self.moves.get(f"{top}@{best[top][2]}")))
                self.changes = (self.changes + [best[top][2]])[-self.MAX_CHANGES:]
                self.found = (self.found + [int(n)])[-self.MAX_CHANGES:]
                self.confidence = (self.confidence + [min(bound, 1.0)])[-self.MAX_CHANGES:]
                self.due = (self.due + [int(n) + self.HORIZON * self.window])[-self.MAX_CHANGES:]
            elif self.nearest is None or bound > self.nearest[0]:
                self.nearest = (bound, best[top][2], support, {m: where for m, (_, _, where, _) in best.items()})
        return found

    def last_change(self) -> tuple[int, float | None] | None:
        """The change found last that stands: (location, confidence when found; None for one found
        before confidences were kept), or None. What ``cusp_stream_changepoint_last_observation`` and
        ``..._last_confidence`` show (the API reads it from the answer's hash at each scrape)."""
        return (self.changes[-1], self.confidence[-1]) if self.changes else None

    def _judge(self, n: int, probs: dict[str, float], pending: dict[str, list[tuple[int, float]]] | None) -> None:
        """Judge, once, each change whose horizon (``due``) has passed: withdraw it where its
        probability now is below ``WITHDRAW`` (into ``self.withdrawn``)."""
        k = 0
        while k < len(self.changes):
            loc, at, due = self.changes[k], self.found[k], self.due[k]
            if due is None or n <= due:
                k += 1
                continue
            self.due[k] = None
            others = self.changes[:k] + self.changes[k + 1:]
            weighed = self._now(n, loc, probs, pending, others)
            if weighed is None or weighed[0] >= self.WITHDRAW or self._placed_elsewhere(n, loc, probs, pending, others, weighed):
                k += 1
                continue
            bound, top, best = weighed
            del self.changes[k], self.found[k], self.confidence[k], self.due[k]
            self.gone = (self.gone + [loc])[-self.MAX_CHANGES:]
            # (the time of an event placed at the change's own location, as the change had it)
            when = next((e[4] for e in self.events if e[1] == loc and e[4] is not None), best[top][3])
            self.withdrawn.append(StreamWithdrawal(location=loc, detected_at=at, withdrawn_at=int(n), confidence=max(bound, 0.0),
                                                   support={m: (p, c) for m, (p, c, _, _) in best.items()}, location_time=when))

    def _now(self, n: int, loc: int, probs: dict[str, float], pending: dict[str, list[tuple[int, float]]] | None,
             others: Sequence[int]):
        """``_weigh`` for the change found at ``loc``, as first reported (its earliest event near it;
        None where all were trimmed out: it stands)."""
        first = min((e[0] for e in self.events if abs(e[1] - loc) <= self.window), default=None)
        return None if first is None else self._weigh(n, loc, first, probs, pending, others)

    def _placed_elsewhere(self, n: int, loc: int, probs: dict[str, float], pending: dict[str, list[tuple[int, float]]] | None,
                          others: Sequence[int], weighed) -> bool:
        """Is the change at ``loc`` (below ``WITHDRAW`` now: ``weighed``) one that the models now
        placed at another change found within a horizon of it, withdrawn already, with no standing
        change there to take its place? Then it stays: the models that weigh most now put the change
        at that other place, and withdrawing both would leave the stream without it (a new user's CPU
        ramping into saturation, chunks of 7: `trend` placed it at 497, `seasonal` at 525, both
        became stream changes; 497 was judged while `seasonal` weighed most, 525 once `trend` did, and
        both were withdrawn). The stream's probability of a change at any of those places:
        sum_m p(m) x its highest probability of a change at one of them."""
        horizon = self.HORIZON * self.window
        near = [c for c in others if abs(c - loc) <= horizon]
        for c in near:  # a change standing near it that the stream holds now covers it
            got = self._now(n, c, probs, pending, [o for o in self.changes if o != c])
            if got is not None and got[0] >= self.WITHDRAW:
                return False
        gone = [c for c in self.gone if abs(c - loc) <= horizon]
        if not gone:
            return False
        conf = {m: c for m, (_, c, _, _) in weighed[2].items()}
        for c in gone:
            got = self._now(n, c, probs, pending, self.changes)
            for m, (_, cm, _, _) in (got[2].items() if got is not None else ()):
                conf[m] = max(conf.get(m, 0.0), cm)
        return sum(probs[m] * c for m, c in conf.items()) >= self.WITHDRAW

    def _weigh(self, n: int, loc: int, at0: int, probs: dict[str, float],
               pending: dict[str, list[tuple[int, float]]] | None, changes: Sequence[int]
               ) -> tuple[float, str, dict[str, tuple[float, float, int, float | None]]] | None:
        """The stream's probability at ``n`` of a change at ``loc`` first reported at ``at0``:
        (that probability, the reporting model that weighs most in it, each supporting model's
        (weight, confidence, place, place's time)), or None where no reported event supports it.
        ``changes``: the changes found, which another model's place for it must stay clear of."""
        best: dict[str, tuple[float, float, int, float | None]] = {}
        for at, where, m, conf, when in self.events:
            if at <= n and abs(where - loc) <= self.window and conf > best.get(m, (0.0, 0.0, 0, None))[1]:
                best[m] = (probs[m], conf, where, when)
        # a model that placed this change elsewhere: an event of its own reported within the
        # resolution of the candidate's first report, each placed before the other was reported,
        # where no model has a change at both places
        # (seen: sparse counts 0.05 -> 0.5 at 1,000, point by point: `negbin` at 996 with
        # probability 0.96, `poisson` at 1,000 with 0.04, both certain, both reported at 1,011; 4
        # rows apart, beyond the resolution of 2, neither became a change)
        for at, where, m, conf, when in self.events:
            if (m not in best and at <= n and abs(at - at0) <= self.window and where <= at0 and loc <= at
                    and self._apart(loc, where)
                    and not any(abs(where - c) <= self.window for c in changes)
                    and conf > best.get(m, (0.0, 0.0, 0, None))[1]):
                best[m] = (probs[m], conf, where, when)
        reported = set(best)
        if not reported:
            return None
        for m, places in sorted((pending or {}).items()):
            if m in reported:
                continue  # a model that reported a change here speaks through its event
            for where, conf in places:
                if m in probs and abs(where - loc) <= self.window and conf > best.get(m, (0.0, 0.0, 0, None))[1]:
                    best[m] = (probs[m], float(conf), int(where), None)
        weights = _with_changes(probs, {m: best[m][1] for m in best if m not in reported})
        best = {m: (weights[m], c, where, when) for m, (_, c, where, when) in best.items()}
        bound = sum(p * c for p, c, _, _ in best.values())
        top = max(reported, key=lambda m: best[m][0] * best[m][1])
        return bound, top, best

    def notes(self, scored: dict[str, int], warmups: dict[str, int]) -> list[str]:
        """What a user cannot tell from an answer without changes, in words (none when changes were
        found and no candidate came near): every row in one chunk; all rows in the models' warm-up;
        fewer scored rows after it than the warm-up itself (a change needs scored rows before it and
        about as many after it to tell it from one wild reading: at the defaults, point by point, 20
        sd at row 6 was found in 11 rows and in no fewer); the most probable candidate below the
        threshold: one a model reported, else (with ``explain``) a model's open challenger (a new user's 15 yearly
        values: no change and no note, with a candidate at 0.965). ``scored``: each model's rows
        scored (not conditioned on), ``warmups``: the rows each conditions on before it scores any
        (0 or missing where none). Said by ``POST /v1/detect`` (``notes``),
        ``cusp.Detector.notes`` and ``cusp replay --detect``."""
        out, most = [], max(scored.values(), default=0)
        framed = sorted(w for w in warmups.values() if w > 0)
        best = max(scored, key=lambda m: scored[m], default=None)  # (the model that scored the most rows)
        if self.taken == 1 and self.n > 1 and not self.changes:
            out.append(f"all {self.n} rows came in one chunk: no change can be found inside a chunk (it needs rows "
                       "before it to compare with); give a smaller chunk size")
        if self.n and framed and most == 0:
            span = f"{framed[0]}" if framed[0] == framed[-1] else f"{framed[0]} to {framed[-1]}"
            out.append(f"all {self.n} rows are the models' warm-up: their first {span} rows fix each model's frame "
                       "(its units) and are conditioned on, not scored, so no change can be found in them; a change "
                       f"is found from row {framed[0]} on, with scored rows after it")
        elif not self.changes and best is not None and 0 < most < warmups.get(best, 0):
            out.append(f"only {most} rows were scored after the models' warm-up of {warmups[best]}: a change is found only "
                       "with scored rows before it and about as many after it as the warm-up, to tell it from one wild "
                       "reading")
        near = self.nearest
        # (a place found and withdrawn since is not "no change": the answer lists it apart)
        settled = self.changes + self.gone
        if near is not None and not any(abs(near[1] - c) <= self.window for c in settled):
            # each model's own place where it is not the candidate's (within the stream's resolution:
            # a new user's 25 yearly values, a drop of 5 sd at 15, read "no change at observation 8"
            # with `trend`'s 0.74 among its support, which `trend` gave the drop at 15)
            support = ", ".join(f"{m} p={p:.3g} confidence {c:.4f}" + (f" at {near[3][m]}" if near[3][m] != near[1] else "")
                                for m, (p, c) in sorted(near[2].items()))
            out.append(f"no change at observation {near[1]}: its probability reached {near[0]:.4f}, below the threshold "
                       f"{self.threshold:g} ({support})")
        elif (near is None and self.open is not None and self.open[0] >= 0.5
              and not any(abs(self.open[2] - c) <= self.window for c in settled)):
            # (more likely than not under some model: noise always has a candidate, a few percent likely;
            # and not nothing for the stream: `level` at 0.85 with a weight of 5e-8 beside `poisson` on
            # sparse counts is no near miss)
            top, bound, where, there = self.open
            model = max(there, key=lambda m: there[m][1])
            support = ", ".join(f"{m} p={p:.3g} confidence {c:.4f}" for m, (p, c) in sorted(there.items()))
            out.append(f"no model reported a change near observation {where}: {model} gave it {top:.4f}, below the "
                       f"threshold {self.threshold:g}, and the stream {bound:.4f} with the models' weights ({support})")
        return out

    def _settled(self, n: int, loc: int, at: int) -> bool:
        """Is the candidate at ``loc``, first reported at ``at``, decided at ``n``? Yes once
        ``HORIZON`` resolutions have passed since its report (the detector weighs a reported change
        on for 20 x its training rows, ``max_age``; after that its models' view of it is final, and
        only a swing of their probabilities could take it over the threshold: temperature in raw
        units, its noise tripled at 600, point by point: when `level` and `ar` adopted a change at
        581 their probabilities swung from 1e-4 to 0.89 and 0.11 for the few rows until `trend`
        adopted its own, and their event at 270, reported 170 rows before and below the threshold
        since, became a stream change at 617; a second random walk got two such, 434 and 354 rows
        old). And where a change already found was placed elsewhere by other models at about the
        same time (the two reported within the resolution of each other, each placed before the
        other was reported) and no model has a change at both places: the models placed one change
        differently (seen, the same series: `trend` and `seasonal` at 612, reported at 620, after
        `level` and `ar`'s 581, found at 615: two stream changes, 31 rows apart, for one)."""
        if n - at > self.HORIZON * self.window:
            return True
        return any(abs(at - found) <= self.window and c <= at and loc <= found and self._apart(loc, c)
                   for c, found in zip(self.changes, self.found))

    def _apart(self, loc: int, where: int) -> bool:
        """Does no model have a change (an event) near both ``loc`` and ``where``?"""
        near = {e[2] for e in self.events if abs(e[1] - loc) <= self.window}
        there = {e[2] for e in self.events if abs(e[1] - where) <= self.window}
        return not (near & there)

    def chunk(self, rows: int, evidence: dict[str, tuple[int, float] | None],
              events: dict[str, list[Event]] | None = None,
              pending: dict[str, list[tuple[int, float]]] | None = None,
              standing: dict[str, tuple[int, float] | None] | None = None) -> list["StreamChange"]:
        """``step`` from each model's (observations seen, running log-evidence) after the chunk,
        None for a model that did not apply it (dead-lettered). Models are compared on the data
        they read: a model that has seen fewer observations than the others (it dead-lettered a
        chunk they took) is left out, with probability 0, from then on; its events no longer
        count. If no model applied the chunk, nothing is compared at it."""
        got = {m: (int(v[0]), float(v[1])) for m, v in evidence.items() if v is not None}
        if not got:
            return self.step(self.n + int(rows), rows, None, events)
        n = max(v[0] for v in got.values())
        return self.step(n, rows, {m: got[m][1] if m in got and got[m][0] == n else -math.inf for m in evidence}, events,
                         {m: v for m, v in (pending or {}).items() if m in got and got[m][0] == n},
                         {m: v for m, v in (standing or {}).items() if m in got and got[m][0] == n})

    def to_dict(self) -> dict:
        return {"v": self.VERSION, "n": self.n, "window": self.window, "events": [list(e) for e in self.events],
                "changes": list(self.changes), "found": list(self.found), "due": list(self.due),
                "confidence": list(self.confidence), "gone": list(self.gone), "moves": dict(self.moves)}

    def load(self, d: dict | None) -> "StreamAnswer":
        """This answer's state from ``to_dict`` (None: a new stream)."""
        if d is None:
            return self
        if d.get("v") != self.VERSION:
            raise ValueError(f"stream answer state version {d.get('v')!r}, this code reads {self.VERSION}")
        self.n, self.window = int(d["n"]), int(d["window"])
        # an event stored before events had times has four entries
        self.events = [(int(e[0]), int(e[1]), str(e[2]), float(e[3]), None if len(e) < 5 or e[4] is None else float(e[4]))
                       for e in d["events"]]
        self.changes = [int(c) for c in d["changes"]]
        # (a state saved before changes kept when they were found: each found where it is)
        self.found = [int(f) for f in d.get("found", self.changes)]
        self.confidence = [None if c is None else float(c) for c in d.get("confidence") or ()]
        # (a state saved before changes were judged: those whose horizon has passed count as judged)
        due = d.get("due")
        if due is None or len(due) != len(self.changes):
            due = [f + self.HORIZON * self.window for f in self.found]
            due = [u if u >= self.n else None for u in due]
        self.due = [None if u is None else int(u) for u in due]
        self.gone = [int(c) for c in d.get("gone", ())]
        self.moves = {str(k): v for k, v in (d.get("moves") or {}).items()}
        if len(self.confidence) != len(self.changes):
            self.confidence = [None] * len(self.changes)
        return self


def standing_changes(changes: Sequence[StreamChange], withdrawn: Sequence[StreamWithdrawal]) -> list[StreamChange]:
    """``changes`` less those ``withdrawn`` (the same location, found at the same observation)."""
    gone = {(w.location, w.detected_at) for w in withdrawn}
    return [c for c in changes if (c.location, c.detected_at) not in gone]


def _with_changes(probs: dict[str, float], pending: dict[str, float]) -> dict[str, float]:
    """The models' posterior probabilities when each model in ``pending`` may also have changed
    at its open challenger, P(change | data, m) = c: the evidence of m over both hypotheses,
    no change and that change, is its running evidence (no change) times 1 / (1 - c), up to the
    prior probability of no change, which all models share (``decision.posterior``: c is the
    sigmoid of log BF + log prior odds). A model whose event is already reported restarted
    there: its running evidence holds the change, it keeps its probability."""
    lift = {m: probs[m] / (1.0 - min(float(c), _MAX_CONFIDENCE)) for m, c in pending.items()}
    w = {m: lift.get(m, p) for m, p in probs.items()}
    z = sum(w.values())
    return {m: v / z for m, v in w.items()} if z > 0 else dict(probs)


# a challenger's probability counts at most this close to 1 (its evidence ratio <= 1e12)
_MAX_CONFIDENCE = 1.0 - 1e-12


#: the count models: a stream with one of them needs no hint that its data are counts
COUNT_MODELS = ("poisson", "negbin", "negative-binomial")


class CountWatch:
    """Per column, over the rows seen: are they all whole numbers >= 0, and how many are 0? For
    ``counts_note`` (a new user's errors per minute, Poisson 0.3, 1,500 rows and no change: the
    default portfolio's `student-t` took nearly all the weight, a narrow density on the zeros, and
    reported chance bumps as changes on 3 of 8 series; `poisson` or `negbin` alone, none)."""

    def __init__(self) -> None:
        self.rows = 0
        self.whole: list[bool] = []
        self.zeros: list[int] = []
        self.top: list[float] = []

    def take(self, rows) -> None:
        """Count the rows ``[B, C]`` in (``column_counts``)."""
        counted = column_counts(rows)
        if counted is not None:
            self.add(len(rows), *counted)

    def add(self, rows: int, whole: list[bool], zeros: list[int], top: list[float]) -> None:
        """Count in ``rows`` rows summed up per column (``column_counts``; the service keeps the
        sums in the stream's clock hash, ``service.store.api``)."""
        if not self.whole:
            self.whole, self.zeros, self.top = list(whole), list(zeros), list(top)
        else:
            self.whole = [a and b for a, b in zip(self.whole, whole)]
            self.zeros = [a + b for a, b in zip(self.zeros, zeros)]
            self.top = [max(a, b) for a, b in zip(self.top, top)]
        self.rows += int(rows)


def column_counts(rows) -> tuple[list[bool], list[int], list[float]] | None:
    """Per column of ``rows [B, C]``: whether every value is a whole number >= 0, how many are 0,
    the largest (None for no rows): what ``CountWatch`` and the ingest script count."""
    import numpy as np

    x = np.asarray(rows, dtype=np.float64)
    if not x.size:
        return None
    return ((x >= 0) & (x == np.floor(x))).all(axis=0).tolist(), (x == 0).sum(axis=0).tolist(), x.max(axis=0).tolist()


def counts_note(watch: CountWatch, columns: Sequence[str], specs: Sequence[str]) -> str | None:
    """A hint where a column looks like sparse counts (whole numbers >= 0, at least a quarter of them
    0, over 20 rows or more) and no count model runs, or `student-t` does: its narrow density on the
    zeros outweighs a count model's probabilities (Poisson 0.3, 1,500 rows: +0.19 nats a row as a
    density against `poisson`'s -0.68 as a probability), so it takes the weight beside them too."""
    kinds = {s.split(":", 1)[0].strip() for s in specs}
    if watch.rows < 20 or (kinds & set(COUNT_MODELS) and "student-t" not in kinds):
        return None
    sparse = [c for c in range(len(watch.whole)) if watch.whole[c] and watch.zeros[c] >= watch.rows / 4]
    if not sparse:
        return None
    c = sparse[0]
    return (f"column {columns[c]!r} holds whole numbers from 0 to {watch.top[c]:g}, {watch.zeros[c] / watch.rows:.0%} of them "
            "0: counts? These models read it as a continuous reading; on sparse counts student-t can take chance "
            "bumps for changes (README, Models for metric series): for counts, name poisson or negbin, without "
            "student-t (its narrow density on the zeros outweighs their probabilities)")


def model_averaged_changes(events: dict[str, list[Event]], log_evidence: dict[str, list[tuple[int, float]]],
                           window: int, threshold: float = 0.99,
                           log_prior: dict[str, float] | None = None,
                           pending: dict[str, list[list[tuple[int, float]]]] | None = None,
                           standing: dict[str, list[tuple[int, float] | None]] | None = None) -> list[StreamChange]:
    """``StreamAnswer`` over whole traces: ``log_evidence[m]``: (observations seen, running
    log-evidence) after each chunk, the same n for every model (they read the same chunks); an
    event enters at the first chunk whose n reaches its ``detected_at``; ``pending[m]`` and
    ``standing[m]``: each chunk's ``Step.pending`` and ``Step.standing`` (None: none). Sorted by
    location; those withdrawn (``StreamAnswer.WITHDRAW``) left out."""
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
    withdrawn: list[StreamWithdrawal] = []
    prev = -1
    for i, n in enumerate(ns):
        new = {m: [e for e in events[m] if prev < e.detected_at <= n] for m in names}
        out += answer.step(n, 0, {m: log_evidence[m][i][1] for m in names}, new,
                           None if pending is None else {m: pending[m][i] for m in names if m in pending},
                           None if standing is None else {m: standing[m][i] for m in names if m in standing})
        withdrawn += answer.withdrawn
        prev = n
    return sorted(standing_changes(out, withdrawn), key=lambda c: c.location)

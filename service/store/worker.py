"""The worker's Redis access (synchronous: a worker is one loop on one thread): heartbeats,
leases with fencing tokens, reading input chunks and model state, the atomic apply and
dead-letter scripts, trimming, and the wake-up channel.

Every method is one round trip (or one pipeline, or one script) and returns plain values;
the worker never sees a key.
"""

from __future__ import annotations

import time
from functools import cached_property

from service.store import connect, keys, scripts


def _text(status: bytes | str) -> str:
    return status.decode() if isinstance(status, bytes) else status


class WorkerStore:
    """Connects on first use, not here: a cluster client discovers its nodes when it is made, and a
    worker started while Redis is down must start anyway, retry, and say so on its /healthz."""

    def __init__(self, url: str):
        self.url = url
        self._scripts: dict = {}
        self._wake = None  # pub/sub on keys.WAKE, opened when the worker first goes idle

    @cached_property
    def r(self):  # not cached if connecting raised: the next call tries again
        return connect(self.url)

    def _script(self, text: str):
        """The script object for ``text``, registered with the client once."""
        if text not in self._scripts:
            self._scripts[text] = self.r.register_script(text)
        return self._scripts[text]

    # --- workers and streams ------------------------------------------------------------------
    def heartbeat(self, worker_id: str, now: float) -> None:
        """Record that ``worker_id`` made progress at ``now`` (a poll or a chunk done)."""
        self.r.zadd(keys.WORKERS, {worker_id: now})

    def retire(self, worker_id: str) -> None:
        """A worker stopping cleanly leaves the registry: the others take its share at once."""
        self.r.zrem(keys.WORKERS, worker_id)

    def prune_workers(self, before: float) -> int:
        """Drop workers whose last heartbeat is older than ``before`` (dead ones never retire)."""
        return int(self.r.zremrangebyscore(keys.WORKERS, "-inf", f"({before}"))

    def live_workers(self, worker_id: str, now: float, window: float) -> int:
        """How many workers made progress in the last ``window`` seconds, ``worker_id`` counted
        whether or not it did (it is alive: it asks)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.zcount(keys.WORKERS, now - window, "+inf")
        pipe.zscore(keys.WORKERS, worker_id)
        count, mine = pipe.execute()
        return int(count) + (0 if mine is not None and mine >= now - window else 1)

    def stream_names(self) -> list[str]:
        """Names in the stream set: existing streams, and any being created or deleted (no config)."""
        return sorted(s.decode() for s in self.r.smembers(keys.STREAMS))

    def forget_stream(self, s: str) -> None:
        """Take an orphan name (no config) out of the stream set; put it back if a create wrote its
        config meanwhile (as ``ApiStore.forget``)."""
        self.r.srem(keys.STREAMS, s)
        if self.r.exists(keys.config(s)):
            self.r.sadd(keys.STREAMS, s)
        else:
            self.r.hdel(keys.STREAM_BYTES, s)

    def config_raw(self, s: str) -> bytes | None:
        """The stream's config as stored (JSON bytes), so a caller can tell whether it changed."""
        return self.r.get(keys.config(s))

    def uids(self, streams: list[str]) -> list[bytes | None]:
        """Each stream's incarnation id (None: no such stream), in one round trip. A config never
        changes within an incarnation, so a worker re-reads a config only when its uid changed."""
        pipe = self.r.pipeline(transaction=False)
        for s in streams:
            pipe.get(keys.uid(s))
        return pipe.execute() if streams else []

    def pending(self, pairs: list[tuple[str, str]]) -> list[bool]:
        """For each (stream, model): has the stream accepted chunks the model has not applied? One round trip."""
        if not pairs:
            return []
        streams = sorted({s for s, _ in pairs})
        pipe = self.r.pipeline(transaction=False)
        for s in streams:
            pipe.get(keys.seq(s))
        for s, m in pairs:
            pipe.hget(keys.state(s, m), "last_seq")
        got = pipe.execute()
        last_in = dict(zip(streams, got[: len(streams)]))
        return [last_in[s] is not None and done is not None and int(last_in[s]) > int(done)
                for (s, _), done in zip(pairs, got[len(streams):])]

    def stream_exists(self, s: str) -> bool:
        return bool(self.r.exists(keys.config(s)))

    def last_ingested(self, s: str) -> int | None:
        raw = self.r.get(keys.seq(s))
        return None if raw is None else int(raw)

    def first_time(self, s: str) -> float | None:
        """The time of the stream's first row (epoch seconds), None before its first chunk."""
        raw = self.r.hget(keys.clock(s), "first")
        return None if raw is None else float(raw)

    # --- leases -------------------------------------------------------------------------------
    def keep_alive(self, worker_id: str, ttl_ms: int) -> bool:
        """Renew this worker's life key (one command); False if it had lapsed (or never existed):
        pairs this worker held may have been taken over meanwhile."""
        return self.r.set(keys.life(worker_id), "1", px=ttl_ms, get=True) is not None

    def end_life(self, worker_id: str) -> None:
        self.r.delete(keys.life(worker_id))

    def owner(self, s: str, m: str) -> str | None:
        raw = self.r.get(keys.lease(s, m))
        return None if raw is None else raw.decode()

    def life_and_beat(self, worker_id: str) -> tuple[bool, float | None]:
        """Whether ``worker_id``'s life key exists, and when it last wrote its heartbeat (None: never,
        or pruned), in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        pipe.exists(keys.life(worker_id))
        pipe.zscore(keys.WORKERS, worker_id)
        alive, score = pipe.execute()
        return bool(alive), None if score is None else float(score)

    def acquire(self, s: str, m: str, worker_id: str, dead_owner: str = "") -> bytes | None:
        """A new fencing token if the pair was free, ours, or ``dead_owner``'s (found without a
        life key), else None."""
        token = self._script(scripts.ACQUIRE)(keys=[keys.lease(s, m), keys.fence(s, m), keys.state(s, m)],
                                              args=[worker_id, dead_owner])
        return str(token).encode() if token else None

    def fences(self, pairs: list[tuple[str, str]]) -> list[bytes | None]:
        """Each pair's current fencing token, in one pipeline: a held pair whose token moved on was taken over."""
        pipe = self.r.pipeline(transaction=False)
        for s, m in pairs:
            pipe.get(keys.fence(s, m))
        return pipe.execute() if pairs else []

    def release(self, s: str, m: str, worker_id: str) -> None:
        self._script(scripts.RELEASE)(keys=[keys.lease(s, m)], args=[worker_id])

    def mark_taken(self, s: str, m: str, token: bytes, seq: int) -> None:
        """This owner has taken chunks up to ``seq`` into its batch (``taken_through`` in the state hash)."""
        self._script(scripts.MARK_TAKEN)(keys=[keys.state(s, m), keys.fence(s, m)], args=[token, seq])

    # --- state and input ----------------------------------------------------------------------
    def load(self, s: str, m: str) -> tuple[dict, bytes]:
        """(the model's state hash, its reservoir bytes), read together."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hgetall(keys.state(s, m))
        pipe.get(keys.reservoir(s, m))
        h, res_raw = pipe.execute()
        return h, res_raw or b""

    def inputs(self, s: str, first: int, last: int | None = None, count: int | None = None) -> list[tuple[int, dict]]:
        """(seq, fields ``rows`` and ``n``) of the input chunks from seq ``first`` on (to ``last``, at most ``count``)."""
        got = self.r.xrange(keys.inbox(s), min=keys.entry_id(first), max="+" if last is None else keys.entry_id(last), count=count)
        return [(keys.seq_of(eid), fields) for eid, fields in got]

    def trim_inputs(self, s: str, models: list[str]) -> None:
        """Drop the input chunks that no model of the stream may still read (each model's ``keep_from``)."""
        self._script(scripts.TRIM_INBOX)(keys=[keys.inbox(s), *(keys.state(s, m) for m in models)])

    # --- outcomes -----------------------------------------------------------------------------
    def apply(self, s: str, m: str, token: bytes, seq: int, state: bytes, n: int, log_evidence: float, chunks: int,
              detector: bytes, keep_from: int, row_bytes: int, result_maxlen: int, outs: list, slot_args: list,
              tally: str, changes_maxlen: int) -> str:
        """One processed chunk, atomically: state, counters, result entries (``outs``: model, kind,
        data per entry; change points also to the change-point store), the chunk's record for the
        stream's answer (``tally``) and reservoir slots (``slot_args``: first slot, bytes per run).
        Returns 'ok', 'fenced' (the lease moved on) or 'stale' (seq already applied)."""
        return _text(self._script(scripts.APPLY)(
            keys=[keys.state(s, m), keys.reservoir(s, m), keys.fence(s, m), keys.out(s), keys.attempts(s, m),
                  keys.tally(s), keys.changes(s)],
            args=[token, seq, state, n, repr(log_evidence), chunks, detector, keep_from, row_bytes, result_maxlen,
                  len(outs) // 3, keys.tally_field(seq, m), tally, changes_maxlen, *outs, *slot_args],
        ))

    def count_failure(self, s: str, m: str, seq: int) -> int:
        """One more failed attempt at ``seq``; returns the attempts so far (they survive crashes)."""
        return int(self._script(scripts.COUNT_FAILURE)(keys=[keys.attempts(s, m), keys.state(s, m)], args=[seq]))

    def dead_letter(self, s: str, m: str, token: bytes, seq: int, error: str, result_maxlen: int, data: str, keep_from: int,
                    tally: str) -> str:
        """Park chunk ``seq`` in the dead-letter stream and move past it; 'ok', 'fenced' or 'stale'."""
        return _text(self._script(scripts.DEAD_LETTER)(
            keys=[keys.state(s, m), keys.fence(s, m), keys.out(s), keys.dead(s), keys.attempts(s, m), keys.tally(s)],
            args=[token, seq, m, error, result_maxlen, data, keep_from, keys.tally_field(seq, m), tally],
        ))

    # --- the stream's answer --------------------------------------------------------------------
    def answer_head(self, s: str) -> tuple[int | None, bytes, bytes | None]:
        """(cursor: the last seq the stream's answer took, None if it has no answer key; its state;
        the stream's incarnation id, None if the stream is gone)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hmget(keys.answer(s), "cursor", "state")
        pipe.get(keys.uid(s))
        (cursor, state), uid = pipe.execute()
        return (None if cursor is None else int(cursor)), (state or b""), uid

    def tallied(self, s: str, fields: list[str]) -> list[bytes | None]:
        return self.r.hmget(keys.tally(s), fields) if fields else []

    def tally_fields(self, s: str) -> list[bytes]:
        """Every record waiting in the tally (a stream from before the answer existed: where to start)."""
        return self.r.hkeys(keys.tally(s))

    def commit_answer(self, s: str, uid: bytes, expected: int | None, cursor: int, state: str, taken: list[str],
                      changes: list[tuple[str, str]], changes_maxlen: int, result_maxlen: int, probabilities: str = "") -> str:
        """Move the answer from ``expected`` to ``cursor`` (compare-and-set), drop the tally records
        it took, append its stream change points and withdrawals (``changes``: (kind, JSON), in the
        order made), keep its model probabilities; 'ok', 'stale' (another worker did) or 'gone'."""
        return _text(self._script(scripts.ANSWER)(
            keys=[keys.answer(s), keys.tally(s), keys.changes(s), keys.out(s), keys.config(s), keys.uid(s)],
            args=[uid, "" if expected is None else expected, cursor, state, changes_maxlen, result_maxlen, probabilities,
                  len(taken), *taken, *(part for entry in changes for part in entry)],
        ))

    # --- waking up ----------------------------------------------------------------------------
    def wait_for_wake(self, timeout: float) -> set[str] | None:
        """Wait up to ``timeout`` seconds for the ingest script's wake-up messages; the streams they
        name (every message that arrived meanwhile: one poll serves them all). None: the names are
        not known (the first call, which subscribes and returns at once since something may have
        arrived before the subscription; or a message in another form): look at every stream."""
        if self._wake is None:  # subscribed once and kept: messages published meanwhile queue up
            self._wake = self.r.pubsub(ignore_subscribe_messages=True)
            self._wake.subscribe(keys.WAKE)
            return None
        names: set[str] | None = set()
        deadline, woke = time.monotonic() + timeout, False
        while True:  # block until the first message (or the timeout), then take what else is queued
            got = self._wake.get_message(timeout=0.0 if woke else max(0.0, deadline - time.monotonic()))
            if got is None:  # nothing, or a subscription confirmation (answered as None at once)
                if woke or time.monotonic() >= deadline:
                    return names
                continue
            woke = True
            name = keys.stream_of_seq_key(got.get("data", b"")) if got.get("type") == "message" else ""
            if name is None:
                names = None
            elif names is not None and name:
                names.add(name)

    def close_wake(self) -> None:
        if self._wake is not None:
            try:
                self._wake.close()
            except Exception:  # noqa: BLE001
                pass
            self._wake = None

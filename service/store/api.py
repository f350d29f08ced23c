"""The API's Redis access (asyncio): every read and write the HTTP and WebSocket routes make.

Routes never see a key or a Redis reply; they get configs, plain numbers and result entries
decoded into dicts (``{"id", "model", "kind", **data}``, the wire format of results).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from service import times as T
from service.detect.answer import CountWatch, column_counts
from service.store import StreamConfig, connect_async, keys, scripts

#: the largest result id; nothing can follow it (and Redis refuses it as an exclusive start)
LAST_ID = f"{2**64 - 1}-{2**64 - 1}"
#: most result entries one filtered page looks at (GET .../evidence?model=...&kind=...)
SCAN_LIMIT = 50_000


@dataclass(frozen=True)
class ModelProgress:
    """One model's counters from its state hash (absent fields as a fresh model has them)."""

    observations: int
    chunks: int
    last_seq: int
    log_evidence: float
    error: str | None


@dataclass(frozen=True)
class StreamProgress:
    last_seq: int  # last accepted input seq, -1 before the first chunk
    dead_letters: int
    models: list[ModelProgress]  # in the config's order
    rows: int = 0  # rows accepted
    # the stream answer's posterior model probabilities and the observations they were computed at
    probabilities: dict[str, float] | None = None
    compared_n: int | None = None
    first_time: float | None = None  # the first and last row's times (epoch seconds); None before the first chunk
    last_time: float | None = None
    # per column over the rows counted at ingest (``ingest``'s ``data``; None before any): for the
    # sparse-counts note (``service.detect.answer.counts_note``)
    counts: CountWatch | None = None
    # the stream's last change standing: (location, its confidence when found, or None); None without one
    last_change: tuple[int, float | None] | None = None


def entry(eid: bytes, fields: dict) -> dict:
    """A result-stream entry as the API answers it: id, model, kind, then the entry's JSON data."""
    return {"id": eid.decode(), "model": fields[b"model"].decode(), "kind": fields[b"kind"].decode(), **json.loads(fields[b"data"])}


def _counted(fields: list, columns: int) -> CountWatch | None:
    """The clock hash's per-column counts (``progress_many``: w, z0.., f0.., m0..) as a CountWatch."""
    if not fields or fields[0] is None:
        return None
    z, f, m = fields[1 : 1 + columns], fields[1 + columns : 1 + 2 * columns], fields[1 + 2 * columns :]
    watch = CountWatch()
    watch.add(int(fields[0]), [v is None for v in f], [int(v or 0) for v in z], [float(v) if v is not None else 0.0 for v in m])
    return watch


class ApiStore:
    """One connection pool per API process, and the scripts the API runs."""

    def __init__(self, url: str):
        self.url = url
        self.r = connect_async(url)
        self._ingest = self.r.register_script(scripts.INGEST)
        self._create = self.r.register_script(scripts.CREATE)
        self._reserve = self.r.register_script(scripts.RESERVE)
        self._delete = self.r.register_script(scripts.DELETE)
        self._loaded: asyncio.Lock | None = None
        self._scripts_ready = False

    async def load_scripts(self) -> None:
        """Load the scripts on every node once, before their first use. Without it, concurrent first
        calls all get NOSCRIPT and reload at once; on a cluster redis-py's asyncio client then
        tears down connections other calls are using (seen: 'NoneType' object has no attribute
        'writelines', a 500 in 3 of 4 runs of 16 concurrent creates)."""
        if self._scripts_ready:
            return
        if self._loaded is None:
            self._loaded = asyncio.Lock()
        async with self._loaded:
            if not self._scripts_ready:
                for script in (self._ingest, self._create, self._reserve, self._delete):
                    await self.r.script_load(script.script)
                self._scripts_ready = True

    async def close(self) -> None:
        await self.r.aclose()

    async def ping(self) -> None:
        await self.r.ping()

    async def live_workers(self, now: float, window: float) -> int:
        """Workers whose last heartbeat is at most ``window`` seconds old."""
        return int(await self.r.zcount(keys.WORKERS, now - window, "+inf"))

    # --- streams ------------------------------------------------------------------------------
    async def stream_names(self) -> list[str]:
        """The streams that exist: names in the stream set whose config exists (a name may be in
        the set alone for a moment while its stream is created or deleted)."""
        names = sorted(s.decode() for s in await self.r.smembers(keys.STREAMS))
        if not names:
            return []
        pipe = self.r.pipeline(transaction=False)
        for s in names:
            pipe.exists(keys.config(s))
        return [s for s, there in zip(names, await pipe.execute()) if there]

    async def config(self, name: str) -> StreamConfig | None:
        raw = await self.r.get(keys.config(name))
        return None if raw is None else StreamConfig.from_json(raw)

    async def exists(self, name: str) -> bool:
        return bool(await self.r.exists(keys.config(name)))

    async def reserve(self, name: str, limit: int, need: int = 0, total: int = 0) -> int:
        """RESERVE: 1 (added), 2 (already in the set), 0 (``limit`` streams), 3 (over ``total`` bytes)."""
        await self.load_scripts()
        return int(await self._reserve(keys=[keys.STREAMS, keys.STREAM_BYTES], args=[name, limit, need, total]))

    async def create(self, cfg: StreamConfig, states: list[bytes], limit: int, need: int = 0, total: int = 0) -> str:
        """Create the stream with each model's initial state: 'created', 'exists' (the name is
        taken), 'full' (``limit`` streams exist) or 'over' (the streams' ``need`` bytes would pass
        ``total``; 0: no cap).

        Two slots, two steps (a cluster runs no script across slots): RESERVE takes the name's place
        in the stream set under the limit, atomically; CREATE writes the stream's own keys, atomically,
        unless its config exists; the name is then added to the set again, since a worker may have
        swept it as an orphan in between. So a stream with a config is always listed once its create
        returned, and the limit holds under concurrent creates (a reservation counts at once)."""
        reserved = await self.reserve(cfg.name, limit, need, total)
        if reserved == 0:
            return "full"
        if reserved == 3:
            return "over"
        try:
            created = await self._create(
                keys=[keys.config(cfg.name), keys.uid(cfg.name), keys.answer(cfg.name),
                      *[keys.state(cfg.name, m.name) for m in cfg.models]],
                args=[cfg.to_json(), cfg.uid, *states])
        except BaseException:
            if reserved == 1:  # ours alone; if this fails too, the workers sweep the orphan
                with contextlib.suppress(Exception):
                    await self.forget(cfg.name)
            raise
        await self.r.sadd(keys.STREAMS, cfg.name)
        return "created" if created else "exists"

    async def delete(self, cfg: StreamConfig) -> bool:
        """Delete this incarnation of the stream (``cfg.uid``): its keys in one script (one slot,
        atomic; ``scripts.DELETE``), then its name from the stream set, and wake the workers for it
        as an ingest does (``keys.WAKE``): they see it gone at once and its series leave their
        /metrics (before, at their next full scan, up to 30 s on: a new user saw a deleted stream's
        gauges beside the new stream of the same name). False, and nothing touched, where the
        stream is gone or another incarnation holds the name (deleted and created again since
        ``cfg`` was read)."""
        await self.load_scripts()
        if not await self._delete(keys=[keys.uid(cfg.name), *keys.stream_keys(cfg.name, [m.name for m in cfg.models])],
                                  args=[cfg.uid]):
            return False
        await self.forget(cfg.name)
        await self.r.publish(keys.WAKE, keys.seq(cfg.name))
        return True

    async def forget(self, name: str) -> None:
        """Take ``name`` out of the stream set unless its stream exists: removed, then put back if a
        create wrote its config meanwhile (a check first would race with that create)."""
        await self.r.srem(keys.STREAMS, name)
        if await self.r.exists(keys.config(name)):
            await self.r.sadd(keys.STREAMS, name)
        else:  # gone: its bytes no longer count against the deployment's cap
            await self.r.hdel(keys.STREAM_BYTES, name)

    async def model_state(self, stream: str, model: str) -> bytes | None:
        """A model's saved sampler state (its bytes; None before the stream exists)."""
        return await self.r.hget(keys.state(stream, model), "state")

    async def last_seq(self, stream: str) -> int | None:
        """The stream's last accepted seq (None before its first chunk)."""
        v = await self.r.get(keys.seq(stream))
        return None if v is None else int(v)

    async def progress(self, cfg: StreamConfig) -> StreamProgress:
        return (await self.progress_many([cfg]))[0]

    async def progress_many(self, cfgs: Sequence[StreamConfig]) -> list[StreamProgress]:
        """Each stream's progress, every stream in one pipeline (one round trip on a single Redis)."""
        pipe = self.r.pipeline(transaction=False)
        for cfg in cfgs:
            pipe.get(keys.seq(cfg.name))
            pipe.xlen(keys.dead(cfg.name))
            c = range(len(cfg.columns))
            pipe.hmget(keys.clock(cfg.name), "rows", "first", "last", "w", *(f"z{j}" for j in c), *(f"f{j}" for j in c),
                       *(f"m{j}" for j in c))
            pipe.hget(keys.answer(cfg.name), "probabilities")
            for m in cfg.models:
                pipe.hmget(keys.state(cfg.name, m.name), "n", "chunks", "last_seq", "log_evidence", "error")
        got = await pipe.execute() if cfgs else []
        out, i = [], 0
        for cfg in cfgs:
            last_in, dead, (n_rows, first, last, *counted), probs = got[i], got[i + 1], got[i + 2], got[i + 3]
            rows = got[i + 4 : i + 4 + len(cfg.models)]
            i += 4 + len(cfg.models)
            probs = json.loads(probs) if probs else {}
            models = [ModelProgress(observations=int(n or 0), chunks=int(chunks or 0), last_seq=int(last if last is not None else -1),
                                    log_evidence=float(le or 0.0), error=(err or b"").decode() or None)
                      for n, chunks, last, le, err in rows]
            out.append(StreamProgress(last_seq=int(last_in) if last_in is not None else -1, dead_letters=int(dead), models=models,
                                      rows=int(n_rows or 0), first_time=None if first is None else float(first),
                                      last_time=None if last is None else float(last), probabilities=probs.get("p"),
                                      compared_n=probs.get("n"), counts=_counted(counted, len(cfg.columns)),
                                      last_change=None if not probs.get("last") else (int(probs["last"][0]), probs["last"][1])))
        return out

    async def uids(self, names: Sequence[str]) -> list[bytes | None]:
        """Each stream's incarnation id (None: gone), in one pipeline."""
        pipe = self.r.pipeline(transaction=False)
        for s in names:
            pipe.get(keys.uid(s))
        return await pipe.execute() if names else []

    # --- ingest -------------------------------------------------------------------------------
    async def ingest(self, stream: str, seq: int, raw: bytes, rows: int, digest: str, window: int,
                     uid: str = "", models: Sequence[str] = (), max_backlog: int = 0,
                     times: np.ndarray | None = None, now: float = 0.0, data: np.ndarray | None = None) -> tuple[str, str]:
        """Append one chunk (``raw``: its float64 rows; ``times``: its rows' epoch seconds, None to
        stamp them with ``now``) unless its seq is taken or out of order, or the stream is not (any
        more) the incarnation ``uid``, or (``max_backlog`` > 0) the slowest of ``models`` has
        ``max_backlog`` accepted chunks still to apply, or its first time is not after the stream's
        last. Returns ("ok", entry id) | ("dup", stored digest) | ("old", expected seq) |
        ("gap", expected seq) | ("busy", backlog) | ("late", the stream's last time) | ("gone", "").
        ``data``: the chunk's rows, to count per column whole numbers >= 0, zeros and the largest
        value with the chunk (the sparse-counts note; ``stream_counts``)."""
        await self.load_scripts()
        stamp = [b"", "", ""] if times is None else [T.to_bytes(times), repr(float(times[0])), repr(float(times[-1]))]
        counts = column_counts(data) if data is not None else None
        counted = [] if counts is None else [len(counts[0]), *counts[1], *("1" if w else "0" for w in counts[0]),
                                             *(repr(float(v)) for v in counts[2])]
        res = await self._ingest(keys=[keys.seq(stream), keys.inbox(stream), keys.seen(stream), keys.config(stream),
                                       keys.uid(stream), keys.clock(stream), *[keys.state(stream, m) for m in models]],
                                 args=[seq, raw, rows, digest, window, uid, max_backlog, *stamp, repr(float(now)), *counted])
        return res[0].decode(), res[1].decode()

    # --- results ------------------------------------------------------------------------------
    async def results(self, stream: str, after: str, count: int, model: str | None = None,
                      kinds: Iterable[str] | None = None, scan: int = SCAN_LIMIT) -> tuple[list[dict], str, bool]:
        """A page of result entries with ids above ``after`` ("0-0": from the start), filtered
        before it is cut: up to ``count`` entries of ``model`` (None: any) and ``kinds`` (None:
        any), oldest first. Returns (entries, cursor, more): ``cursor`` is the id to read after
        for the rest (the last entry looked at, matching or not; ``after`` if none), ``more``
        whether a matching entry follows it. At most ``scan`` entries are looked at (filters
        that match rarely): if the scan stops there, ``more`` is True although the page may be
        short, even empty."""
        if after == LAST_ID:
            return [], after, False
        want_model = model.encode() if model is not None else None
        want_kinds = {k.encode() for k in kinds} if kinds else None
        filtered = want_model is not None or want_kinds is not None
        out: list[dict] = []
        cursor, start, seen = after, "(" + after if after != "0-0" else "-", 0
        batch = max(count + 1, 1000) if filtered else count + 1  # unfiltered: one more says whether more exists
        while True:
            got = await self.r.xrange(keys.out(stream), min=start, count=batch)
            for eid, f in got:
                if (want_model is None or f[b"model"] == want_model) and (want_kinds is None or f[b"kind"] in want_kinds):
                    if len(out) == count:
                        return out, cursor, True
                    out.append(entry(eid, f))
                cursor = eid.decode()
            seen += len(got)
            if len(got) < batch:
                return out, cursor, False
            if seen >= scan:
                return out, cursor, True
            start = "(" + cursor

    async def changes(self, stream: str, page: int = 5000) -> list[dict]:
        """The stream's change-point store (``keys.changes``): each model's events and the stream's,
        oldest first. O(events): result trimming does not reach it; it has its own cap."""
        out: list[dict] = []
        start = "-"
        while True:
            got = await self.r.xrange(keys.changes(stream), min=start, count=page)
            out += [entry(eid, f) for eid, f in got]
            if len(got) < page:
                return out
            start = "(" + got[-1][0].decode()

    async def dead_letters(self, stream: str, count: int = 1000) -> list[dict]:
        got = await self.r.xrange(keys.dead(stream), count=count)
        return [{"id": e.decode(), **{k.decode(): v.decode() for k, v in f.items()}} for e, f in got]

    async def follow(self, stream: str, since: str, uid: str = "") -> AsyncIterator[dict | None]:
        """Result entries after ``since``, live, until this incarnation of the stream (``uid``) is
        deleted; None is a keep-alive tick (a second without news). A connection of its own: it
        blocks. The incarnation is checked after every read: a stream deleted and created again
        within a second kept its feeds open, and they went on with the new stream's results as
        the old one's (its other models, its seq 0 again: a new user's trial)."""
        last = since
        reader = connect_async(self.url)
        try:
            while True:
                got = await reader.xread({keys.out(stream): last}, count=500, block=1000)
                now, there = await reader.pipeline(transaction=False).get(keys.uid(stream)).exists(keys.config(stream)).execute()
                if not there or (now or b"").decode() != uid:  # (a stream from before uids has none: "")
                    return
                if not got:
                    yield None
                    continue
                for eid, fields in got[0][1]:
                    last = eid.decode()
                    yield entry(eid, fields)
        finally:
            await reader.aclose()

"""The worker loop: lease stream x model pairs, process their chunks in seq order with the
SGAIS engine, and apply each result atomically (state, reservoir slots, last_seq, result
entry) under a fencing token, so a crash at any point neither loses nor double-applies a
chunk. One process runs any number of pairs; any number of processes share one Redis.

Leases: a pair's lease key names the worker holding it, with a fencing token (INCR) per
acquisition; the pair is that worker's while the worker's life key (``cusp:worker:<id>``) exists.
A lease keeper thread renews the life key each quarter of a lease (``CUSP_LEASE_SECONDS``; it
lives three quarters of one), whatever the loop is doing (a chunk may compute for longer than a
lease), and writes the worker's heartbeat: one command per worker, however many pairs it holds.
A dead worker's life key lapses within a lease; another worker then takes its pairs over (a new
token). Every write checks the token and ``last_seq`` inside one Lua script, so a worker that was
paused past its lease has its late writes refused (counted in cusp_fenced_writes_total); when its
keeper finds its life key had lapsed, it checks its pairs' tokens and drops those taken over.

Load sharing: each worker holds at most its share, ceil(pairs / live workers); one above it (a
worker joined) gives the excess back, so the newcomer gets its share at once. A worker is live
while its heartbeat is younger than three quarters of a lease (three heartbeats missed: gone),
so a dead worker's pairs are taken over within a lease of its death, or within about one and a
half when it died between renewing its life key and writing its heartbeat (the rescan below).
Dead workers' entries are pruned.

Scheduling: the ingest script publishes the stream's name on ``cusp:wake``; an idle worker
blocks on it and then looks at the named streams (and its pairs with more backlog) only, not at
every stream. A full scan of every stream (one pipelined round trip per kind of read) runs at
start, every ``FULL_SCAN_SECONDS``, after an error and when the number of live workers changed,
for anything a lost message left behind; and once more a life key's time after that number fell
(a worker that died between renewing its life key and writing its heartbeat still held its
pairs at the first of those scans). A stream whose pair's owner has a life key but no recent
heartbeat (its loop stalled: should it die so, the count does not fall again) is looked at again
a life key's time later. Pairs are served from a rotating start, not in name order.
SIGTERM: the chunk in hand is finished, leases are released, the loop exits.

Health: the loop records each step it completes (a poll, a chunk applied) in ``LoopHealth``, which
the worker's ``/healthz`` reads (stuck for ``stall_seconds``, or the last ``MAX_POLL_ERRORS`` polls
failed: 503). The heartbeat in Redis (``cusp:workers``, read by the API's ``/readyz`` and by
load sharing) is written after a poll succeeded and by the lease keeper while the loop is not
stalled, never while polls fail, so a worker whose polls fail does not count as alive.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field, replace

import numpy as np
import redis.exceptions as rexc
import torch

from models import ModelError
from service import metrics as M
from service import times as T
from service.detect import Detector, DetectorConfig, DetectorState, Event, StreamChange, StreamWithdrawal, detector_seed
from service.detect.moves import moved, named
from service.runtime import build, model_seed, rows_from_bytes, stream_answer
from service.sgais import WARNINGS, EngineError, Reservoir, Sampler, SGAISState, load_state
from service.store import StreamConfig
from service.store.keys import tally_field
from service.store.worker import WorkerStore

log = logging.getLogger("cusp.worker")


@dataclass
class Hot:
    """A leased pair kept in memory."""

    stream: str
    model: str
    token: bytes
    sampler: Sampler
    state: SGAISState
    reservoir: Reservoir
    last_seq: int
    width: int
    detector: Detector | None = None
    columns: tuple[str, ...] = ()  # the stream's column names (a change's column summary names them)
    dstate: DetectorState | None = None
    redelivered_through: int = -1  # chunks up to this seq were taken by a previous owner that did not apply them
    reliable: bool = True  # the last result had no reliability warning (a warning is logged on the change)
    first_time: float | None = None  # the stream's first row's time (read once, when a duration needs it)
    used: float = 0.0  # monotonic time it last processed a chunk
    cold: bool = False  # its state, reservoir and detector were let go (CUSP_WORKER_WARM_BYTES); reloaded for its next chunk
    size: int | None = None  # nbytes as last measured; None: to measure again (it processed chunks since)

    def nbytes(self) -> int:
        """Memory of what it keeps: its state's tensors, reservoir and detector data (0 when cold).
        Measured once after each batch it processes, not at every poll of every held pair."""
        if self.cold:
            return 0
        if self.size is None:
            self.size = _nbytes(self.state) + self.reservoir.nbytes + _nbytes(self.dstate)
        return self.size


def _nbytes(obj, depth: int = 0) -> int:
    """Bytes of the tensors and arrays in a (nested) dataclass, list or dict."""
    if isinstance(obj, torch.Tensor):
        return obj.element_size() * obj.nelement()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, Reservoir):
        return obj.nbytes
    if depth > 4 or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return 0
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(x, depth + 1) for x in obj)
    if isinstance(obj, dict):
        return sum(_nbytes(x, depth + 1) for x in obj.values())
    fields = getattr(obj, "__dataclass_fields__", None)
    return sum(_nbytes(getattr(obj, f), depth + 1) for f in fields) if fields else 0


#: consecutive failed polls after which a worker's /healthz answers 503 (about as many seconds:
#: the loop waits a second after each)
MAX_POLL_ERRORS = 5

#: a stream name in the stream set without a config for this long is an orphan of a create or
#: delete that stopped half-way (API process killed); it is taken out of the set
ORPHAN_GRACE_SECONDS = 60.0

#: seconds between full scans of every stream (between them, a worker looks at the streams the
#: wake channel names and at its own pairs with backlog)
FULL_SCAN_SECONDS = 30.0

#: a pair's series stay in a worker's /metrics this long after it let the pair go (its last
#: values and counts reach Prometheus, and the 5-minute alert windows see them), then go
SERIES_GRACE_SECONDS = 300.0

#: a lease key's time to live and the lease keeper's period, as fractions of CUSP_LEASE_SECONDS
LEASE_TTL = 0.75
RENEW_EVERY = 0.25

#: heartbeats older than this many leases are dead workers' and are pruned from the registry
PRUNE_LEASES = 10

#: chunks per tally read while taking chunks into a stream's answer, and at most per answer commit
ANSWER_BATCH = 16
ANSWER_MAX_CHUNKS = 1024


@dataclass
class LoopHealth:
    """Whether a worker loop moves and its polls succeed; read by the worker's /healthz (another
    thread: plain attribute reads)."""

    stall_seconds: float
    last_step: float = field(default_factory=time.monotonic)  # monotonic time of the last completed step
    errors: int = 0  # polls failed in a row
    last_error: str = ""

    def step(self) -> None:
        self.last_step = time.monotonic()

    def succeeded(self) -> None:
        self.errors, self.last_error = 0, ""
        self.step()

    def failed(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        self.step()

    def problem(self) -> str | None:
        """Why the worker is unhealthy, or None."""
        idle = time.monotonic() - self.last_step
        if idle > self.stall_seconds:
            return f"the worker loop has not completed a step for {idle:.0f} s (CUSP_WORKER_STALL_SECONDS={self.stall_seconds:g})"
        if self.errors >= MAX_POLL_ERRORS:
            return f"the last {self.errors} polls failed: {self.last_error}"
        return None


class Worker:
    def __init__(self, redis_url: str, *, lease_seconds: float = 10.0, max_attempts: int = 3,
                 result_maxlen: int = 200_000, worker_id: str | None = None, batch: int = 16,
                 stall_seconds: float = 120.0, changepoint_maxlen: int = 10_000, warm_bytes: int = 0):
        torch.set_num_threads(1)
        self.store = WorkerStore(redis_url)
        self.health = LoopHealth(stall_seconds)
        self._beat = 0.0  # monotonic time of the last heartbeat written to Redis
        self._orphans: dict[str, float] = {}  # stream name without a config -> first seen (monotonic)
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_ms = int(lease_seconds * 1000)
        # The life key lives 3/4 of CUSP_LEASE_SECONDS and is renewed every quarter of it, so a
        # worker killed just after a renewal has its pairs taken over within the lease (three
        # renewals in a row must fail before a live worker loses them).
        self.ttl_ms = int(self.lease_ms * LEASE_TTL)
        self.renew_every = self.lease_ms / 1000 * RENEW_EVERY
        self.max_attempts = max_attempts
        self.result_maxlen = result_maxlen
        self.changepoint_maxlen = changepoint_maxlen
        self.batch = batch
        self.warm_bytes = warm_bytes  # 0: no limit
        self.hot: dict[tuple[str, str], Hot] = {}
        self._configs: dict[str, tuple[bytes, StreamConfig]] = {}  # stream -> (its uid, its config)
        self._hot_lock = threading.Lock()  # self.hot is read by the lease keeper thread
        self._lost: dict[tuple[str, str], bytes] = {}  # pairs taken over -> the token this worker had
        self._life_at = -math.inf  # monotonic time the life key was last renewed
        self._keeper: threading.Thread | None = None
        self._stop: threading.Event | None = None
        self._streams: list[str] = []  # the stream set at the last full scan
        self._stream_set: set[str] = set()
        self._pairs_total = 0  # stream x model pairs at the last full scan
        self._scanned = -math.inf  # monotonic time of the last full scan
        self._alive = 0  # live workers at the last poll
        self._rescan_at: float | None = None  # monotonic time of a full scan due after the live count fell
        self._recheck: dict[str, float] = {}  # stream -> monotonic time to look at it again (a stalled owner, ``_take``)
        self._backlog: set[tuple[str, str]] = set()  # held pairs that had more chunks than one batch
        self._turn = 0  # rotating start over the pairs of a poll
        self._unreleased: set[tuple[str, str]] = set()  # pairs dropped on a Redis error, their leases still ours
        self._let_go: dict[tuple[str, str], float] = {}  # pairs dropped -> when (their series go after a grace)

    # --- loop -------------------------------------------------------------------------------
    def run_forever(self, stop: threading.Event, idle_sleep: float = 0.5) -> None:
        """Work until ``stop`` is set. When there is nothing to do, wait up to ``idle_sleep``
        seconds (and at most a sixth of the lease, so the live-worker count and the full scans
        stay current) for a wake-up message from the ingest script, so a new chunk starts within
        a round trip. The lease keeper thread keeps this worker's pairs meanwhile."""
        M.WORKERS.inc()
        idle = min(idle_sleep, self.lease_ms / 6000)
        self._stop = stop
        self._keeper = threading.Thread(target=self._keep_leases, args=(stop,), name="cusp-lease-keeper", daemon=True)
        self._keeper.start()
        woken: set[str] | None = None  # None: look at every stream
        try:
            while not stop.is_set():
                try:
                    done = self.poll_once(woken)
                    M.REDIS_UP.set(1)
                    self.health.succeeded()
                    # the wake channel is read after every pass (at once after a busy one), so
                    # streams that got chunks meanwhile are seen next pass, not at the next scan
                    woken = self._wait_for_work(0.0 if done else idle)
                except (rexc.ConnectionError, rexc.TimeoutError, rexc.ClusterError, rexc.RedisClusterException,
                        rexc.TryAgainError, OSError) as exc:  # Redis (or a shard of a cluster) away
                    M.REDIS_UP.set(0)
                    self.health.failed(exc)
                    log.warning("redis unavailable (%s); retrying", exc)
                    self._reset_after_error()
                    woken = None
                    stop.wait(1.0)
                except Exception as exc:  # noqa: BLE001 - a worker must survive anything and retry
                    self.health.failed(exc)
                    log.exception("worker poll failed")
                    self._reset_after_error()
                    woken = None
                    stop.wait(1.0)
        finally:
            M.WORKERS.dec()
            self._close_wake()
            self.release_all()
            self._keeper.join(timeout=5)
            self._keeper = None

    def _wait_for_work(self, timeout: float) -> set[str] | None:
        """The streams named on the wake channel within ``timeout`` (None: unknown, look at all)."""
        return self.store.wait_for_wake(timeout)

    # --- the lease keeper (its own thread) ------------------------------------------------------
    def _keep_leases(self, stop: threading.Event) -> None:
        """Renew every held lease and write the heartbeat each quarter of a lease, independently of
        the loop: a chunk that computes for several leases keeps its lease, and a busy worker
        stays live. A lease found lost is reported to the loop (``_keep``), which drops the pair."""
        period = self.renew_every
        while not stop.wait(period):
            try:
                self._renew_all()
            except Exception as exc:  # noqa: BLE001 - Redis away: the loop reports it; try again next period
                log.warning("lease renewal failed (%s); retrying", exc)

    def _renew_all(self) -> None:
        self._stay_alive()
        if time.monotonic() - self.health.last_step < self.health.stall_seconds:  # alive and moving
            self.store.heartbeat(self.id, time.time())

    def _stay_alive(self) -> None:
        """Renew the life key. If it had lapsed (this worker was paused, or Redis lost it), other
        workers may have taken pairs over: those whose fencing token moved on are reported lost."""
        now = time.monotonic()
        continued = self.store.keep_alive(self.id, self.ttl_ms)
        self._life_at = now
        if continued:
            return
        with self._hot_lock:
            held = [(key, hot.token) for key, hot in self.hot.items()]
        for (key, token), current in zip(held, self.store.fences([k for k, _ in held])):
            if current is None or current != token:
                with self._hot_lock:
                    if key in self.hot and self.hot[key].token == token:
                        self._lost[key] = token

    def _close_wake(self) -> None:
        self.store.close_wake()

    def _reset_after_error(self) -> None:
        with self._hot_lock:
            # their leases still name this worker in Redis (it could not release them): the next poll
            # that gets through takes them again within its share and releases the rest
            self._unreleased.update(self.hot)
            self.hot.clear()
        self._close_wake()

    def run_until_idle(self, timeout: float = 120.0) -> int:
        """Burst mode: process until no pair has pending chunks; returns chunks applied."""
        total, deadline = 0, time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = self.poll_once()
            total += done
            if not done and not self._pending_anywhere():
                return total
            if not done:
                time.sleep(0.02)
        raise TimeoutError("worker still busy after burst timeout")

    def release_all(self) -> None:
        """Give the leases back and leave the worker registry (a clean stop)."""
        for (s, m), hot in list(self.hot.items()):
            try:
                self.store.mark_taken(s, m, hot.token, hot.last_seq)  # a clean stop: nothing taken is left undone
                self.store.release(s, m, self.id)
            except Exception:  # noqa: BLE001
                pass
        with self._hot_lock:
            self.hot.clear()
        M.WORKER_LEASES.set(0)
        try:
            self.store.retire(self.id)
            self.store.end_life(self.id)
        except Exception:  # noqa: BLE001 - Redis away: the entry ages out of the window
            pass

    # --- one pass ---------------------------------------------------------------------------
    def poll_once(self, woken: set[str] | None = None) -> int:
        """One pass: take, give back and process pairs; returns chunks applied. ``woken``: the
        streams the wake channel named since the last pass, looked at with this worker's pairs
        that have more backlog; None (or a full scan due): every stream."""
        with self._hot_lock:
            lost = [k for k, token in self._lost.items() if k in self.hot and self.hot[k].token == token]
        for key in lost:  # the lease keeper found these leases taken over
            log.warning("stream %s model %s: lease lost; dropped", *key)
            self._drop(key)
        now = time.time()
        alive = self.store.live_workers(self.id, now, self.ttl_ms / 1000)  # live: a heartbeat as young as a lease key
        mono = time.monotonic()
        # one more full scan a life key's time after the live count fell: the pass that saw the drop
        # may have found the dead worker's life key still there (it dies between its keeper's two
        # commands: a life key just renewed, a heartbeat from the keeper's previous period), and
        # nothing else would look at its pairs again before the next periodic scan
        again = self._rescan_at is not None and mono >= self._rescan_at
        full = woken is None or alive != self._alive or again or mono - self._scanned >= FULL_SCAN_SECONDS
        if alive < self._alive:
            self._rescan_at = mono + self.ttl_ms / 1000
        elif again:
            self._rescan_at = None
        self._alive = alive
        due = {s for s, at in self._recheck.items() if at <= mono}  # streams whose stalled owner is looked at again
        for s in due:
            del self._recheck[s]
        if full:
            self._streams = self.store.stream_names()
            self._stream_set = set(self._streams)
            self._scanned = time.monotonic()
            self.store.prune_workers(now - PRUNE_LEASES * self.lease_ms / 1000)
            looked = self._streams
        else:  # the woken streams (one created since the last scan too), this worker's backlog and those due
            looked = sorted(woken | {s for s, _ in self._backlog} | due)
        configs = self._configs_of(looked)
        if full:
            for s in {key[0] for key in self.hot} | {key[0] for key in self._let_go} | set(self._configs):
                if s not in configs and s not in self._stream_set:
                    self._gone(s)  # deleted
            for key in list(self.hot):
                if key[0] not in configs:
                    self._drop(key)
            self._pairs_total = sum(len(c.models) for c in configs.values())
        # the pairs that exist: as counted at the last scan, plus those of streams created since. A new
        # stream is counted from the poll that first sees it until the next full scan (counted in
        # this poll only, a worker's share dropped again at the next poll that did not look at it,
        # and it gave back pairs "above its share" with no worker joining: seen in a new user's log)
        for s, c in configs.items():
            if s not in self._stream_set:
                self._stream_set.add(s)
                self._pairs_total += len(c.models)
        pairs_total = self._pairs_total
        share = math.ceil(max(pairs_total, 1) / alive)
        pairs = [(s, e.name) for s in looked if s in configs for e in configs[s].models]
        if pairs:
            self._turn = (self._turn + 1) % len(pairs)
            pairs = pairs[self._turn:] + pairs[: self._turn]  # no pair always waits behind the others
        pending = dict(zip(pairs, self.store.pending(pairs)))
        self._give_back(share, pending)
        done = 0
        self._backlog.clear()
        for key in pairs:
            if self._stopping():
                break
            if key in self.hot:
                if not self._keep(self.hot[key]) or not pending[key]:
                    continue
            elif len(self.hot) < share and pending[key]:
                if not self._take(*key):
                    continue
            else:
                continue
            n = self._process(self.hot[key])
            done += n
            if n >= self.batch:
                self._backlog.add(key)
        for key in sorted(self._unreleased - set(self.hot)):
            # a pair held before a Redis error and not taken again: without this its lease would name
            # a live worker that does not work on it, and no other worker could take it (found with
            # a worker's share kept right across polls: the pair stalled after an embedded Redis restart)
            self.store.release(key[0], key[1], self.id)
        self._unreleased.clear()
        M.WORKER_LEASES.set(len(self.hot))
        self._cool()
        self._forget_series()
        self._progress(force=True)
        return done

    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    def _configs_of(self, streams: list[str]) -> dict[str, StreamConfig]:
        """The configs of ``streams`` that exist: a uid per stream in one round trip, and the config
        itself only for a stream this worker has not seen in this incarnation (a config never
        changes within one: a 7.5 MB config is not re-read every poll). Names without a config
        are swept as orphans after a grace period."""
        out: dict[str, StreamConfig] = {}
        for s, uid in zip(streams, self.store.uids(streams)):
            if uid is None:
                if self._configs.pop(s, None) is not None:
                    self._gone(s)  # deleted (its name not yet out of the set)
                self._sweep(s)
                continue
            self._orphans.pop(s, None)
            cached = self._configs.get(s)
            if cached is not None and cached[0] != uid:
                self._gone(s)  # deleted and created again: the pairs held and the series were the old stream's
            if cached is None or cached[0] != uid:
                raw = self.store.config_raw(s)
                if raw is None:
                    continue
                cached = self._configs[s] = (uid, StreamConfig.from_json(raw))
            out[s] = cached[1]
        return out

    def _give_back(self, share: int, pending: dict[tuple[str, str], bool]) -> None:
        """Above its share (a worker joined), release the excess, pairs without pending chunks
        first, so that the newcomer takes them now rather than never."""
        excess = len(self.hot) - share
        if excess <= 0:
            return
        order = sorted(self.hot, key=lambda k: (pending.get(k, False), k))
        for key in order[:excess]:
            self.store.mark_taken(key[0], key[1], self.hot[key].token, self.hot[key].last_seq)
            self.store.release(key[0], key[1], self.id)
            self._drop(key)
            log.info("released stream %s model %s: above this worker's share of %d (a worker joined)", key[0], key[1], share)

    def _progress(self, force: bool = False) -> None:
        """A step completed: tell /healthz, and Redis (for /readyz and load sharing) at least every
        quarter of a lease (``force``: at the end of every poll)."""
        self.health.step()
        now = time.monotonic()
        if force or now - self._beat >= self.renew_every:
            self.store.heartbeat(self.id, time.time())
            self._beat = now

    def _sweep(self, s: str) -> None:
        """A name in the stream set without a config: a stream being created or deleted, or the orphan
        of one that stopped half-way; taken out of the set once it stayed so for a grace period."""
        first = self._orphans.setdefault(s, time.monotonic())
        if time.monotonic() - first > ORPHAN_GRACE_SECONDS:
            log.info("stream name %r has had no config for %.0f s; removed from the stream set", s, ORPHAN_GRACE_SECONDS)
            self.store.forget_stream(s)
            del self._orphans[s]

    def _config(self, s: str) -> StreamConfig | None:
        return self._configs_of([s]).get(s)

    def _pending_anywhere(self) -> bool:
        configs = self._configs_of(self.store.stream_names())
        return any(self.store.pending([(s, e.name) for s, c in configs.items() for e in c.models]))

    def _take(self, s: str, m: str) -> bool:
        if time.monotonic() - self._life_at >= self.renew_every:  # alive before taking anything
            self._stay_alive()
        owner = self.store.owner(s, m)
        dead = ""
        if owner is not None and owner != self.id:
            alive, beat = self.store.life_and_beat(owner)
            if alive:
                # its owner runs; if its loop stalled (a life key without a recent heartbeat), the stream
                # is looked at again a life key's time from now: should the owner die while stalled, the
                # live count does not fall again and nothing else would look before the next periodic scan
                if beat is None or beat < time.time() - self.ttl_ms / 1000:
                    due = time.monotonic() + self.ttl_ms / 1000
                    self._recheck[s] = min(self._recheck.get(s, due), due)
                return False
            dead = owner  # its owner's life key lapsed: taken over, with a new fencing token
        token = self.store.acquire(s, m, self.id, dead)
        if not token:
            return False
        try:
            hot = self._load(s, m, token)
        except Exception:
            self.store.release(s, m, self.id)
            raise
        if hot is None:
            self.store.release(s, m, self.id)
            return False
        with self._hot_lock:
            self.hot[(s, m)] = hot
        for counter in (M.CHANGEPOINTS, M.OUTLIERS, M.DEAD_LETTERS, M.REDELIVERIES, M.FENCED_WRITES):
            counter.labels(s, m)  # series exist from 0, so increase() sees the first event
        self._answer(s)  # chunks every model applied but no answer took (a worker died in between)
        return True

    def _load(self, s: str, m: str, token: bytes) -> Hot | None:
        cfg = self._config(s)
        entry = cfg.model(m) if cfg else None
        if entry is None:
            return None
        h, res_raw = self.store.load(s, m)
        if not h:
            return None
        sampler = build(cfg, entry)
        state = load_state(h[b"state"])
        width = sampler.model.feature_width
        size = min(state.n, sampler.config.reservoir_capacity)
        reservoir = Reservoir.from_bytes(sampler.config.reservoir_capacity, width, (res_raw or b"")[: size * width * 8])
        hot = Hot(s, m, token, sampler, state, reservoir, int(h[b"last_seq"]), len(cfg.columns), columns=tuple(cfg.columns))
        if int(h.get(b"taken_through") or -1) > hot.last_seq:  # the previous owner had taken the next chunk and died
            hot.redelivered_through = hot.last_seq + 1
        dcfg = DetectorConfig.from_dict(cfg.detector)
        if dcfg.enabled:
            hot.detector = Detector(sampler, dcfg)
            raw = h.get(b"detector") or b""
            if raw:
                hot.dstate = hot.detector.restore(DetectorState.from_bytes(raw), lambda seqs: self._rows(s, seqs, hot.width))
            else:
                hot.dstate = hot.detector.init(detector_seed(model_seed(cfg, entry)))
        return hot

    def _rows(self, s: str, seqs: list[int], width: int) -> dict[int, torch.Tensor]:
        """The raw rows of input chunks ``seqs`` (sorted; a detector's history), in one read."""
        by_seq = dict(self.store.inputs(s, seqs[0], seqs[-1]))
        missing = [q for q in seqs if q not in by_seq]
        if missing:
            raise RuntimeError(f"stream {s}: input chunk(s) {missing[:5]} are gone; cannot restore the detector")
        return {q: rows_from_bytes(by_seq[q][b"rows"], int(by_seq[q][b"n"]), width) for q in seqs}

    def _keep(self, hot: Hot) -> bool:
        """Whether the pair is still this worker's; False (and dropped) if it was taken over. The
        lease keeper renews the worker's life key (``run_forever``); without one (burst mode) it
        is renewed here when a quarter of a lease has passed."""
        key = (hot.stream, hot.model)
        if self._keeper is None and time.monotonic() - self._life_at >= self.renew_every:
            self._stay_alive()
        with self._hot_lock:
            lost = self._lost.pop(key, None)
        if lost is not None and lost == hot.token:
            self._drop(key)
            return False
        return True

    def _drop(self, key: tuple[str, str]) -> None:
        with self._hot_lock:
            held = self.hot.pop(key, None)
            self._lost.pop(key, None)
        self._backlog.discard(key)
        if held is not None:
            self._let_go[key] = time.monotonic()

    def _gone(self, stream: str) -> None:
        """A stream deleted (or deleted and created again, a new incarnation): its pairs held here go
        and every series of it leaves this worker's /metrics now, without the grace a pair let go
        keeps (its counts would carry on into the new stream's, its last values stay on a stream
        that no longer exists: a new user saw cusp_observations_seen of a deleted stream, and of
        the old stream after it was created again)."""
        for key in [k for k in self.hot if k[0] == stream]:
            self._drop(key)
        for key in [k for k in self._let_go if k[0] == stream]:
            del self._let_go[key]
        self._configs.pop(stream, None)
        M.forget_stream(stream)

    def _forget_series(self, grace: float = SERIES_GRACE_SECONDS) -> None:
        """Series of pairs let go more than ``grace`` ago leave this worker's exposition, and a
        stream's own series once none of its pairs is held (issue 18: a worker exported ~23,000
        series for 400 pairs and kept those of pairs it no longer held)."""
        now = time.monotonic()
        for key, at in list(self._let_go.items()):
            if key in self.hot:
                del self._let_go[key]
            elif now - at >= grace:
                del self._let_go[key]
                M.forget(*key)
                if not any(s == key[0] for s, _ in self.hot) and not any(s == key[0] for s, _ in self._let_go):
                    M.forget(key[0])

    # --- processing -------------------------------------------------------------------------
    def _cool(self) -> None:
        """Let the least recently used pairs cool until the warm ones fit in ``warm_bytes``: their
        state, reservoir and detector go (all in Redis already), their lease stays; ``_warm``
        reloads one when it next has a chunk. Bounds a worker's memory however many pairs it holds
        (each mature pair keeps up to reservoir_capacity rows)."""
        sizes = {key: hot.nbytes() for key, hot in list(self.hot.items())}
        total = sum(sizes.values())
        if self.warm_bytes and total > self.warm_bytes:
            for key in sorted((k for k in sizes if sizes[k]), key=lambda k: self.hot[k].used):
                hot = self.hot[key]
                hot.cold, hot.state, hot.reservoir, hot.dstate, hot.sampler, hot.detector = True, None, None, None, None, None
                total -= sizes[key]
                if total <= self.warm_bytes:
                    break
        M.WORKER_WARM_BYTES.set(total)

    def _warm(self, hot: Hot) -> Hot | None:
        """A cooled pair loaded again from Redis under the lease it kept (None: it is gone)."""
        fresh = self._load(hot.stream, hot.model, hot.token)
        key = (hot.stream, hot.model)
        if fresh is None:
            self._drop(key)
            return None
        # what the worker knew of it: not redeliveries because it took them itself
        fresh.redelivered_through, fresh.reliable, fresh.first_time = hot.redelivered_through, hot.reliable, hot.first_time
        with self._hot_lock:
            if self.hot.get(key) is hot:
                self.hot[key] = fresh
        M.WORKER_RELOADS.inc()
        return fresh

    def _process(self, hot: Hot) -> int:
        if hot.cold:
            hot = self._warm(hot)
            if hot is None:
                return 0
        hot.used, hot.size = time.monotonic(), None
        s, m = hot.stream, hot.model
        entries = self.store.inputs(s, hot.last_seq + 1, count=self.batch)
        last_in = self.store.last_ingested(s)
        if entries:  # a next owner tells what it processes again from this (cusp_redeliveries_total)
            self.store.mark_taken(s, m, hot.token, entries[-1][0])
        done = 0
        for seq, fields in entries:
            if done and self._stopping():  # SIGTERM: the chunk in hand is finished, no more
                break
            if seq != hot.last_seq + 1:
                log.error("stream %s model %s: expected seq %d, found %d", s, m, hot.last_seq + 1, seq)
                break
            if not self._keep(hot):
                break
            outcome = self._one(hot, seq, fields)
            if outcome != "ok":
                break
            done += 1
            self._progress()
        if done and s in self._configs:  # the config poll_once just read: no second GET per batch
            models = self._configs[s][1].models
            self.store.trim_inputs(s, [x.name for x in models])
        if last_in is not None:
            M.INGEST_LAG.labels(s, m).set(max(0, last_in - hot.last_seq))
        return done

    def _one(self, hot: Hot, seq: int, fields: dict) -> str:
        s, m = hot.stream, hot.model
        t0 = time.perf_counter()
        rows = rows_from_bytes(fields[b"rows"], int(fields[b"n"]), hot.width)
        stamps = T.from_fields(fields, int(rows.shape[0]))
        try:
            state, result, writes = hot.sampler.update(hot.state, rows, hot.reservoir)
        except (ModelError, EngineError, ValueError, FloatingPointError) as exc:
            return self._failed(hot, seq, exc, int(rows.shape[0]))
        reservoir, events, dstate, det_bytes, pending, standing = None, [], None, b"", [], None
        if hot.detector is not None:
            step = hot.detector.update(hot.dstate, seq, rows, hot.state, state, result, self._interval(hot, fields, stamps),
                                       hot.reservoir)
            dstate, result, events, pending, standing = step.state, step.result, step.events, step.pending, step.standing
            if step.promoted is not None:  # the model restarts at the change: its state and history
                state = step.promoted
                if step.reservoir is not None:  # (none for an outlier taken out: the history stays)
                    writes, reservoir = step.writes, step.reservoir
            det_bytes = dstate.to_bytes()
        # the stream's chunk count: a model restarted at a change has a state of its own count
        chunks = dstate.chunks if dstate is not None else state.chunks
        end = float(stamps[-1])
        events = [self._placed(s, seq, fields, stamps, ev) for ev in events]
        data = {"seq": seq, "chunk": chunks - 1, **result.to_dict(), "time_start": T.format(float(stamps[0])),
                "time_end": T.format(end)}
        outs = [m, "result", json.dumps(data)]
        for ev in events:
            outs += [m, "changepoint", json.dumps({"seq": seq, **ev.to_dict(), "columns": named(ev.columns, hot.columns),
                                                   **T.timed(ev.location_time, end)})]
        # what this chunk adds to the stream's answer (taken by _answer once every model applied it)
        tally = json.dumps({"rows": int(rows.shape[0]), "n": result.n, "log_evidence": result.log_evidence,
                            "events": [ev.to_dict() for ev in events], "time_end": end,
                            **({"pending": [[int(a), float(q)] for a, q in pending]} if pending else {}),
                            **({"standing": [int(standing[0]), float(standing[1])]} if standing is not None else {})})
        row_bytes = hot.reservoir.width * 8
        slot_args = self._slot_runs(writes)
        status = self.store.apply(s, m, hot.token, seq, state.to_bytes(), result.n, result.log_evidence, chunks, det_bytes,
                                  self._keep_from(seq, dstate), row_bytes, self.result_maxlen, outs, slot_args,
                                  tally, self.changepoint_maxlen)
        if status != "ok":
            if status == "fenced" and not self.store.stream_exists(s):
                log.info("stream %s was deleted while model %s processed seq %d; result dropped", s, m, seq)
            elif status == "fenced":
                M.FENCED_WRITES.labels(s, m).inc()
                log.warning("stream %s model %s: write for seq %d fenced off (lease lost)", s, m, seq)
            self._drop((s, m))
            return status
        hot.state, hot.last_seq, hot.dstate = state, seq, dstate
        if seq <= hot.redelivered_through:
            M.REDELIVERIES.labels(s, m).inc()
        if reservoir is not None:
            hot.reservoir = reservoir.copy()
        else:
            hot.reservoir.apply(writes)
        self._observe(s, m, result, time.perf_counter() - t0)
        if result.reliable != hot.reliable:
            hot.reliable = result.reliable
            if result.reliable:
                log.info("stream %s model %s seq %d: the evidence shows no reliability warning again", s, m, seq)
            else:
                log.warning("stream %s model %s seq %d: unreliable evidence (%s): %s", s, m, seq, ", ".join(result.warnings),
                            "; ".join(WARNINGS[w] for w in result.warnings))
        for at, gain in result.outliers:
            M.OUTLIERS.labels(s, m).inc()
            log.info("stream %s model %s: observation %d taken for an outlier (log BF %.1f): the model goes on without it",
                     s, m, at, gain)
        for ev in events:
            M.CHANGEPOINTS.labels(s, m).inc()
            M.CHANGEPOINT_CONFIDENCE.labels(s, m).set(ev.confidence)
            M.CHANGEPOINT_LAST_OBSERVATION.labels(s, m).set(ev.location)
            log.info("stream %s model %s: change point at observation %d (confidence %.4f, log BF %.1f)%s",
                     s, m, ev.location, ev.confidence, ev.log_bayes_factor, moved(ev.columns, hot.columns))
        self._answer(s)
        return "ok"

    def _interval(self, hot: Hot, fields: dict, stamps: np.ndarray) -> float | None:
        """The stream's mean time between rows through this chunk, for a detector whose
        expected_run_length is a duration (else None, and nothing is read)."""
        if hot.detector is None or hot.detector.run_length_seconds is None or b"i0" not in fields:
            return None
        if hot.first_time is None:
            hot.first_time = self.store.first_time(hot.stream)
        return T.seconds_per_row(hot.first_time, float(stamps[-1]), int(fields[b"i0"]) + int(stamps.shape[0]))

    def _placed(self, s: str, seq: int, fields: dict, stamps: np.ndarray, ev: Event) -> Event:
        """An event placed in the stream: row ``ev.row`` of chunk ``ev.seq`` (this chunk, ``fields``
        and ``stamps``, or an earlier one still in the inbox: the detector keeps the chunks a change
        may start in from being trimmed). ``location`` and ``detected_at`` become the stream's row
        indices (field ``i0``: the stream's rows before a chunk), which the model's own count lags
        after a chunk it dead-lettered (a change at row 54 after a dead-lettered chunk of 4 rows was
        reported at 50); ``location_time`` is that row's time. Where the chunk is gone the event
        keeps the model's count and has no time; where it predates ``i0``, the model's count."""
        if ev.seq == seq:
            got, times = fields, stamps
        else:
            old = self.store.inputs(s, ev.seq, ev.seq)
            if not old:
                return replace(ev, location_time=None)
            got = old[0][1]
            times = T.from_fields(got, int(got[b"n"]))
        if not 0 <= ev.row < times.shape[0]:
            return replace(ev, location_time=None)
        if b"i0" not in got or b"i0" not in fields:
            return replace(ev, location_time=float(times[ev.row]))
        location = int(got[b"i0"]) + ev.row
        detected = int(fields[b"i0"]) + int(stamps.shape[0])
        return replace(ev, location=location, detected_at=detected, delay=detected - location,
                       location_time=float(times[ev.row]))

    # --- the stream's answer ------------------------------------------------------------------
    def _answer(self, s: str) -> None:
        """Take the chunks every model of stream ``s`` has applied into the stream's answer
        (``service.detect.StreamAnswer``: the models' events weighted by their posterior
        probabilities) and store the stream change points it finds. Whichever worker applies a
        chunk's last model does it (and a worker taking a pair catches up what a crash left); a
        compare-and-set on the answer's cursor makes that once per chunk, and since the answer is
        a function of the chunks' records, any worker computes the same. Costs one HMGET per
        applied chunk while other models are behind."""
        got = self._configs.get(s)
        if got is None:
            return
        cfg = got[1]
        names = [e.name for e in cfg.models]
        cursor, raw_state, uid = self.store.answer_head(s)
        if uid is None:
            return
        if cursor is None:  # a stream from before the answer existed: start at its oldest waiting record
            waiting = [int(f.split(b":", 1)[0]) for f in self.store.tally_fields(s)]
            if not waiting:
                return
            start = min(waiting) - 1
        else:
            start = cursor
        answer = stream_answer(cfg).load(json.loads(raw_state) if raw_state else None)
        taken: list[str] = []
        found: list[tuple[int, StreamChange, float | None]] = []  # (seq, change, its chunk's last time)
        entries: list[tuple[str, str]] = []  # (kind, JSON) of the changes and withdrawals, in the order made
        withdrawn: list[tuple[int, StreamWithdrawal]] = []
        seq = start + 1
        while len(taken) < ANSWER_MAX_CHUNKS * len(names):
            span = range(seq, seq + ANSWER_BATCH)
            fields = [tally_field(q, m) for q in span for m in names]
            records = dict(zip(fields, self.store.tallied(s, fields)))
            for q in span:
                recs = [records[tally_field(q, m)] for m in names]
                if any(r is None for r in recs):
                    break
                recs = [json.loads(r) for r in recs]
                evidence = {m: None if r.get("dead") else (r["n"], r["log_evidence"]) for m, r in zip(names, recs)}
                events = {m: [Event.from_dict(e) for e in r.get("events", ())] for m, r in zip(names, recs)}
                pending = {m: [(int(a), float(p)) for a, p in r.get("pending", ())] for m, r in zip(names, recs)}
                standing = {m: (int(r["standing"][0]), float(r["standing"][1])) for m, r in zip(names, recs) if "standing" in r}
                new = answer.chunk(recs[0]["rows"], evidence, events, pending, standing)
                end = recs[0].get("time_end")
                for w in answer.withdrawn:  # (judged before the chunk's new changes)
                    withdrawn.append((q, w))
                    entries.append(("stream_changepoint_withdrawn", json.dumps(
                        {"seq": q, **w.to_dict(), **T.timed_withdrawal(w.location_time, end)})))
                for c in new:
                    found.append((q, c, end))
                    entries.append(("stream_changepoint", json.dumps({"seq": q, **c.to_dict(), "columns": named(c.columns, cfg.columns),
                                                                      **T.timed(c.location_time, end)})))
                taken += [tally_field(q, m) for m in names]
                seq = q + 1
            else:
                continue
            break
        if not taken:
            return
        status = self.store.commit_answer(s, uid, cursor, seq - 1, json.dumps(answer.to_dict()), taken,
                                          entries,
                                          self.changepoint_maxlen, self.result_maxlen,
                                          "" if answer.probabilities is None else
                                          json.dumps({"n": answer.compared_n, "p": answer.probabilities,
                                                      "last": answer.last_change()}))
        if status != "ok":  # another worker took these chunks (it computed the same), or the stream is gone
            return
        M.STREAM_CHANGEPOINTS.labels(s).inc(0)  # the series exist from the stream's first answer on
        M.STREAM_CHANGEPOINTS_WITHDRAWN.labels(s).inc(0)
        for q, w in withdrawn:
            M.STREAM_CHANGEPOINTS_WITHDRAWN.labels(s).inc()
            log.info("stream %s, after seq %d: %s", s, q, w.describe())
        for q, c, _ in found:
            M.STREAM_CHANGEPOINTS.labels(s).inc()  # (the last change's gauges are the API's, from the answer's hash)
            support = ", ".join(f"{m} p={p:.3g}" for m, (p, _) in sorted(c.support.items()))
            log.info("stream %s: change point at observation %d (confidence %.4f, detected at %d after seq %d; %s)%s",
                     s, c.location, c.confidence, c.detected_at, q, support, moved(c.columns, cfg.columns))

    @staticmethod
    def _keep_from(seq: int, dstate: DetectorState | None) -> int:
        """The first input seq this pair may still read once ``seq`` is applied: the next chunk, or
        the oldest chunk its detector re-reads on restore. The stream's input is trimmed below the
        smallest of these over its models."""
        oldest = dstate.oldest_seq() if dstate is not None else None
        return seq + 1 if oldest is None else min(seq + 1, oldest)

    @staticmethod
    def _slot_runs(writes) -> list:
        """(first slot, bytes) per run of consecutive slots: until the reservoir fills, every row
        is a write, and one SETRANGE argument pair per row cost more than the engine itself."""
        if len(writes) == 0:
            return []
        slots = writes.slots.numpy()
        order = np.argsort(slots, kind="stable")
        slots = slots[order]
        rows = np.ascontiguousarray(writes.rows.numpy()[order], dtype="<f8")
        cut = np.flatnonzero(np.diff(slots) != 1) + 1
        out: list = []
        for a, b in zip(np.r_[0, cut], np.r_[cut, len(slots)]):
            out += [int(slots[a]), rows[a:b].tobytes()]
        return out

    def _failed(self, hot: Hot, seq: int, exc: Exception, rows: int) -> str:
        s, m = hot.stream, hot.model
        n = self.store.count_failure(s, m, seq)
        err = f"{type(exc).__name__}: {exc}"
        # (the sampler's own failures fail the same way every time, from the same state, seed and chunk:
        # a value the model cannot hold, TooLarge, and particles that diverged, EngineError; dead-lettered at
        # once, not after CUSP_MAX_ATTEMPTS tries that held the model's later chunks, and with them the
        # stream's answer, back for tens of seconds each: a new user's lr of 1e300, one chunk a minute)
        if n < self.max_attempts and not isinstance(exc, EngineError):
            M.REDELIVERIES.labels(s, m).inc()
            log.warning("stream %s model %s seq %d failed (attempt %d/%d): %s", s, m, seq, n, self.max_attempts, err)
            return "retry"
        status = self.store.dead_letter(s, m, hot.token, seq, err, self.result_maxlen, json.dumps({"seq": seq, "error": err}),
                                        self._keep_from(seq, hot.dstate), json.dumps({"rows": rows, "dead": True}))
        if status == "ok":
            hot.last_seq = seq
            M.DEAD_LETTERS.labels(s, m).inc()
            log.error("stream %s model %s seq %d dead-lettered after %d attempts: %s", s, m, seq, n, err)
            self._answer(s)
            return "ok"
        self._drop((s, m))
        return "fenced"

    @staticmethod
    def _observe(s: str, m: str, r, seconds: float) -> None:
        M.LOG_EVIDENCE.labels(s, m).set(r.log_evidence)
        M.LOG_EVIDENCE_PER_OBS.labels(s, m).set(r.log_evidence_per_observation)
        if r.log_predictive_per_observation is not None:  # None: a warm-up chunk, nothing scored
            M.CHUNK_LOG_PREDICTIVE.labels(s, m).set(r.log_predictive_per_observation)
        M.ANNEALING_STEPS.labels(s, m).observe(r.annealing_steps)
        M.ANNEALING_STEPS_LAST.labels(s, m).set(r.annealing_steps)
        if r.ess_after is not None:  # None: the exact method has no particles
            M.ESS.labels(s, m).set(r.ess_after)
        M.RESULT_RELIABLE.labels(s, m).set(1 if r.reliable else 0)
        for w in r.warnings:
            M.UNRELIABLE_CHUNKS.labels(s, m, w).inc()
        M.RESAMPLES.labels(s, m).inc(r.resamples)
        M.CHUNKS.labels(s, m).inc()
        M.OBSERVATIONS.labels(s, m).inc(r.rows)
        M.OBSERVATIONS_SEEN.labels(s, m).set(r.n)
        M.CHUNK_SECONDS.labels(s, m).observe(seconds)

"""The Redis key schema: every key cusp uses is built here.

Every per-stream key carries the hash tag ``{stream}`` so that a Redis Cluster keeps one
stream's keys on one shard (the Lua scripts touch several of them atomically). The global keys
(the stream set, the worker registry) hash to slots of their own: no script or transaction uses
a global key together with a per-stream key (that is a CROSSSLOT error on a cluster). How create,
delete and the stream limit stay correct without that atomicity: ``ApiStore.create``/``delete``
and docs/architecture.md (Redis).

| key | type | what |
|---|---|---|
| ``cusp:streams`` | set | names of existing streams, and of streams being created or deleted: every stream with a config is in it; a name without a config is skipped by readers and removed by workers after a grace period |
| ``cusp:{cusp:streams}:bytes`` | hash | stream name -> the bytes its models may come to need (particles plus full reservoirs), counted against ``CUSP_MAX_TOTAL_STREAM_BYTES``; in the stream set's slot |
| ``cusp:worker:<id>`` | string | a worker's life key, renewed by its lease keeper every quarter of ``CUSP_LEASE_SECONDS``, living three quarters of it: while it exists, the pairs whose lease names that worker are its |
| ``cusp:workers`` | zset | worker id -> last progress (unix seconds): written by the worker loop at least every third of a lease; used to share leases and by ``/readyz`` |
| ``cusp:wake`` | pub/sub channel | a message per accepted chunk (the stream's ``seq`` key name); idle workers block on it and then look at the named streams only |
| ``cusp:{s}:config`` | string | the stream's JSON config: columns, models, sampler, seed, limits |
| ``cusp:{s}:uid`` | string | this incarnation of the stream (a random id set at create): an ingest that names another (a WebSocket opened before a delete and a re-create) writes nothing |
| ``cusp:{s}:in`` | stream | ingested chunks; entry id ``<seq+1>-0``; fields ``rows`` (float64 bytes), ``n``, ``i0`` (the stream's rows before it), and ``t`` (the rows' times, float64 epoch seconds) or ``t0`` (the chunk's arrival time, every row's); trimmed below every model's ``keep_from`` |
| ``cusp:{s}:seen`` | stream | digest of each accepted chunk (entry id ``<seq+1>-0``, field ``d``), capped at about ``CUSP_DEDUP_WINDOW`` entries, so a resend is recognised after its input entry was trimmed |
| ``cusp:{s}:seq`` | string | last accepted sequence number |
| ``cusp:{s}:clock`` | hash | ``first``, ``last``: the stream's first and last time (epoch seconds, decimal; a chunk's own times must start after ``last``, arrival times never go below it); ``rows``: rows accepted; ``w``, ``z<c>``, ``f<c>``, ``m<c>``: rows counted per column since the counts began (2026-12-07), their zeros, whether one was not a whole number >= 0, their largest value (the sparse-counts note) |
| ``cusp:{s}:out`` | stream | results of every model and change-point events, in apply order; fields ``model``, ``kind``, ``data`` (JSON) |
| ``cusp:{s}:{m}:state`` | hash | ``state`` (SGAIS state bytes), ``last_seq``, ``n``, ``log_evidence``, ``chunks``, ``detector``, ``keep_from`` (first input seq it may still read), ``error``, ``taken_through`` (the last seq its owner took into a batch: what a new owner processes again is a redelivery) |
| ``cusp:{s}:{m}:res`` | string | reservoir rows, float64, slot i at byte offset i * row_bytes (SETRANGE) |
| ``cusp:{s}:{m}:lease`` | string | worker id holding the pair (no time to live: the pair is that worker's while its life key ``cusp:worker:<id>`` exists; another worker takes it over once it does not, with a new fencing token) |
| ``cusp:{s}:{m}:fence`` | string | fencing token, incremented on every lease acquisition |
| ``cusp:{s}:{m}:attempts`` | hash | seq -> failed attempts (survives worker crashes) |
| ``cusp:{s}:dead`` | stream | dead-lettered chunks: model, seq, error |
| ``cusp:{s}:tally`` | hash | ``<seq>:<model>`` -> what the model's apply of that chunk contributes to the stream's answer (JSON: rows, n, log-evidence, its events, its open challengers' (location, probability) as ``pending``, its last change's (location, probability now) as ``standing``; or dead-lettered); written by APPLY/DEAD_LETTER, removed once the answer has taken the chunk |
| ``cusp:{s}:answer`` | hash | the stream's model-averaged answer (``service.detect.StreamAnswer``): ``cursor`` (the last seq it took), ``state`` (JSON), ``probabilities`` (JSON: the posterior model probabilities at its last compared chunk and the observations then, and ``last``: the last change standing, [location, confidence], for the API's last-change gauges) |
| ``cusp:{s}:changes`` | stream | change points, separate from ``out`` so that result trimming does not lose them: each model's events (kind ``changepoint``) and the stream's (kind ``stream_changepoint``, model ``*``; and ``stream_changepoint_withdrawn`` for those withdrawn); fields as in ``out``; capped at about ``CUSP_CHANGEPOINT_MAXLEN`` entries |
"""

from __future__ import annotations

import re

STREAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

STREAMS = "cusp:streams"


def life(worker_id: str) -> str:
    """A worker's life key: it exists (with a time to live its lease keeper renews) while the
    worker runs; a pair whose owner has no life key may be taken over."""
    return f"cusp:worker:{worker_id}"

WORKERS = "cusp:workers"
#: stream name -> the Redis bytes its models may come to need (what the deployment cap counts);
#: the hash tag puts it in the slot of ``cusp:streams`` (whose whole name is its tag), so one
#: script can check and take both
STREAM_BYTES = "cusp:{cusp:streams}:bytes"
WAKE = "cusp:wake"  # pub/sub channel: the ingest script publishes on it, idle workers wait on it


def config(s: str) -> str:
    return f"cusp:{{{s}}}:config"


def uid(s: str) -> str:
    return f"cusp:{{{s}}}:uid"


def inbox(s: str) -> str:
    return f"cusp:{{{s}}}:in"


def seen(s: str) -> str:
    return f"cusp:{{{s}}}:seen"


def seq(s: str) -> str:
    return f"cusp:{{{s}}}:seq"


def clock(s: str) -> str:
    return f"cusp:{{{s}}}:clock"


def stream_of_seq_key(key: bytes | str) -> str | None:
    """The stream name in a ``seq`` key (what the ingest script publishes on WAKE), else None."""
    k = key.decode() if isinstance(key, bytes) else key
    if k.startswith("cusp:{") and k.endswith("}:seq"):
        return k[len("cusp:{"):-len("}:seq")]
    return None


def out(s: str) -> str:
    return f"cusp:{{{s}}}:out"


def dead(s: str) -> str:
    return f"cusp:{{{s}}}:dead"


def tally(s: str) -> str:
    return f"cusp:{{{s}}}:tally"


def answer(s: str) -> str:
    return f"cusp:{{{s}}}:answer"


def changes(s: str) -> str:
    return f"cusp:{{{s}}}:changes"


def tally_field(seq_no: int, m: str) -> str:
    return f"{seq_no}:{m}"


def state(s: str, m: str) -> str:
    return f"cusp:{{{s}}}:{m}:state"


def reservoir(s: str, m: str) -> str:
    return f"cusp:{{{s}}}:{m}:res"


def lease(s: str, m: str) -> str:
    return f"cusp:{{{s}}}:{m}:lease"


def fence(s: str, m: str) -> str:
    return f"cusp:{{{s}}}:{m}:fence"


def attempts(s: str, m: str) -> str:
    return f"cusp:{{{s}}}:{m}:attempts"


def model_keys(s: str, m: str) -> list[str]:
    return [state(s, m), reservoir(s, m), lease(s, m), fence(s, m), attempts(s, m)]


def stream_keys(s: str, models: list[str]) -> list[str]:
    keys = [config(s), uid(s), inbox(s), seen(s), seq(s), clock(s), out(s), dead(s), tally(s), answer(s), changes(s)]
    for m in models:
        keys += model_keys(s, m)
    return keys


def entry_id(seq_no: int) -> str:
    """Input entry id for a sequence number (ids must be > 0-0, so seq 0 is 1-0)."""
    return f"{seq_no + 1}-0"


def seq_of(entry: str | bytes) -> int:
    e = entry.decode() if isinstance(entry, bytes) else entry
    return int(e.split("-", 1)[0]) - 1

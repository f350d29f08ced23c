"""What the routes do, apart from HTTP: create a stream (validated against its models and the
engine), summarise its models, check and store a chunk, average change points over models.
Redis is reached through the store only; errors are HTTP errors (or ``ChunkError`` for chunks,
which the WebSocket ingest answers as messages)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import re
import time
import unicodedata
import uuid
from collections.abc import Callable

import numpy as np
import torch

from models import ModelError, build_model
from models.registry import SUPERVISED, default_model_name, default_portfolio, spec_problem
from service import metrics as M
from service import times as T
from service.api.chunks import ChunkError
from service.api.errors import ApiError
from service.api.schemas import ModelFrame, ModelIn, ModelOut, StreamIn, StreamOut
from service.data import MAX_MAGNITUDE, log_model_probabilities, too_large
from service.detect import DetectorConfig
from service.detect.answer import counts_note
from service.runtime import build, cached_model, log_model_priors, model_seed, sampler_config
from service.settings import Settings
from service.sgais import ConfigError, load_state
from service.sgais.engine import beyond_limit
from service.store import ModelEntry, StreamConfig, digest, keys
from service.store.api import ApiStore, StreamProgress

#: seconds a client refused for a full backlog is asked to wait (Retry-After)
BACKLOG_RETRY_AFTER = 1

#: the largest particles x parameters a stream's model may ask for (its state is 8 bytes per entry, in Redis)
MAX_PARTICLE_VALUES = 10_000_000


async def find_stream(store: ApiStore, name: str) -> StreamConfig | None:
    return await store.config(name) if keys.STREAM_NAME.fullmatch(name) else None


async def stream_config(store: ApiStore, name: str) -> StreamConfig:
    """The stream's config, or 404."""
    cfg = await find_stream(store, name)
    if cfg is None:
        raise ApiError(404, "stream_not_found", f"no stream named {name!r}")
    return cfg


# --- streams --------------------------------------------------------------------------------
def _non_finite(v: object, path: str = "") -> str | None:
    """The path (``sampler.overrides.lr``, ``models[1].prior``) of the first NaN or infinite number in
    ``v``, or None."""
    if isinstance(v, float) and not math.isfinite(v):
        return path or "body"
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, (list, tuple)) else ()
    for k, x in items:
        found = _non_finite(x, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}" if path else str(k))
        if found is not None:
            return found
    return None


def check_names(body: StreamIn) -> None:
    """A create request's own faults (422): non-finite numbers, the stream's and columns' names."""
    # NaN or infinity anywhere (sampler overrides are free-form) could not be stored or echoed as JSON;
    # the field is named (a new user could not tell which of a body's numbers it was)
    where = _non_finite(body.model_dump())
    if where is not None:
        raise ApiError(422, "invalid_stream", f"{where}: NaN and infinity are not accepted")
    if not keys.STREAM_NAME.fullmatch(body.name):
        raise ApiError(422, "invalid_stream", "stream name must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
    if len(set(body.columns)) != len(body.columns) or any(not c.strip() for c in body.columns):
        raise ApiError(422, "invalid_stream", f"column names must be non-empty and distinct, got {body.columns}")
    # (a CSV header's cells are read stripped, and a control character cannot be typed in one: a new
    # user's "a\nb" and " x" were accepted, and no CSV chunk could then name them)
    odd = [c for c in body.columns if c != c.strip() or any(unicodedata.category(ch) == "Cc" for ch in c)]
    if odd:
        raise ApiError(422, "invalid_stream", f"column name {odd[0]!r} starts or ends with a space or holds a control "
                                              "character: a CSV header could not name it")


def config_from_request(body: StreamIn) -> StreamConfig:
    """The stream's config, checked against the models it names and the detector (422 naming what is wrong)."""
    entries: list[ModelEntry] = []
    for i, m in enumerate(body.models or default_portfolio(len(body.columns))):
        m = ModelIn(spec=m) if isinstance(m, str) else m
        name = m.name if m.name is not None else default_model_name(m.spec)
        if not keys.MODEL_NAME.fullmatch(name):
            raise ApiError(422, "invalid_model", f"model {i}: name {name!r} must be 1-64 letters, digits, '_', '.' or '-'")
        if any(e.name == name for e in entries):
            raise ApiError(422, "invalid_model", f"model name {name!r} is used twice; give each model a distinct 'name'")
        # the model as the request gave it: its spec, and its name where the request named it
        said = f"{m.spec!r}" if m.name is None else f"{name!r} ({m.spec!r})"
        target = None
        if m.target is not None:
            if m.target not in body.columns:
                raise ApiError(422, "invalid_model", f"model {said}: target column {m.target!r} is not one of {body.columns}")
            target = body.columns.index(m.target)
        problem = spec_problem(m.spec)
        if problem is not None:  # 'level:' was taken, and named 'level_'
            raise ApiError(422, "invalid_model", f"model {said}: {problem}")
        try:
            model = build_model(m.spec, len(body.columns), target)
        except ModelError as exc:
            raise ApiError(422, "invalid_model", f"model {said}: {exc}") from None
        if m.target is not None and model.name not in SUPERVISED:
            raise ApiError(422, "invalid_model", f"model {said}: 'target' applies only to {sorted(SUPERVISED)}")
        entries.append(ModelEntry(name=name, spec=m.spec, target=target, prior=m.prior))
    cfg = StreamConfig(name=body.name, columns=body.columns, models=entries,
                       sampler={"preset": body.sampler.preset, "overrides": body.sampler.overrides},
                       seed=body.seed, detector=body.detector, created=time.time(), uid=uuid.uuid4().hex,
                       max_backlog=body.max_backlog)
    try:
        DetectorConfig.from_dict(body.detector)
    except ConfigError as exc:
        raise ApiError(422, "invalid_stream", str(exc)) from None
    return cfg


def initial_states(cfg: StreamConfig, max_bytes: int | None = None) -> tuple[list[bytes], int]:
    """(each model's first state (SGAIS: its prior draws), the bytes of Redis the models may come
    to need: their states and their reservoirs once full, or a framed mixture's warm-up rows if
    more), or 422 if the sampler settings are
    invalid, or 413 when that is more than ``max_bytes``, checked before any state is drawn."""
    try:
        samplers = [(e, build(cfg, e)) for e in cfg.models]
        need = 0
        for e, sampler in samplers:
            values = sampler.config.particles * sampler.model.dim
            if getattr(sampler, "method", "sgais") == "sgais" and values > MAX_PARTICLE_VALUES:
                raise ApiError(422, "invalid_model", f"model {e.name!r}: {sampler.config.particles} particles x {sampler.model.dim} parameters "
                                         f"exceeds {MAX_PARTICLE_VALUES:,} values")
            # (a framed mixture keeps its warm-up's raw rows until they are all in, before its reservoir fills)
            buffered = getattr(sampler.model, "warmup", 0) * len(cfg.columns) if hasattr(sampler.model, "frame_of") else 0
            need += 8 * (values + max(sampler.config.reservoir_capacity * sampler.model.feature_width, buffered))
        if max_bytes is not None and need > max_bytes:
            raise ApiError(413, "stream_too_large", f"the stream's models would need about {need / 2**20:,.0f} MiB of Redis (particles and "
                                     f"reservoirs of {samplers[0][1].config.reservoir_capacity:,} rows, or a mixture's warm-up rows), more than "
                                     f"CUSP_MAX_STREAM_BYTES={max_bytes / 2**20:,.0f} MiB; use fewer or smaller models, "
                                     "fewer particles or a smaller reservoir_capacity")
        return [sampler.init(model_seed(cfg, e)).to_bytes() for e, sampler in samplers], need
    except (ConfigError, TypeError) as exc:
        raise ApiError(422, "invalid_model", f"sampler: {exc}") from None


async def create_stream(store: ApiStore, settings: Settings, body: StreamIn) -> StreamOut:
    check_names(body)
    cfg = config_from_request(body)
    # drawing the models' first states can take seconds for large models: not on the event loop
    states, need = await asyncio.to_thread(initial_states, cfg, settings.max_stream_bytes)
    outcome = await store.create(cfg, states, settings.max_streams, need, settings.max_total_stream_bytes)
    if outcome == "full":
        raise ApiError(409, "stream_limit", f"the stream limit CUSP_MAX_STREAMS={settings.max_streams} is reached")
    if outcome == "over":
        raise ApiError(413, "deployment_full", f"the stream's models would need about {need / 2**20:,.0f} MiB of Redis, and with "
                                               f"the streams that exist that passes CUSP_MAX_TOTAL_STREAM_BYTES="
                                               f"{settings.max_total_stream_bytes / 2**20:,.0f} MiB; delete streams or raise it")
    if outcome == "exists":
        raise ApiError(409, "stream_exists", f"a stream named {cfg.name!r} already exists")
    M.STREAMS.inc()
    return await stream_out(store, cfg)


async def delete_stream(store: ApiStore, cfg: StreamConfig) -> None:
    """Delete the stream ``cfg`` was read from, or 404 where it is gone already (another DELETE
    won; a stream of that name created since stays, with its series)."""
    if not await store.delete(cfg):
        raise ApiError(404, "stream_not_found", f"no stream named {cfg.name!r}: it was deleted meanwhile (a stream of "
                                                "that name created since then stays)")
    for m in cfg.models:
        for metric in (M.LOG_EVIDENCE, M.LOG_EVIDENCE_PER_OBS, M.MODEL_POSTERIOR, M.INGEST_LAG):
            try:
                metric.remove(cfg.name, m.name)
            except KeyError:
                pass
    M.forget(cfg.name)  # the stream's own series (chunks and observations ingested): no churn of dead labels


async def model_rows(store: ApiStore, cfg: StreamConfig, p=None) -> tuple[int, int, list[ModelOut]]:
    """(last accepted seq, dead letters, each model's summary with its posterior probability);
    ``p``: the stream's progress if already read."""
    p = p if p is not None else await store.progress(cfg)
    out = [ModelOut(name=m.name, spec=m.spec, method="exact" if cached_model(m.spec, len(cfg.columns), m.target).exact else "sgais",
                    target=cfg.columns[m.target] if m.target is not None else None, prior=m.prior,
                    observations=r.observations, chunks=r.chunks, last_seq=r.last_seq, log_evidence=r.log_evidence,
                    log_evidence_per_observation=r.log_evidence / r.observations if r.observations else None,
                    posterior_probability=None, lag_chunks=max(0, p.last_seq - r.last_seq), error=r.error)
           for m, r in zip(cfg.models, p.models)]
    # posterior model probabilities among models that have seen the same observations; while some
    # model is behind, those the stream's answer computed at the last chunk every model applied
    ns = {r.observations for r in out}
    if len(ns) == 1 and ns != {0}:
        probs = log_model_probabilities({r.name: r.log_evidence for r in out}, log_model_priors(cfg))
        for r in out:
            r.posterior_probability, r.probability_observations = probs[r.name], r.observations
    elif p.probabilities and set(p.probabilities) == {r.name for r in out}:
        for r in out:
            r.posterior_probability, r.probability_observations = p.probabilities[r.name], p.compared_n
    return p.last_seq, p.dead_letters, out


async def model_frame(store: ApiStore, cfg: StreamConfig, entry) -> ModelFrame | None:
    """A metric-series model's frame from its saved state (None for models without one)."""
    model = cached_model(entry.spec, len(cfg.columns), entry.target)
    if not model.has_frame:  # (no state read for the others)
        return None
    raw = await store.model_state(cfg.name, entry.name)
    state = load_state(raw) if raw else None
    info = model.frame_info(getattr(state, "post", state))  # (a sampled model's frame is in its state)
    return ModelFrame(**info)


def effective(settings) -> dict | None:
    """Settings in effect (``settings()``), or None where a stored config no longer reads (a
    setting this version does not know): the stream is still shown, as given."""
    try:
        return settings()
    except (ConfigError, TypeError, ValueError):
        return None


async def stream_out(store: ApiStore, cfg: StreamConfig) -> StreamOut:
    p = await store.progress(cfg)
    last_seq, dead, models = await model_rows(store, cfg, p)
    for row, entry in zip(models, cfg.models):
        row.frame = await model_frame(store, cfg, entry)
    return StreamOut(name=cfg.name, columns=cfg.columns, sampler=cfg.sampler, detector=cfg.detector, seed=cfg.seed,
                     sampler_settings=effective(lambda: dataclasses.asdict(sampler_config(cfg))),
                     detector_settings=effective(lambda: DetectorConfig.from_dict(cfg.detector).to_dict()),
                     max_backlog=cfg.max_backlog, last_seq=last_seq, next_seq=last_seq + 1, dead_letters=dead, models=models,
                     rows=p.rows, first_time=T.format(p.first_time), last_time=T.format(p.last_time),
                     notes=stream_notes(cfg, p))


def stream_notes(cfg: StreamConfig, p: StreamProgress) -> list[str]:
    """What ``POST /v1/detect`` would note and a stream can know from its counts: sparse counts where
    no count model runs, or `student-t` beside one (a new user's hourly errors on a default stream:
    `student-t` took all the weight and GET said nothing, where `cusp replay` named the count models)."""
    note = counts_note(p.counts, cfg.columns, [m.spec for m in cfg.models]) if p.counts is not None else None
    return [note] if note else []


#: stream name -> (its incarnation id, its config): a config never changes within an incarnation
_SCRAPE_CONFIGS: dict[str, tuple[bytes, StreamConfig]] = {}


async def refresh_stream_gauges(store: ApiStore) -> None:
    """cusp_streams, each model's posterior probability and ingest lag, and each stream's last change
    point standing (``StreamAnswer.last_change``, kept in the answer's hash: so the gauges outlive a
    restart of the workers, and with several worker processes ``cusp serve``'s merged /metrics shows
    the API's value, not the first worker's), from Redis: the stream
    set, every stream's uid and every stream's progress in three round trips whatever the number
    of streams (a config is read once per incarnation)."""
    names = await store.stream_names()
    uids = await store.uids(names)
    cfgs = []
    for s, uid in zip(names, uids):
        cached = _SCRAPE_CONFIGS.get(s)
        if uid is None:
            _SCRAPE_CONFIGS.pop(s, None)
            continue
        if cached is None or cached[0] != uid:
            cfg = await store.config(s)
            if cfg is None:
                continue
            cached = _SCRAPE_CONFIGS[s] = (uid, cfg)
        cfgs.append(cached[1])
    for gone in set(_SCRAPE_CONFIGS) - set(names):
        del _SCRAPE_CONFIGS[gone]
    M.keep_streams((M.SPARSE_COUNTS, M.MODEL_POSTERIOR, M.INGEST_LAG, M.STREAM_CHANGEPOINT_CONFIDENCE,
                    M.STREAM_CHANGEPOINT_LAST_OBSERVATION), [c.name for c in cfgs])
    M.STREAMS.set(len(names))
    for cfg, p in zip(cfgs, await store.progress_many(cfgs)):
        _, _, models = await model_rows(store, cfg, p)
        M.SPARSE_COUNTS.labels(cfg.name).set(1 if stream_notes(cfg, p) else 0)
        last = p.last_change  # (None: no change standing, or none stored since the answer kept it)
        for gauge, value in ((M.STREAM_CHANGEPOINT_LAST_OBSERVATION, None if last is None else last[0]),
                             (M.STREAM_CHANGEPOINT_CONFIDENCE, None if last is None else last[1])):
            if value is not None:
                gauge.labels(cfg.name).set(value)
            else:
                with contextlib.suppress(KeyError):
                    gauge.remove(cfg.name)
        for row in models:
            if row.posterior_probability is not None:
                M.MODEL_POSTERIOR.labels(cfg.name, row.name).set(row.posterior_probability)
            M.INGEST_LAG.labels(cfg.name, row.name).set(row.lag_chunks)


# --- ingest ---------------------------------------------------------------------------------
def check_chunk(settings: Settings, cfg: StreamConfig, data: np.ndarray) -> None:
    """The chunk's size, and that every model of the stream can use it (ChunkError naming the model)."""
    if data.shape[0] == 0:
        raise ChunkError("empty chunk: send at least one row", reason="empty")
    if data.shape[0] > settings.max_chunk_rows:
        raise ChunkError(f"chunk has {data.shape[0]} rows, the limit is CUSP_MAX_CHUNK_ROWS={settings.max_chunk_rows}", 413,
                         reason="too_many_rows")
    at = too_large(data)
    if at is not None:
        raise ChunkError(f"row {at[0]} column {cfg.columns[at[1]]!r}: {float(data[at]):g} is too large: values must be within "
                         f"+-{MAX_MAGNITUDE:g}", reason="too_large")
    tensor = torch.from_numpy(data)
    for m in cfg.models:
        model = cached_model(m.spec, len(cfg.columns), m.target)
        try:
            feats = model.featurize(tensor)
        except ModelError as exc:
            raise ChunkError(f"model {m.name!r}: {exc.naming(cfg.columns)}") from None
        if not bool(torch.isfinite(feats).all()):
            raise ChunkError(f"model {m.name!r}: values too large (their squares overflow float64)")


#: (stream uid, model name) -> the model's frame (centre, scale, warm-up rows) once its worker fixed it: its
#: scale never changes within a stream's incarnation (a restart keeps it, centred where the old regime
#: expected the next row: within the data seen, so within ``value_limit`` scales of the first centre,
#: and a value within that of the first centre stays within twice it of the new one, far inside
#: float64), so each API process reads a model's state for it only until then (``check_frames``);
#: bounded, cleared when full
_FRAMES: dict[tuple[str, str], tuple] = {}
MAX_CACHED_FRAMES = 50_000


async def check_frames(store: ApiStore, cfg: StreamConfig, data: np.ndarray) -> None:
    """A value within ``MAX_MAGNITUDE`` can still be too large for a model: in its frame (1e150
    against a warm-up with an sd of 1e-5: its square overflows float64; 1e149 overflowed
    ``student-t``'s statistics), or for its kernels (the mixture's float32: 1e40). Such a chunk was
    accepted (202) and then refused by the model's worker, dead-lettered, the stream's models
    then on different data (issue 20; a new user's trial, 2026-12-07): refused here (422 naming
    the model, row and column) past ``Model.value_limit`` in the model's frame wherever that frame is
    already fixed, and in the data's units for a model without one (``engine.beyond_limit``). A
    chunk sent before its model's worker has read the warm-up cannot be checked against a frame
    that does not exist yet; the worker still refuses it (dead letter, ``TooLarge``)."""
    unknown = [m for m in cfg.models if (cfg.uid, m.name) not in _FRAMES
               and cached_model(m.spec, len(cfg.columns), m.target).has_frame]
    if unknown:  # read together (a stream's first chunks, until its workers have fixed the frames)
        infos = await asyncio.gather(*(model_frame(store, cfg, m) for m in unknown), return_exceptions=True)
        for m, info in zip(unknown, infos):
            # (else: the warm-up is not read yet, or a state this version cannot read: the worker judges)
            if isinstance(info, ModelFrame) and info.scale is not None:
                if len(_FRAMES) >= MAX_CACHED_FRAMES:
                    _FRAMES.clear()
                _FRAMES[(cfg.uid, m.name)] = (info.centre, info.scale, info.warmup_rows)
    tensor = torch.from_numpy(data)
    for m in cfg.models:
        why = beyond_limit(cached_model(m.spec, len(cfg.columns), m.target), tensor, _FRAMES.get((cfg.uid, m.name)),
                           cfg.columns)
        if why is not None:
            raise ChunkError(f"model {m.name!r}: {why}; nothing stored")


async def ingest(store: ApiStore, settings: Settings, cfg: StreamConfig, seq: int, data: np.ndarray,
                 times: np.ndarray | None = None) -> tuple[int, dict]:
    """Store one chunk (``times``: its rows' epoch seconds, None for the arrival time): (202, ack)
    when accepted, (200, ack) for a resend of the same data and times; a ChunkError (409) for a
    conflicting resend, a sequence gap or times that do not follow the stream's."""
    check_chunk(settings, cfg, data)
    try:
        await check_frames(store, cfg, data)
    except ChunkError as exc:
        last = await store.last_seq(cfg.name)
        if last is None or seq > last:
            exc.reason = "too_large"
            raise
        # (a resend of a chunk stored before its model's frame was fixed: the store answers it as
        # any resend, 200 for the same data, 409 for other data; it said "nothing stored" before)
    if times is not None and len(times) and settings.max_time_ahead_seconds > 0:
        now = time.time()
        ahead = float(times[-1]) - now  # the last is the latest: the times increase
        if ahead > settings.max_time_ahead_seconds:
            raise ChunkError(f"time[{len(times) - 1}] {T.format(float(times[-1]))} is {ahead:,.0f} s ahead of this server's clock "
                             f"({T.format(now)}), more than CUSP_MAX_TIME_AHEAD_SECONDS={settings.max_time_ahead_seconds:g}: "
                             "a unit or clock mistake? (the stream's later times would all have to follow it); nothing stored",
                             422, "invalid_time")
    raw = data.astype("<f8").tobytes()  # stored as is; its digest recognises a resend in any body format
    # a resend must repeat the times it was sent with (or again none)
    payload_digest = digest(raw) if times is None else digest(raw + b"t" + T.to_bytes(times))
    kind, val = await store.ingest(cfg.name, seq, raw, data.shape[0], payload_digest, settings.dedup_window, cfg.uid,
                                   [m.name for m in cfg.models], cfg.max_backlog, times, time.time(), data)
    if kind == "ok":
        M.INGESTED_CHUNKS.labels(cfg.name).inc()
        M.INGESTED_ROWS.labels(cfg.name).inc(data.shape[0])
        return 202, {"seq": seq, "status": "accepted", "id": ack_id(seq), "rows": int(data.shape[0])}
    if kind == "dup":
        if val != payload_digest:
            raise ChunkError(f"seq {seq} was already accepted with different data", 409, "seq_conflict", reason="conflict")
        return 200, {"seq": seq, "status": "duplicate", "id": ack_id(seq)}
    if kind == "old":
        raise ChunkError(f"seq {seq} was accepted long ago: it is older than the last CUSP_DEDUP_WINDOW="
                         f"{settings.dedup_window} chunks, whose digests are kept, so it cannot be checked against "
                         f"the stored data; expected seq {val}", 409, "seq_too_old", reason="conflict")
    if kind == "busy":
        raise ChunkError(f"stream {cfg.name!r} has {val} accepted chunks that its slowest model has not processed yet, its "
                         f"max_backlog={cfg.max_backlog}: nothing stored; send seq {seq} again after Retry-After seconds",
                         429, "backlog_full", retry_after=BACKLOG_RETRY_AFTER, reason="backlog")
    if kind == "gone":
        raise ChunkError(f"stream {cfg.name!r} was deleted (or deleted and created again): nothing stored", 404,
                         reason="gone")
    if kind == "late":
        raise ChunkError(f"the chunk's first time {T.format(float(times[0]))} is not after the stream's last time "
                         f"{T.format(float(val))}: times must increase across chunks; nothing stored", 409, "time_order",
                         reason="time_order")
    raise ChunkError(f"seq {seq} is out of order: expected seq {val}", 409, reason="gap")


# --- results --------------------------------------------------------------------------------
#: result ids are Redis stream ids made by the server's clock: milliseconds since 1970 first,
#: so no result id is below 10**12 (September 2001). Chunk acks' ids (``chunk-<seq>``; before,
#: ``<seq + 1>-0``) are, and so are refused as since instead of reading from the start.
MIN_RESULT_MS = 10**12


def ack_id(seq: int) -> str:
    """A chunk's id in its ack: ``chunk-<seq>``, which no result id resembles."""
    return f"chunk-{seq}"


def feed_model(cfg: StreamConfig, model: str | None) -> str | None:
    """The name of the model ``?model=`` asks for (the result pages and the live feeds alike): its
    name in the stream, or its spec as given ('gmm:components=3' is named 'gmm_components3': a new
    user asked by the spec cusp replay prints), or the model's kind alone where one of its models
    is of that kind ('gaussian' for a stream of columns, whose model is 'gaussian:warmup=5': a new
    user's 404); a name is taken first (a stream whose model is named like another's spec means the
    name); ``*``, the name the stream's own change points carry. 404 for a model the stream does not
    have, 422 for a spec or kind several of its models share."""
    if model is None or model == "*" or cfg.model(model) is not None:
        return model  # ('*': the stream's own change points, as their entries name it)
    by_spec, what = [m.name for m in cfg.models if m.spec == model], "spec"
    if not by_spec and ":" not in model:
        by_spec, what = [m.name for m in cfg.models if m.spec.split(":", 1)[0].strip() == model.strip()], "kind"
    if len(by_spec) > 1:
        raise ApiError(422, "invalid_request", f"{model!r} is the {what} of several of stream {cfg.name!r}'s models "
                       f"({', '.join(map(repr, by_spec))}): name one")
    if not by_spec:
        names = ", ".join(repr(m.name) for m in cfg.models)
        raise ApiError(404, "model_not_found", f"stream {cfg.name!r} has no model {model!r} (its models: {names})")
    return by_spec[0]


def entry_filter(model: str | None, kinds) -> Callable[[dict], bool]:
    """Does a feed entry pass ``?model=`` (a name, ``feed_model``'s) and ``?kind=``, as the pages filter?"""
    wanted = set(kinds) if kinds else None
    return lambda e: (model is None or e.get("model") == model) and (wanted is None or e.get("kind") in wanted)


def check_id(since: str | None) -> str:
    """A result id to read after ("0-0": from the start), or 422."""
    if since in (None, "", "0", "0-0"):
        return "0-0"
    if since.startswith("chunk-"):
        raise ApiError(422, "invalid_since", f"since={since[:60]!r} is a chunk's ack id, not a result id: pass the id of a "
                                             "result entry (from /evidence, its feeds or /changepoints), or 0 for the start")
    # ASCII digits only (\d would take other scripts' digits), each part a 64-bit unsigned integer as Redis needs
    m = re.fullmatch(r"([0-9]{1,20})(?:-([0-9]{1,20}))?", since)
    if not m or any(int(p) >= 2**64 for p in m.groups() if p is not None):
        raise ApiError(422, "invalid_since", f"since must be a result id like '1712345678901-0', got {since[:60]!r}")
    if int(m.group(1)) < MIN_RESULT_MS:
        raise ApiError(422, "invalid_since", f"since={since!r} is not a result id (they start with a time in milliseconds, like "
                                             "'1712345678901-0'); it looks like an old chunk ack id ('<seq + 1>-0'): pass the "
                                             "id of a result entry, or 0 for the start")
    return since


async def changepoints(store: ApiStore, cfg: StreamConfig, model: str | None = None) -> dict:
    """The stream's change points from their own store (``keys.changes``, kept apart from the
    result stream and its trimming): each model's events (only ``model``'s where given: its name,
    ``feed_model``'s; '*' keeps none), and the stream's answer (each model's events weighted by its
    posterior probability, taken chunk by chunk by the workers: ``service.detect.StreamAnswer``),
    less those withdrawn since, which are listed apart. O(events)."""
    got = await store.changes(cfg.name)
    withdrawn = [c for c in got if c["kind"] == "stream_changepoint_withdrawn"]
    gone = {(c.get("location"), c.get("detected_at")) for c in withdrawn}
    return {"changepoints": [c for c in got if c["kind"] == "changepoint" and (model is None or c.get("model") == model)],
            "stream": [c for c in got if c["kind"] == "stream_changepoint" and (c.get("location"), c.get("detected_at")) not in gone],
            "withdrawn": withdrawn}

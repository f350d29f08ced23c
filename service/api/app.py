"""The HTTP and WebSocket API. Routes are thin: validate, write to Redis, answer."""


import asyncio
import contextlib
import json
import logging
import math
import re
import time
from pathlib import Path
from collections.abc import Sequence
from typing import Annotated
from urllib.parse import quote

import numpy as np
import redis.exceptions as rexc
import torch
from fastapi import Depends, FastAPI, HTTPException, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from models import ModelError, build_model
from models.registry import SUPERVISED
from service import metrics as M
from service.api import chunks as C
from service.api.schemas import (ChangepointList, ChunkAck, ChunkColumns, ChunkRows, DeadLetters, EvidencePage, Health, ModelIn,
                                 ModelOut, Problem, Ready, StreamIn, StreamList, StreamOut)
from service.data import log_model_probabilities
from service.detect import DetectorConfig, model_averaged_from_entries
from service.runtime import build, cached_model, model_seed
from service.settings import Settings
from service.sgais import ConfigError
from service.store import ModelEntry, StreamConfig, connect_async, digest, keys, scripts
from service.supervise import scrape

log = logging.getLogger("cusp.api")
STATIC = Path(__file__).parent / "static"
WHY = {400: "malformed body (not JSON, not UTF-8, nested too deeply)", 401: "missing or unknown API key",
       403: "the API key is read-only", 404: "no such stream (or model)", 409: "conflict: sequence gap, seq reused with other data, "
       "name taken or the stream limit reached", 413: "body over CUSP_MAX_BODY_BYTES or chunk over CUSP_MAX_CHUNK_ROWS",
       415: "unsupported Content-Type", 422: "invalid request: the detail names the field", 503: "Redis unavailable; retry"}
#: the largest particles x parameters a stream's model may ask for (its state is 8 bytes per entry, in Redis)
MAX_PARTICLE_VALUES = 10_000_000


def errors(*codes: int) -> dict:
    """OpenAPI ``responses`` for the error statuses a route really answers (body: Problem)."""
    return {c: {"model": Problem, "description": WHY[c]} for c in codes}


READ, WRITE = (401, 503), (401, 403, 503)  # auth, plus Redis down


class BodyLimit:
    """ASGI wrapper: counts request body bytes as the app reads them and answers 413 (closing the
    connection) once they pass ``limit``, so a body without Content-Length is never read whole."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    M.REJECTED.labels("too_large").inc()
                    raise HTTPException(413, f"body exceeds the limit of {self.limit} bytes", headers={"Connection": "close"})
            return message

        await self.app(scope, limited, send)


class CheckLengthAndCount:
    """ASGI wrapper (a plain one: Starlette's ``@app.middleware("http")`` costs a task group and
    memory streams per request, more than the ingest of a small chunk): refuses a declared
    Content-Length over ``limit`` before anything reads the body (413, connection closed), and
    counts every answer in cusp_http_requests_total by route template and status class."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None:
            try:
                too_big = int(length) > self.limit
            except ValueError:
                return await JSONResponse({"detail": "invalid Content-Length"}, status_code=400)(scope, receive, send)
            if too_big:
                M.REJECTED.labels("too_large").inc()
                return await JSONResponse({"detail": f"body of {length.decode()} bytes exceeds the limit of {self.limit} bytes"},
                                          status_code=413, headers={"Connection": "close"})(scope, receive, send)  # not drained
        status = 500

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope.get("route")
            M.HTTP_REQUESTS.labels(getattr(route, "path", "unmatched"), f"{status // 100}xx").inc()


class RedactKeys(logging.Filter):
    """Blanks ``token=...`` in log records: API keys travel in the URLs of WebSockets and of the
    live page, and uvicorn logs request lines (access log, WebSocket accepted/rejected)."""

    TOKEN = re.compile(r"(?i)(token=)[^&\s\"']*")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "token=" in record.msg.lower():
            record.msg = self.TOKEN.sub(r"\1REDACTED", record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(self.TOKEN.sub(r"\1REDACTED", a) if isinstance(a, str) else a for a in record.args)
        return True


REDACT = RedactKeys()


class Store:
    """The API's Redis handle and its scripts."""

    def __init__(self, url: str):
        self.r = connect_async(url)
        self.ingest = self.r.register_script(scripts.INGEST)
        self.create = self.r.register_script(scripts.CREATE)
        self.url = url


def server_options(settings: Settings) -> dict:
    """uvicorn settings of cusp's API beyond host and port; ``cusp serve`` and the tests' live
    servers both use these. The sans-I/O websockets implementation (uvicorn's default since
    0.50; the legacy one is deprecated). A WebSocket message over CUSP_MAX_BODY_BYTES gets a
    413 error message and the connection stays open; the protocol layer closes it (1009) only
    past twice the limit (at least uvicorn's 16 MiB default), so a raised limit is not
    shadowed and memory stays bounded."""
    return {"ws": "websockets-sansio", "ws_max_size": max(16 * 1024 * 1024, 2 * settings.max_body_bytes)}


def create_app(settings: Settings, redis_url: str, worker_metrics: Sequence[str] = ()) -> FastAPI:
    """The API. ``worker_metrics``: /metrics URLs of worker processes (``cusp serve``'s children)
    whose series this process's /metrics includes."""
    # the schema and its documentation pages are served below, behind the API key like everything but the probes
    app = FastAPI(title="cusp", version="0.1.0", description="Streaming change-point detection on online Bayesian evidence (SGAIS).",
                  openapi_url=None, docs_url=None, redoc_url=None)
    for name in ("uvicorn.access", "uvicorn.error", "uvicorn"):
        if REDACT not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(REDACT)
    app.state.settings = settings
    app.state.store = Store(redis_url)
    M.WORKERS.inc(0)  # always exported, 0 in an API-only process

    # --- errors: every failure is a JSON {"detail": ...} with a 4xx, Redis outages a 503 ------
    @app.exception_handler(rexc.ConnectionError)
    @app.exception_handler(rexc.TimeoutError)
    async def redis_down(request: Request, exc: Exception):
        M.REDIS_UP.set(0)
        return JSONResponse({"detail": f"Redis unavailable: {exc}; retry later"}, status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        # one error shape for every failure: {"detail": text}, plus the fields at fault (never their values)
        errs = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))} for e in exc.errors()]
        status = 400 if any(e["type"] == "json_invalid" for e in errs) else 422
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errs[:10]) or "invalid request"
        return JSONResponse({"detail": detail, "errors": errs}, status_code=status)

    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)

    app.add_middleware(CheckLengthAndCount, limit=settings.max_body_bytes)

    # --- dependencies ---------------------------------------------------------------------
    # (async def, all of them: FastAPI runs a plain def dependency in a worker thread, a thread
    # hop per dependency per request that cost more than a small chunk's whole ingest)
    def scope_for(request_key: str | None) -> str | None:
        if not settings.keys:
            return "write"
        return settings.scope_of(request_key)

    def presented_key(request: Request) -> str | None:
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return request.headers.get("x-api-key")

    def page_key(request: Request) -> str | None:
        """Pages opened in a browser (live page, API docs) take the key as ``?token=KEY`` too."""
        key = presented_key(request) or request.query_params.get("token")
        if scope_for(key) is None:
            raise HTTPException(401, "missing or unknown API key (open the page with ?token=KEY)", headers={"WWW-Authenticate": "Bearer"})
        return key

    def need(scope: str):
        async def check(request: Request) -> None:
            got = scope_for(presented_key(request))
            if got is None:
                raise HTTPException(401, "missing or unknown API key (send 'Authorization: Bearer KEY')", headers={"WWW-Authenticate": "Bearer"})
            if scope == "write" and got != "write":
                raise HTTPException(403, "this API key is read-only")
        return Depends(check)

    Read, Write = need("read"), need("write")

    async def store() -> Store:
        return app.state.store

    StoreDep = Annotated[Store, Depends(store)]

    async def stream_config(name: str, st: Store) -> StreamConfig:
        if not keys.STREAM_NAME.fullmatch(name):
            raise HTTPException(404, f"no stream named {name!r}")
        raw = await st.r.get(keys.config(name))
        if raw is None:
            raise HTTPException(404, f"no stream named {name!r}")
        return StreamConfig.from_json(raw)

    async def read_body(request: Request) -> bytes:
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > settings.max_body_bytes:
                M.REJECTED.labels("too_large").inc()
                raise HTTPException(413, f"body exceeds the limit of {settings.max_body_bytes} bytes")
        if not body:
            raise HTTPException(400, "empty body")
        return bytes(body)

    # --- health and metrics ---------------------------------------------------------------
    @app.get("/healthz", tags=["ops"], response_model=Health)
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], response_model=Ready, responses={503: {"model": Ready, "description": "Redis unreachable"}})
    async def readyz(st: StoreDep):
        try:
            await asyncio.wait_for(st.r.ping(), 2.0)
        except (rexc.RedisError, OSError, asyncio.TimeoutError) as exc:
            M.REDIS_UP.set(0)
            return JSONResponse({"status": "unavailable", "redis": str(exc) or "timeout"}, status_code=503)
        M.REDIS_UP.set(1)
        return {"status": "ready", "redis": "ok"}

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse, dependencies=[Read],
             responses={401: {"description": WHY[401], "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}})
    async def metrics(st: StoreDep):
        try:
            await refresh_stream_gauges(st)
            M.REDIS_UP.set(1)
        except (rexc.RedisError, OSError):
            M.REDIS_UP.set(0)
        if worker_metrics:
            texts = await asyncio.to_thread(scrape, list(worker_metrics))
            return PlainTextResponse(M.merged_exposition(texts), media_type=CONTENT_TYPE_LATEST)
        return PlainTextResponse(generate_latest(M.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    async def refresh_stream_gauges(st: Store) -> None:
        names = sorted(s.decode() for s in await st.r.smembers(keys.STREAMS))
        M.STREAMS.set(len(names))
        for s in names:
            raw = await st.r.get(keys.config(s))
            if raw is None:
                continue
            cfg = StreamConfig.from_json(raw)
            info = await model_rows(st, cfg)
            for row in info["models"]:
                if row["posterior_probability"] is not None:
                    M.MODEL_POSTERIOR.labels(s, row["name"]).set(row["posterior_probability"])
                M.INGEST_LAG.labels(s, row["name"]).set(row["lag_chunks"])

    # --- streams ----------------------------------------------------------------------------
    @app.post("/v1/streams", status_code=201, response_model=StreamOut, tags=["streams"], dependencies=[Write],
              responses=errors(400, *WRITE, 409, 413, 422))
    async def create_stream(body: StreamIn, st: StoreDep):
        try:  # NaN or infinity anywhere (sampler overrides are free-form) could not be stored or echoed as JSON
            json.dumps(body.model_dump(), allow_nan=False)
        except ValueError:
            raise HTTPException(422, "NaN and infinity are not accepted") from None
        if not keys.STREAM_NAME.fullmatch(body.name):
            raise HTTPException(422, "stream name must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
        if len(set(body.columns)) != len(body.columns) or any(not c.strip() for c in body.columns):
            raise HTTPException(422, f"column names must be non-empty and distinct, got {body.columns}")
        if await st.r.scard(keys.STREAMS) >= settings.max_streams:
            raise HTTPException(409, f"the stream limit CUSP_MAX_STREAMS={settings.max_streams} is reached")
        entries: list[ModelEntry] = []
        for i, m in enumerate(body.models):
            m = ModelIn(spec=m) if isinstance(m, str) else m
            name = m.name or re.sub(r"[^A-Za-z0-9_.-]", "_", m.spec.replace(":", "_").replace("=", ""))[:64]
            if not keys.MODEL_NAME.fullmatch(name):
                raise HTTPException(422, f"model {i}: name {name!r} must be 1-64 letters, digits, '_', '.' or '-'")
            if any(e.name == name for e in entries):
                raise HTTPException(422, f"model name {name!r} is used twice; give each model a distinct 'name'")
            target = None
            if m.target is not None:
                if m.target not in body.columns:
                    raise HTTPException(422, f"model {name!r}: target column {m.target!r} is not one of {body.columns}")
                target = body.columns.index(m.target)
            try:
                model = build_model(m.spec, len(body.columns), target)
            except ModelError as exc:
                raise HTTPException(422, f"model {name!r}: {exc}") from None
            if m.target is not None and model.name not in SUPERVISED:
                raise HTTPException(422, f"model {name!r}: 'target' applies only to {sorted(SUPERVISED)}")
            entries.append(ModelEntry(name=name, spec=m.spec, target=target, prior=m.prior))
        cfg = StreamConfig(name=body.name, columns=body.columns, models=entries,
                           sampler={"preset": body.sampler.preset, "overrides": body.sampler.overrides},
                           seed=body.seed, detector=body.detector, created=time.time())
        try:
            DetectorConfig.from_dict(body.detector)
        except ConfigError as exc:
            raise HTTPException(422, str(exc)) from None
        try:
            states = []
            for e in entries:
                sampler = build(cfg, e)
                if sampler.config.particles * sampler.model.dim > MAX_PARTICLE_VALUES:
                    raise HTTPException(422, f"model {e.name!r}: {sampler.config.particles} particles x {sampler.model.dim} parameters "
                                             f"exceeds {MAX_PARTICLE_VALUES:,} values")
                states.append(sampler.init(model_seed(cfg, e)).to_bytes())
        except ConfigError as exc:
            raise HTTPException(422, f"sampler: {exc}") from None
        except TypeError as exc:
            raise HTTPException(422, f"sampler: {exc}") from None
        created = await st.create(keys=[keys.STREAMS, keys.config(cfg.name), *[keys.state(cfg.name, e.name) for e in entries]],
                                  args=[cfg.name, cfg.to_json(), *states])
        if not created:
            raise HTTPException(409, f"a stream named {cfg.name!r} already exists")
        M.STREAMS.inc()
        return await stream_out(st, cfg)

    @app.get("/v1/streams", tags=["streams"], dependencies=[Read], response_model=StreamList, responses=errors(*READ))
    async def list_streams(st: StoreDep) -> dict:
        names = sorted(s.decode() for s in await st.r.smembers(keys.STREAMS))
        return {"streams": names}

    @app.get("/v1/streams/{stream}", response_model=StreamOut, tags=["streams"], dependencies=[Read], responses=errors(*READ, 404, 422))
    async def get_stream(stream: str, st: StoreDep):
        return await stream_out(st, await stream_config(stream, st))

    @app.delete("/v1/streams/{stream}", status_code=204, tags=["streams"], dependencies=[Write], responses=errors(*WRITE, 404, 422))
    async def delete_stream(stream: str, st: StoreDep):
        cfg = await stream_config(stream, st)
        pipe = st.r.pipeline(transaction=True)
        pipe.srem(keys.STREAMS, stream)
        pipe.delete(*keys.stream_keys(stream, [m.name for m in cfg.models]))
        await pipe.execute()
        for m in cfg.models:
            for metric in (M.LOG_EVIDENCE, M.LOG_EVIDENCE_PER_OBS, M.MODEL_POSTERIOR, M.INGEST_LAG):
                try:
                    metric.remove(stream, m.name)
                except KeyError:
                    pass
        return None

    async def model_rows(st: Store, cfg: StreamConfig) -> dict:
        pipe = st.r.pipeline(transaction=False)
        pipe.get(keys.seq(cfg.name))
        pipe.xlen(keys.dead(cfg.name))
        for m in cfg.models:
            pipe.hmget(keys.state(cfg.name, m.name), "n", "chunks", "last_seq", "log_evidence", "error")
        last_in, dead, *rows = await pipe.execute()
        last_in = int(last_in) if last_in is not None else -1
        out = []
        for m, (n, chunks, last, le, err) in zip(cfg.models, rows):
            n, last, le = int(n or 0), int(last if last is not None else -1), float(le or 0.0)
            out.append({"name": m.name, "spec": m.spec, "target": cfg.columns[m.target] if m.target is not None else None,
                        "observations": n, "chunks": int(chunks or 0), "last_seq": last, "log_evidence": le,
                        "log_evidence_per_observation": le / n if n else None, "posterior_probability": None,
                        "lag_chunks": max(0, last_in - last), "error": (err or b"").decode() or None})
        # posterior model probabilities among models that have seen the same observations
        ns = {r["observations"] for r in out}
        if len(ns) == 1 and ns != {0}:
            probs = log_model_probabilities({r["name"]: r["log_evidence"] for r in out}, log_model_priors(cfg))
            for r in out:
                r["posterior_probability"] = probs[r["name"]]
        return {"last_seq": last_in, "dead": int(dead), "models": out}

    async def stream_out(st: Store, cfg: StreamConfig) -> StreamOut:
        info = await model_rows(st, cfg)
        return StreamOut(name=cfg.name, columns=cfg.columns, sampler=cfg.sampler, detector=cfg.detector, seed=cfg.seed, last_seq=info["last_seq"],
                         next_seq=info["last_seq"] + 1, dead_letters=info["dead"], models=[ModelOut(**r) for r in info["models"]])

    # --- ingest -----------------------------------------------------------------------------
    async def ingest(st: Store, cfg: StreamConfig, seq: int, data: np.ndarray) -> tuple[int, dict]:
        if data.shape[0] == 0:
            M.REJECTED.labels("empty").inc()
            raise C.ChunkError("empty chunk: send at least one row")
        if data.shape[0] > settings.max_chunk_rows:
            M.REJECTED.labels("too_many_rows").inc()
            raise C.ChunkError(f"chunk has {data.shape[0]} rows, the limit is CUSP_MAX_CHUNK_ROWS={settings.max_chunk_rows}", 413)
        tensor = torch.from_numpy(data)
        for m in cfg.models:  # the data must be usable by every model of the stream
            model = cached_model(m.spec, len(cfg.columns), m.target)
            try:
                feats = model.featurize(tensor)
            except ModelError as exc:
                raise C.ChunkError(f"model {m.name!r}: {exc}") from None
            if not bool(torch.isfinite(feats).all()):
                raise C.ChunkError(f"model {m.name!r}: values too large (their squares overflow float64)")
        raw = data.astype("<f8").tobytes()  # stored as is; its digest recognises a resend in any body format
        payload_digest = digest(raw)
        res = await st.ingest(keys=[keys.seq(cfg.name), keys.inbox(cfg.name), keys.seen(cfg.name)],
                              args=[seq, raw, data.shape[0], payload_digest, settings.dedup_window])
        kind, val = res[0].decode(), res[1].decode()
        if kind == "ok":
            M.INGESTED_CHUNKS.labels(cfg.name).inc()
            M.INGESTED_ROWS.labels(cfg.name).inc(data.shape[0])
            return 202, {"seq": seq, "status": "accepted", "id": val, "rows": int(data.shape[0])}
        if kind == "dup":
            if val != payload_digest:
                M.REJECTED.labels("conflict").inc()
                raise C.ChunkError(f"seq {seq} was already accepted with different data", 409)
            return 200, {"seq": seq, "status": "duplicate", "id": keys.entry_id(seq)}
        if kind == "old":
            M.REJECTED.labels("conflict").inc()
            raise C.ChunkError(f"seq {seq} was accepted long ago: it is older than the last CUSP_DEDUP_WINDOW="
                               f"{settings.dedup_window} chunks, whose digests are kept, so it cannot be checked against "
                               f"the stored data; expected seq {val}", 409)
        M.REJECTED.labels("gap").inc()
        raise C.ChunkError(f"seq {seq} is out of order: expected seq {val}", 409)

    chunk_schema = {"oneOf": [ChunkRows.model_json_schema(), ChunkColumns.model_json_schema()]}
    for alt in chunk_schema["oneOf"]:
        for field in ("rows", "columns"):
            if field in alt["properties"]:
                alt["properties"][field]["maxItems" if field == "rows" else "maxProperties"] = (
                    settings.max_chunk_rows if field == "rows" else 256)

    @app.post("/v1/streams/{stream}/chunks", status_code=202, response_model=ChunkAck, tags=["ingest"], dependencies=[Write],
              responses={200: {"model": ChunkAck, "description": "a repeated seq with the same data: status 'duplicate'"},
                         **errors(400, *WRITE, 404, 409, 413, 415, 422)},
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": chunk_schema},
                  "application/x-ndjson": {"schema": {"type": "string"}}, "text/csv": {"schema": {"type": "string"}},
                  "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
    async def post_chunk(stream: str, request: Request, st: StoreDep,
                         seq: Annotated[int | None, Query(ge=0, le=2**53, description="sequence number for NDJSON/CSV bodies")] = None):
        cfg = await stream_config(stream, st)
        body = await read_body(request)
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        try:
            if ctype in ("application/x-ndjson", "application/ndjson", "text/csv", "application/octet-stream"):
                if seq is None:
                    raise C.ChunkError("NDJSON, CSV and float64 bodies need ?seq=N", 422)
                parse = {"text/csv": C.parse_csv, "application/octet-stream": C.parse_float64}.get(ctype, C.parse_ndjson)
                data, s = parse(body, cfg.columns), seq
            elif ctype in ("application/json", ""):
                s, data = C.parse_json_chunk(body, cfg.columns)
            else:
                raise C.ChunkError(f"unsupported content type {ctype!r}; use application/json, application/x-ndjson, text/csv "
                                   "or application/octet-stream (raw little-endian float64 rows)", 415)
            status, ack = await ingest(st, cfg, s, data)
        except C.ChunkError as exc:
            M.REJECTED.labels("invalid").inc()
            raise HTTPException(exc.status, str(exc)) from None
        return JSONResponse(ack, status_code=status)

    # --- results ----------------------------------------------------------------------------
    def log_model_priors(cfg: StreamConfig) -> dict[str, float]:
        """The models' log prior probabilities, normalised in logs: priors may be as large as 1e308 or as small as 5e-324."""
        top = max(m.prior for m in cfg.models)
        log_total = math.log(top) + math.log(sum(m.prior / top for m in cfg.models))
        return {m.name: math.log(m.prior) - log_total for m in cfg.models}

    def entry_out(eid: bytes, fields: dict) -> dict:
        d = json.loads(fields[b"data"])
        return {"id": eid.decode(), "model": fields[b"model"].decode(), "kind": fields[b"kind"].decode(), **d}

    def check_id(since: str | None) -> str:
        if since in (None, "", "0"):
            return "0-0"
        # ASCII digits only (\d would take other scripts' digits), each part a 64-bit unsigned integer as Redis needs
        m = re.fullmatch(r"([0-9]{1,20})(?:-([0-9]{1,20}))?", since)
        if not m or any(int(p) >= 2**64 for p in m.groups() if p is not None):
            raise HTTPException(422, f"since must be a result id like '1712345678901-0', got {since[:60]!r}")
        return since

    @app.get("/v1/streams/{stream}/evidence", response_model=EvidencePage, tags=["results"], dependencies=[Read],
             responses=errors(*READ, 404, 422))
    async def evidence(stream: str, st: StoreDep, since: str | None = Query(None, description="return results after this id"),
                       limit: int = Query(1000, ge=1, le=10_000), model: str | None = None):
        cfg = await stream_config(stream, st)
        if model is not None and cfg.model(model) is None:
            raise HTTPException(404, f"stream {stream!r} has no model {model!r}")
        start = check_id(since)
        if start == f"{2**64 - 1}-{2**64 - 1}":  # nothing can follow the largest id (and Redis refuses it as an exclusive start)
            entries = []
        else:
            entries = await st.r.xrange(keys.out(stream), min="(" + start if start != "0-0" else "-", count=limit)
        results = [entry_out(e, f) for e, f in entries]
        nxt = results[-1]["id"] if results else since
        if model is not None:
            results = [r for r in results if r["model"] == model]
        return {"results": results, "next": nxt}

    @app.get("/v1/streams/{stream}/changepoints", tags=["results"], dependencies=[Read], response_model=ChangepointList,
             responses=errors(*READ, 404, 422))
    async def changepoints(stream: str, st: StoreDep) -> dict:
        cfg = await stream_config(stream, st)
        several = len(cfg.models) > 1  # then the results too: the models' evidence weighs their events
        kinds = (b"changepoint", b"result") if several else (b"changepoint",)
        out, start = [], "-"
        while True:
            entries = await st.r.xrange(keys.out(stream), min=start, count=5000)
            out += [entry_out(e, f) for e, f in entries if f[b"kind"] in kinds]
            if len(entries) < 5000:
                break
            start = "(" + entries[-1][0].decode()
        # several models: the stream's change points, each model's events weighted by its
        # posterior probability (service.detect.model_averaged_changes)
        threshold = DetectorConfig.from_dict(cfg.detector).threshold
        found = await asyncio.to_thread(model_averaged_from_entries, out, threshold, log_model_priors(cfg))
        stream_level = [c.to_dict() for c in found]
        return {"changepoints": [c for c in out if c["kind"] == "changepoint"], "stream": stream_level}

    @app.get("/v1/streams/{stream}/dead-letters", tags=["results"], dependencies=[Read], response_model=DeadLetters,
             responses=errors(*READ, 404, 422))
    async def dead_letters(stream: str, st: StoreDep) -> dict:
        await stream_config(stream, st)
        entries = await st.r.xrange(keys.dead(stream), count=1000)
        return {"dead_letters": [{"id": e.decode(), **{k.decode(): v.decode() for k, v in f.items()}} for e, f in entries]}

    async def follow(st: Store, stream: str, since: str):
        """Yield result entries after ``since``, live, until the stream is deleted."""
        last = since
        reader = connect_async(st.url)
        try:
            while True:
                got = await reader.xread({keys.out(stream): last}, count=500, block=1000)
                if not got:
                    if not await reader.exists(keys.config(stream)):
                        return
                    yield None  # keep-alive tick
                    continue
                for eid, fields in got[0][1]:
                    last = eid.decode()
                    yield entry_out(eid, fields)
        finally:
            await reader.aclose()

    @app.get("/v1/streams/{stream}/evidence/sse", tags=["results"], dependencies=[Read], response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                              "description": "results and change points as server-sent events, live"}, **errors(*READ, 404, 422)})
    async def evidence_sse(stream: str, request: Request, st: StoreDep, since: str | None = None):
        await stream_config(stream, st)
        start = check_id(since or request.headers.get("last-event-id"))

        async def events():
            async for item in follow(st, stream, start):
                if await request.is_disconnected():
                    return
                if item is None:
                    yield ": keep-alive\n\n"
                else:
                    yield f"id: {item['id']}\nevent: {item['kind']}\ndata: {json.dumps(item)}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def reject(ws: WebSocket, reason: str) -> None:
        await ws.accept()  # accept first so that the client sees the 1008 close code and reason
        await ws.close(code=1008, reason=reason[:120])

    async def ws_auth(ws: WebSocket, scope: str) -> bool:
        key = ws.query_params.get("token") or ws.headers.get("x-api-key")
        auth = ws.headers.get("authorization", "")
        if not key and auth.lower().startswith("bearer "):
            key = auth[7:].strip()
        got = scope_for(key)
        if got is None or (scope == "write" and got != "write"):
            await reject(ws, "missing, unknown or read-only API key")
            return False
        return True

    async def ws_open(ws: WebSocket, st: Store, stream: str, scope: str) -> bool:
        """Authenticate and check the stream; on failure the socket is closed with 1008."""
        if not await ws_auth(ws, scope):
            return False
        if not keys.STREAM_NAME.fullmatch(stream) or not await st.r.exists(keys.config(stream)):
            await reject(ws, f"no stream named {stream!r}")
            return False
        return True

    @app.websocket("/v1/streams/{stream}/evidence/ws")
    async def evidence_ws(ws: WebSocket, stream: str, since: str | None = None):
        st: Store = app.state.store
        if not await ws_open(ws, st, stream, "read"):
            return
        try:
            start = check_id(since)
        except HTTPException as exc:
            await reject(ws, str(exc.detail))
            return
        await ws.accept()

        async def until_closed() -> None:
            # a client that leaves an idle stream is noticed at the next keep-alive tick, not at the next result
            try:
                while (await ws.receive())["type"] != "websocket.disconnect":
                    pass
            except Exception:  # noqa: BLE001 - any failure to receive means the client is gone
                pass

        closed = asyncio.ensure_future(until_closed())
        try:
            async with contextlib.aclosing(follow(st, stream, start)) as items:
                async for item in items:
                    if closed.done():
                        return
                    if item is not None:
                        await ws.send_json(item)
        except (WebSocketDisconnect, RuntimeError):
            return
        finally:
            closed.cancel()
        await ws.close(code=1000, reason="stream deleted")

    @app.websocket("/v1/streams/{stream}/ingest")
    async def ingest_ws(ws: WebSocket, stream: str):
        st: Store = app.state.store
        if not await ws_open(ws, st, stream, "write"):
            return
        await ws.accept()
        cfg = StreamConfig.from_json(await st.r.get(keys.config(stream)))
        try:
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    return
                raw = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
                seq = None
                try:
                    if raw is None or len(raw) > settings.max_body_bytes:
                        raise C.ChunkError(f"message exceeds the limit of {settings.max_body_bytes} bytes", 413)
                    try:  # lenient parse, only to echo the seq back with an error
                        doc = json.loads(raw)
                        seq = doc.get("seq") if isinstance(doc, dict) else None
                    except (ValueError, RecursionError):
                        pass
                    s, data = C.parse_json_chunk(raw if isinstance(raw, bytes) else raw.encode(), cfg.columns)
                    status, ack = await ingest(st, cfg, s, data)
                    await ws.send_json(ack)
                except C.ChunkError as exc:
                    M.REJECTED.labels("invalid").inc()
                    await ws.send_json({"seq": seq if isinstance(seq, int) else None, "status": "error",
                                        "code": exc.status, "detail": str(exc)})
                except (rexc.ConnectionError, rexc.TimeoutError) as exc:
                    await ws.send_json({"seq": seq if isinstance(seq, int) else None, "status": "error", "code": 503,
                                        "detail": f"Redis unavailable: {exc}; resend"})
        except WebSocketDisconnect:
            return

    # --- live page and API documentation ---------------------------------------------------
    @app.get("/", include_in_schema=False)
    async def index(request: Request):
        page_key(request)
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_json(request: Request):
        page_key(request)
        return JSONResponse(app.openapi())

    def schema_url(request: Request) -> str:
        token = request.query_params.get("token")
        return "/openapi.json" + (f"?token={quote(token, safe='')}" if token else "")

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request):
        page_key(request)
        return get_swagger_ui_html(openapi_url=schema_url(request), title="cusp API")

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request):
        page_key(request)
        return get_redoc_html(openapi_url=schema_url(request), title="cusp API")

    return app

"""Ingest: one chunk per POST (JSON, NDJSON, CSV or raw float64), or one per WebSocket message."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import redis.exceptions as rexc
from fastapi import APIRouter, FastAPI, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse

from service import metrics as M
from service.api import chunks as C
from service.api import crud
from service.api.deps import SettingsDep, StoreDep, Write, reject, untyped_from_a_page, ws_allowed
from service.api.errors import WRITE, ApiError, errors
from service.api.schemas import ChunkAck, ChunkColumns, ChunkRows
from service.data import MAX_COLUMNS
from service.settings import Settings

router = APIRouter(prefix="/v1/streams", tags=["ingest"])
CHUNKS = "/v1/streams/{stream}/chunks"

#: the POST body's documented media types; the JSON schema's limits are set per app (``document_limits``)
BODY = {"application/json": {"schema": {}}, "application/x-ndjson": {"schema": {"type": "string"}},
        "text/csv": {"schema": {"type": "string"}}, "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


def chunk_body(settings: Settings) -> dict:
    """OpenAPI ``requestBody`` of POST .../chunks, with the row and column limits of ``settings``."""
    schema = {"oneOf": [ChunkRows.model_json_schema(), ChunkColumns.model_json_schema()]}
    for alt in schema["oneOf"]:
        if "rows" in alt["properties"]:
            alt["properties"]["rows"]["maxItems"] = settings.max_chunk_rows
        if "columns" in alt["properties"]:
            alt["properties"]["columns"]["maxProperties"] = MAX_COLUMNS
    return {"requestBody": {"required": True, "content": {**BODY, "application/json": {"schema": schema}}}}


def document_limits(app: FastAPI, settings: Settings) -> None:
    """Give this app's OpenAPI schema the POST body with this app's limits (the route itself is
    shared by every app built in the process)."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            generate()["paths"][CHUNKS]["post"].update(chunk_body(settings))
        return app.openapi_schema

    app.openapi = openapi


async def read_body(request: Request, limit: int) -> bytes:
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            M.REJECTED.labels("too_large").inc()
            raise ApiError(413, "body_too_large", f"body exceeds the limit of {limit} bytes")
    if not body:
        raise ApiError(400, "empty_body", "empty body")
    return bytes(body)


@router.post(CHUNKS.removeprefix(router.prefix), status_code=202, response_model=ChunkAck, dependencies=[Write],
             responses={200: {"model": ChunkAck, "description": "a repeated seq with the same data: status 'duplicate'"},
                        **errors(400, *WRITE, 404, 409, 413, 415, 422, 429)},
             openapi_extra={"requestBody": {"required": True, "content": BODY}})
async def post_chunk(stream: str, request: Request, store: StoreDep, settings: SettingsDep,
                     seq: Annotated[int | None, Query(ge=0, le=2**53, description="sequence number for NDJSON/CSV bodies")] = None,
                     times: Annotated[Literal["first"] | None, Query(
                         description="float64 bodies only: 'first' when each row starts with its time (epoch seconds)")] = None):
    if untyped_from_a_page(request, settings):  # (a cross-site fetch with a Blob body: no preflight)
        raise ApiError(415, "unsupported_media_type", "a request from a web page must say its Content-Type")
    cfg = await crud.stream_config(store, stream)
    body = await read_body(request, settings.max_body_bytes)
    # no header: JSON; a header whose media type is empty (';;;') names nothing we read: 415
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower() or "(empty)"
    try:
        s, data, stamps = C.parse_body(ctype, body, seq, cfg.columns, times == "first")
        status, ack = await crud.ingest(store, settings, cfg, s, data, stamps)
    except C.ChunkError as exc:
        M.REJECTED.labels(exc.reason).inc()
        raise ApiError(exc.status, exc.code, str(exc),
                       {"Retry-After": f"{exc.retry_after:g}"} if exc.retry_after is not None else None) from None
    return JSONResponse(ack, status_code=status)


@router.websocket("/{stream}/ingest")
async def ingest_ws(ws: WebSocket, stream: str, store: StoreDep, settings: SettingsDep):
    if not await ws_allowed(ws, settings, "write"):
        return
    cfg = await crud.find_stream(store, stream)
    if cfg is None:
        await reject(ws, f"no stream named {stream!r}")
        return
    await ws.accept()
    try:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            raw = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
            seq = None
            try:
                if raw is None or len(raw) > settings.max_body_bytes:
                    raise C.ChunkError(f"message exceeds the limit of {settings.max_body_bytes} bytes", 413, "body_too_large",
                                       reason="too_large")
                try:  # lenient parse, only to echo the seq back with an error
                    doc = json.loads(raw)
                    seq = doc.get("seq") if isinstance(doc, dict) else None
                except (ValueError, RecursionError):
                    pass
                s, data, stamps = C.parse_json_chunk(raw if isinstance(raw, bytes) else raw.encode(), cfg.columns)
                status, ack = await crud.ingest(store, settings, cfg, s, data, stamps)
                await ws.send_json(ack)
            except C.ChunkError as exc:
                try:
                    now = ((await store.uids([stream]))[0] or b"").decode()
                except (rexc.ConnectionError, rexc.TimeoutError):
                    now = cfg.uid  # (Redis away: the error as it is; the next message finds out)
                if exc.reason != "gone" and now != cfg.uid:
                    # read against the config this socket opened with: a stream deleted and created again
                    # since (other columns) got "row 0: has 2 values, the stream has 1 columns ['x']" for a
                    # chunk right for the new one, and the socket stayed open (a new user's trial)
                    exc = C.ChunkError(f"stream {stream!r} was deleted (or deleted and created again): nothing stored",
                                       404, reason="gone")
                M.REJECTED.labels(exc.reason).inc()
                err = {"seq": seq if isinstance(seq, int) else None, "status": "error", "code": exc.status, "error": exc.code,
                       "detail": str(exc)}
                await ws.send_json(err if exc.retry_after is None else {**err, "retry_after": exc.retry_after})
                if exc.reason == "gone":  # this socket's stream is no more: open one to the new stream
                    await ws.close(1000, "stream deleted (or deleted and created again): reconnect")
                    return
            except (rexc.ConnectionError, rexc.TimeoutError) as exc:
                await ws.send_json({"seq": seq if isinstance(seq, int) else None, "status": "error", "code": 503,
                                    "error": "redis_unavailable", "detail": f"Redis unavailable: {exc}; resend"})
    except WebSocketDisconnect:
        return

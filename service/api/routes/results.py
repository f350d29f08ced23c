"""Results: evidence pages, change points, dead letters, and the live feeds (SSE, WebSocket)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

from fastapi import APIRouter, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse

from service.api import crud
from service.api.deps import Read, SettingsDep, StoreDep, reject, ws_allowed
from service.api.errors import READ, ApiError, errors
from service.api.schemas import KNOWN_KINDS, RESULT_ID_PATTERN, ChangepointList, DeadLetters, EntryKind, EvidencePage

router = APIRouter(prefix="/v1/streams", tags=["results"])


#: a filtered feed sends a keep-alive at least this often while it drops entries (as the store's
#: follow does on a stream without news), so proxies and clients see the connection alive
KEEPALIVE_SECONDS = 1.0
MODEL_QUERY = ("only this model's entries: its name in the stream, its spec as given (e.g. 'gmm:components=3', "
               "what cusp replay calls it), or its kind alone where one model is of it (e.g. 'gaussian')")
KIND_QUERY = "only entries of these kinds (repeat for several)"


@router.get("/{stream}/evidence", response_model=EvidencePage, response_model_exclude_unset=True, dependencies=[Read],
            responses=errors(*READ, 404, 422))
async def evidence(stream: str, store: StoreDep,
                   since: str | None = Query(None, description="return entries after this result id (a page's next)",
                                             json_schema_extra={"pattern": RESULT_ID_PATTERN}),
                   limit: int = Query(1000, ge=1, le=10_000, description="most entries in the page (after filtering)"),
                   model: str | None = Query(None, description=MODEL_QUERY),
                   kind: list[EntryKind] | None = Query(None, description=KIND_QUERY)):
    """The stream's result entries after ``since``, oldest first, filtered by model and kind
    before the page is cut to ``limit``. ``next`` is the cursor for the following page and
    ``has_more`` whether entries matching the filter follow it (a filtered page looks at most at
    50,000 entries: has_more may then be true for a short page)."""
    model = crud.feed_model(await crud.stream_config(store, stream), model)
    after = crud.check_id(since)
    results, cursor, more = await store.results(stream, after, limit, model, kind)
    return {"results": results, "next": cursor if cursor != after else since, "has_more": more}


@router.get("/{stream}/changepoints", dependencies=[Read], response_model=ChangepointList, response_model_exclude_unset=True, responses=errors(*READ, 404, 422))
async def changepoints(stream: str, store: StoreDep,
                       model: str | None = Query(None, description="only this model's own events under `changepoints` ("
                                                 + MODEL_QUERY.split(": ", 1)[1] + "); `stream`, the stream's answer, "
                                                 "is listed whole")) -> dict:
    """The stream's change points (``stream``) and each model's own events (``changepoints``),
    oldest first; ``model`` keeps one model's events (it was ignored, every model's listed: a new
    user's trial). 404 for a model the stream does not have."""
    cfg = await crud.stream_config(store, stream)
    return await crud.changepoints(store, cfg, crud.feed_model(cfg, model))


@router.get("/{stream}/dead-letters", dependencies=[Read], response_model=DeadLetters, responses=errors(*READ, 404, 422))
async def dead_letters(stream: str, store: StoreDep) -> dict:
    await crud.stream_config(store, stream)
    return {"dead_letters": await store.dead_letters(stream)}


@router.get("/{stream}/evidence/sse", dependencies=[Read], response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                             "description": "results and change points as server-sent events, live"}, **errors(*READ, 404, 422)})
async def evidence_sse(stream: str, request: Request, store: StoreDep,
                       since: str | None = Query(None, description="results after this result id (or the Last-Event-ID header)",
                                                 json_schema_extra={"pattern": RESULT_ID_PATTERN}),
                       model: str | None = Query(None, description=MODEL_QUERY),
                       kind: list[EntryKind] | None = Query(None, description=KIND_QUERY)):
    cfg = await crud.stream_config(store, stream)
    keep = crud.entry_filter(crud.feed_model(cfg, model), kind)
    start = crud.check_id(since or request.headers.get("last-event-id"))

    async def events():
        quiet = time.monotonic()  # the last write: a filter that drops a busy stream's entries still keeps it alive
        async for item in store.follow(stream, start, cfg.uid):
            if await request.is_disconnected():
                return
            if item is None or not keep(item):
                if item is None or time.monotonic() - quiet >= KEEPALIVE_SECONDS:
                    quiet = time.monotonic()
                    yield ": keep-alive\n\n"
            else:
                quiet = time.monotonic()
                yield f"id: {item['id']}\nevent: {item['kind']}\ndata: {json.dumps(item)}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.websocket("/{stream}/evidence/ws")
async def evidence_ws(ws: WebSocket, stream: str, store: StoreDep, settings: SettingsDep, since: str | None = None,
                      model: str | None = None, kind: list[str] | None = Query(None)):
    """The live feed over a WebSocket, with the SSE feed's ``since``, ``model`` and ``kind``;
    refused (1008, the reason the HTTP read would answer) before it opens."""
    if not await ws_allowed(ws, settings, "read"):
        return
    cfg = await crud.find_stream(store, stream)
    if cfg is None:
        await reject(ws, f"no stream named {stream!r}")
        return
    try:  # in the order the HTTP feed checks them: kind, model, since
        unknown = sorted(set(kind or ()) - set(KNOWN_KINDS))
        if unknown:
            raise ApiError(422, "invalid_request", f"kind: {unknown[0]!r} is not one of {', '.join(KNOWN_KINDS)}")
        keep = crud.entry_filter(crud.feed_model(cfg, model), kind)
        start = crud.check_id(since)
    except ApiError as exc:
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
        async with contextlib.aclosing(store.follow(stream, start, cfg.uid)) as items:
            async for item in items:
                if closed.done():
                    return
                if item is not None and keep(item):
                    await ws.send_json(item)
    except (WebSocketDisconnect, RuntimeError):
        return
    finally:
        left = closed.done()
        closed.cancel()
    if left:  # the client left while the feed ended: nobody to say goodbye to
        return
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # it may leave meanwhile; not an error of ours
        await ws.close(code=1000, reason="stream deleted")

"""The API's dependencies, as ``Annotated`` aliases: settings, the store, and access checks.

All are ``async def``: FastAPI runs a plain ``def`` dependency in a worker thread, a thread hop
per dependency per request that cost more than a small chunk's whole ingest.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request, WebSocket
from fastapi.requests import HTTPConnection

from service.api.errors import ApiError
from service.settings import Settings
from service.store.api import ApiStore


async def get_settings(conn: HTTPConnection) -> Settings:
    return conn.app.state.settings


async def get_store(conn: HTTPConnection) -> ApiStore:
    return conn.app.state.store


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[ApiStore, Depends(get_store)]


def scope_for(settings: Settings, key: str | None) -> str | None:
    """'write', 'read' or None (unknown key); every request may write when no keys are set."""
    if not settings.keys:
        return "write"
    return settings.scope_of(key)


def presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


async def _access(request: Request, settings: Settings, scope: str) -> None:
    got = scope_for(settings, presented_key(request))
    if got is None:
        raise ApiError(401, "unauthorized", "missing or unknown API key (send 'Authorization: Bearer KEY')", {"WWW-Authenticate": "Bearer"})
    if scope == "write" and got != "write":
        raise ApiError(403, "read_only_key", "this API key is read-only")


async def can_read(request: Request, settings: SettingsDep) -> None:
    await _access(request, settings, "read")


async def can_write(request: Request, settings: SettingsDep) -> None:
    await _access(request, settings, "write")


async def page_access(request: Request, settings: SettingsDep) -> None:
    """Pages opened in a browser (live page, API docs) take the key as ``?token=KEY`` too."""
    key = presented_key(request) or request.query_params.get("token")
    if scope_for(settings, key) is None:
        raise ApiError(401, "unauthorized", "missing or unknown API key (open the page with ?token=KEY)", {"WWW-Authenticate": "Bearer"})


def untyped_from_a_page(request: Request, settings: Settings) -> bool:
    """A body without a Content-Type sent by a page of another origin: a browser sends a ``fetch``
    with a Blob body that way without asking first (no CORS preflight), so taking it as JSON would
    let any web page write to a cusp on the reader's machine (whose API keys are off by default).
    Programs send no Origin; a page of an allowed origin (``CUSP_ALLOWED_ORIGINS``) may."""
    origin = request.headers.get("origin")
    return (request.headers.get("content-type") is None and origin is not None
            and not origin_allowed(settings, origin, request.headers.get("host")))


def is_json_type(kind: str) -> bool:
    """A media type (lower case, without parameters) that a route taking a JSON object reads:
    ``application/json`` or a ``+json`` type."""
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


async def json_body(request: Request, settings: SettingsDep) -> None:
    """A route whose body is a JSON object takes ``application/json`` (or a ``+json`` type, or no
    Content-Type from a program: its router sets ``strict_content_type=False``): another type is a
    415 naming it, as chunks get, not the 422 "Input should be a valid dictionary" FastAPI gives for a
    body it did not parse (seen: ``curl -d``, which sends ``application/x-www-form-urlencoded``).
    A browser's cross-site "simple" requests are refused: a form or text/plain by their type, no
    type at all from another origin by ``untyped_from_a_page``."""
    raw = request.headers.get("content-type")
    if raw is None:
        if untyped_from_a_page(request, settings):
            raise ApiError(415, "unsupported_media_type", "a request from a web page must say Content-Type: application/json")
        return
    kind = raw.split(";", 1)[0].strip().lower()
    if is_json_type(kind):
        return
    raise ApiError(415, "unsupported_media_type",
                   f"unsupported content type {kind!r}; this endpoint takes a JSON object: send Content-Type: application/json "
                   "(with curl: -H 'Content-Type: application/json')")


#: route-level checks: ``dependencies=[Read]`` or ``[Write]``; ``Json`` where the body is a JSON object
Read, Write, Page, Json = Depends(can_read), Depends(can_write), Depends(page_access), Depends(json_body)


async def reject(ws: WebSocket, reason: str) -> None:
    await ws.accept()  # accept first so that the client sees the 1008 close code and reason
    await ws.close(code=1008, reason=reason[:120])


def origin_allowed(settings: Settings, origin: str | None, host: str | None) -> bool:
    """A browser's ``Origin`` against ``CUSP_ALLOWED_ORIGINS`` (empty: the same origin only). No
    Origin header (a program, not a page): allowed, the API key is its check. A page elsewhere
    must not be able to write with the credentials of whoever opens it (cross-site WebSocket
    hijacking: browsers do not apply CORS to WebSockets)."""
    if origin is None:
        return True
    allowed = [o.strip().rstrip("/") for o in settings.allowed_origins.split(",") if o.strip()]
    if "*" in allowed or origin.rstrip("/") in allowed:
        return True
    return bool(host) and origin.split("://", 1)[-1].rstrip("/").lower() == host.lower()


async def ws_allowed(ws: WebSocket, settings: Settings, scope: str) -> bool:
    """A WebSocket's origin (``origin_allowed``) and key (``?token=``, X-API-Key or Bearer); on
    failure the socket is closed with 1008."""
    if not origin_allowed(settings, ws.headers.get("origin"), ws.headers.get("host")):
        await reject(ws, "origin not allowed (CUSP_ALLOWED_ORIGINS)")
        return False
    key = ws.query_params.get("token") or ws.headers.get("x-api-key")
    auth = ws.headers.get("authorization", "")
    if not key and auth.lower().startswith("bearer "):
        key = auth[7:].strip()
    got = scope_for(settings, key)
    if got is None or (scope == "write" and got != "write"):
        await reject(ws, "missing, unknown or read-only API key")
        return False
    return True

"""ASGI wrappers around the API (plain ASGI classes: Starlette's ``@app.middleware("http")`` costs a
task group and memory streams per request, more than the ingest of a small chunk), and the log
filter that keeps API keys out of uvicorn's logs."""

from __future__ import annotations

import logging
import re

from service import metrics as M
from service.api.chunks import ChunkError, loads
from service.api.deps import is_json_type
from service.api.errors import ApiError, problem


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
                    raise ApiError(413, "body_too_large", f"body exceeds the limit of {self.limit} bytes", {"Connection": "close"})
            return message

        await self.app(scope, limited, send)


#: the routes whose body is one JSON object read by FastAPI (chunks are read by ``service.api.chunks``)
STRICT_JSON_PATHS = ("/v1/streams", "/v1/detect")


def _json_typed(scope) -> bool:
    """No Content-Type, application/json or a +json type: what FastAPI reads as JSON here."""
    raw = next((v for k, v in scope["headers"] if k == b"content-type"), None)
    if raw is None:
        return True
    return is_json_type(raw.decode("latin-1").split(";", 1)[0].strip().lower())


class StrictJson:
    """ASGI wrapper: the JSON bodies FastAPI parses (``POST /v1/streams``, ``POST /v1/detect``) are
    read as chunks are (``service.api.chunks.loads``: UTF-8 without a byte-order mark, no key twice
    in an object, a clear reason for text that is not JSON) before FastAPI sees them. FastAPI's
    own ``json.loads`` took a key twice (the last won: a stream created under the second of two
    names), skipped a byte-order mark, and answered "There was an error parsing the body" for a
    body that is not UTF-8 or nested too deeply (a new user's trial, 2026-12-07). The body is then
    handed on as it came; one that is not JSON-typed, or empty, is left to the route (415,
    ``empty_body``)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope["method"] != "POST" or scope["path"].rstrip("/") not in STRICT_JSON_PATHS
                or not _json_typed(scope)):
            return await self.app(scope, receive, send)
        messages, parts = [], []
        while True:
            try:
                message = await receive()
            except ApiError as exc:  # BodyLimit's 413: answered here, outside the app's handlers
                return await problem(exc.status_code, exc.code, exc.detail, scope["path"], exc.headers)(scope, receive, send)
            messages.append(message)
            if message["type"] != "http.request":
                break
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        if body.strip() and messages[-1]["type"] == "http.request":
            try:
                loads(body)
            except ChunkError as exc:
                return await problem(exc.status, exc.code, str(exc), scope["path"])(scope, receive, send)
        pending = iter(messages)

        async def again():
            return next(pending, None) or await receive()

        await self.app(scope, again, send)


class CheckLengthAndCount:
    """ASGI wrapper: refuses a declared Content-Length over ``limit`` before anything reads the
    body (413, connection closed), and counts every answer in cusp_http_requests_total by route
    template and status class. A client that went away before its answer began (mid-body, say)
    is counted as status "client_closed" (nginx's 499), not as the 400 or 500 the app may make
    of its half body, and what the app raised over it is not logged as a server error."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        path = scope.get("path", "")
        if length is not None:
            try:
                too_big = int(length) > self.limit
            except ValueError:
                return await problem(400, "invalid_content_length", "invalid Content-Length", path)(scope, receive, send)
            if too_big:
                M.REJECTED.labels("too_large").inc()
                return await problem(413, "body_too_large", f"body of {length.decode()} bytes exceeds the limit of {self.limit} bytes",
                                     path, {"Connection": "close"})(scope, receive, send)  # not drained
        status: int | str = 500
        closed = started = False

        async def receive_and_note():
            nonlocal closed
            message = await receive()
            if message["type"] == "http.disconnect":
                closed = True
            return message

        async def send_and_note(message):
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = "client_closed" if closed else message["status"]
            await send(message)

        try:
            await self.app(scope, receive_and_note, send_and_note)
        except Exception:
            if not closed:
                raise
            status = status if started else "client_closed"  # nobody to answer: not a server error
        finally:
            route = scope.get("route")
            M.HTTP_REQUESTS.labels(getattr(route, "path", "unmatched"), status if isinstance(status, str) else f"{status // 100}xx").inc()


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


def redact_uvicorn_logs() -> None:
    for name in ("uvicorn.access", "uvicorn.error", "uvicorn"):
        if REDACT not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(REDACT)

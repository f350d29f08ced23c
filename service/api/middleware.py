"""ASGI wrappers around the API (plain ASGI classes: Starlette's ``@app.middleware("http")`` costs a
task group and memory streams per request, more than the ingest of a small chunk), and the log
filter that keeps API keys out of uvicorn's logs."""

from __future__ import annotations

import logging
import re

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from service import metrics as M


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
    """ASGI wrapper: refuses a declared Content-Length over ``limit`` before anything reads the
    body (413, connection closed), and counts every answer in cusp_http_requests_total by route
    template and status class."""

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


def redact_uvicorn_logs() -> None:
    for name in ("uvicorn.access", "uvicorn.error", "uvicorn"):
        if REDACT not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(REDACT)

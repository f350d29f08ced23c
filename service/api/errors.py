"""One error shape for every failure: JSON ``{"detail": text}`` with a 4xx, Redis outages a 503
(with Retry-After); request validation failures also list the fields at fault (never their values).
``errors(*codes)`` documents in OpenAPI the error statuses a route really answers."""

from __future__ import annotations

import redis.exceptions as rexc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from service import metrics as M
from service.api.schemas import Problem

WHY = {400: "malformed body (not JSON, not UTF-8, nested too deeply)", 401: "missing or unknown API key",
       403: "the API key is read-only", 404: "no such stream (or model)", 409: "conflict: sequence gap, seq reused with other data, "
       "name taken or the stream limit reached", 413: "body over CUSP_MAX_BODY_BYTES or chunk over CUSP_MAX_CHUNK_ROWS",
       415: "unsupported Content-Type", 422: "invalid request: the detail names the field", 503: "Redis unavailable; retry"}

READ, WRITE = (401, 503), (401, 403, 503)  # auth, plus Redis down


def errors(*codes: int) -> dict:
    """OpenAPI ``responses`` for the error statuses a route really answers (body: Problem)."""
    return {c: {"model": Problem, "description": WHY[c]} for c in codes}


async def redis_down(request: Request, exc: Exception) -> JSONResponse:
    M.REDIS_UP.set(0)
    return JSONResponse({"detail": f"Redis unavailable: {exc}; retry later"}, status_code=503, headers={"Retry-After": "1"})


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    errs = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))} for e in exc.errors()]
    status = 400 if any(e["type"] == "json_invalid" for e in errs) else 422
    detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errs[:10]) or "invalid request"
    return JSONResponse({"detail": detail, "errors": errs}, status_code=status)


def install(app: FastAPI) -> None:
    app.add_exception_handler(rexc.ConnectionError, redis_down)
    app.add_exception_handler(rexc.TimeoutError, redis_down)
    app.add_exception_handler(RequestValidationError, invalid_request)

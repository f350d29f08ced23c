"""One error shape for every failure: RFC 9457 problem details (``application/problem+json``)
with a stable, machine-readable ``code`` per kind of error (``CODES``; docs/api.md lists them).

    {"type": "/v1/errors#seq_gap", "title": "Sequence gap", "status": 409,
     "detail": "seq 7 is out of order: expected seq 5", "instance": "/v1/streams/s/chunks",
     "code": "seq_gap"}

``detail`` names what was wrong (a row, a column, a field) as it always did; request
validation failures also list each field at fault in ``errors`` (never their values). Routes
raise ``ApiError(status, code, detail)``; Starlette's own 404/405 and FastAPI's validation
errors are answered in the same shape (405s with an ``Allow`` header listing every method the
path takes). ``errors(*statuses)`` documents in OpenAPI the error statuses a route really
answers, and ``document(app)`` makes every error response of the schema a problem+json one.
"""

from __future__ import annotations

from collections.abc import Mapping

import redis.exceptions as rexc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from service import metrics as M
from service.api.schemas import Problem

PROBLEM_JSON = "application/problem+json"

#: every error code: (HTTP status, title). Stable: clients may branch on them; add, never rename.
CODES: dict[str, tuple[int, str]] = {
    "malformed_body": (400, "The body cannot be read: not JSON, not UTF-8, nested too deeply or a key twice"),
    "empty_body": (400, "The request has no body"),
    "invalid_content_length": (400, "The Content-Length header is not a number"),
    "invalid_http": (400, "The request is not valid HTTP/1.1: its request line, a header line or the body's framing"),
    "unauthorized": (401, "Missing or unknown API key"),
    "read_only_key": (403, "The API key is read-only"),
    "not_found": (404, "No such path"),
    "stream_not_found": (404, "No such stream"),
    "model_not_found": (404, "The stream has no such model"),
    "method_not_allowed": (405, "The path does not take this method (see Allow)"),
    "seq_gap": (409, "Sequence gap: the seq is not the next one"),
    "seq_conflict": (409, "The seq was already accepted with other data"),
    "seq_too_old": (409, "The seq is older than the digests kept (CUSP_DEDUP_WINDOW)"),
    "time_order": (409, "The chunk's first time is not after the stream's last time"),
    "stream_exists": (409, "A stream of that name exists"),
    "stream_limit": (409, "The stream limit CUSP_MAX_STREAMS is reached"),
    "body_too_large": (413, "The body is over CUSP_MAX_BODY_BYTES"),
    "chunk_too_large": (413, "The chunk has more rows than CUSP_MAX_CHUNK_ROWS"),
    "stream_too_large": (413, "The stream's models would need more Redis memory than CUSP_MAX_STREAM_BYTES"),
    "deployment_full": (413, "With this stream the streams' models would need more Redis memory than CUSP_MAX_TOTAL_STREAM_BYTES"),
    "series_too_long": (413, "The series has more rows than POST /v1/detect takes"),
    "unsupported_media_type": (415, "Unsupported Content-Type"),
    "invalid_request": (422, "The request does not match the schema"),
    "invalid_rows": (422, "A chunk's values are not usable: the detail names the row and column"),
    "invalid_time": (422, "A chunk's times are not usable: not RFC 3339 or epoch seconds, not one per row, not increasing, or too far ahead of the clock"),
    "invalid_seq": (422, "seq is missing or not an integer in [0, 2**53]"),
    "invalid_stream": (422, "The stream's name, columns or settings are invalid"),
    "invalid_model": (422, "A model spec, name, target or its sampler settings are invalid"),
    "invalid_since": (422, "since is not a result id"),
    "invalid_series": (422, "The series given to POST /v1/detect is not usable"),
    "backlog_full": (429, "The stream's backlog of unprocessed chunks is full: retry after Retry-After seconds"),
    "internal_error": (500, "Internal error"),
    "redis_unavailable": (503, "Redis is unavailable: retry after Retry-After seconds"),
}

#: the code of an error raised without one (Starlette's routing, FastAPI, plain HTTPException)
DEFAULT_CODE = {400: "malformed_body", 401: "unauthorized", 403: "read_only_key", 404: "not_found",
                405: "method_not_allowed", 413: "body_too_large", 415: "unsupported_media_type", 422: "invalid_request",
                429: "backlog_full", 503: "redis_unavailable"}

WHY = {400: "malformed body (not JSON, not UTF-8, nested too deeply)", 401: "missing or unknown API key",
       403: "the API key is read-only", 404: "no such stream (or model)", 409: "conflict: sequence gap, seq reused with other data, "
       "name taken or the stream limit reached", 413: "body over CUSP_MAX_BODY_BYTES or chunk over CUSP_MAX_CHUNK_ROWS",
       415: "unsupported Content-Type", 422: "invalid request: the detail names the field",
       429: "the stream's backlog is full (Retry-After says when to resend)", 503: "Redis unavailable; retry"}

READ, WRITE = (401, 503), (401, 403, 503)  # auth, plus Redis down


class ApiError(StarletteHTTPException):
    """An error answer: HTTP ``status``, a ``code`` from ``CODES`` and a ``detail`` naming the fault."""

    def __init__(self, status: int, code: str, detail: str, headers: Mapping[str, str] | None = None):
        assert CODES[code][0] == status, (code, status)
        super().__init__(status, detail, dict(headers) if headers else None)
        self.code = code


def type_of(code: str) -> str:
    """The problem type URI of a code: a reference to ``GET /v1/errors``, which lists them all."""
    return f"/v1/errors#{code}"


def problem_body(status: int, code: str, detail: str, instance: str | None = None, **extra) -> dict:
    """The problem details of an error answer (``problem``'s body)."""
    title = CODES[code][1] if code in CODES else "Error"
    body = {"type": type_of(code), "title": title, "status": status, "detail": detail, "code": code}
    if instance is not None:
        body["instance"] = instance
    body.update(extra)
    return body


def problem(status: int, code: str, detail: str, instance: str | None = None, headers: Mapping[str, str] | None = None,
            **extra) -> JSONResponse:
    return JSONResponse(problem_body(status, code, detail, instance, **extra), status_code=status,
                        headers=dict(headers) if headers else None, media_type=PROBLEM_JSON)


def errors(*codes: int) -> dict:
    """OpenAPI ``responses`` for the error statuses a route really answers (body: Problem; the
    description names the codes of that status)."""
    out = {}
    for c in codes:
        names = ", ".join(f"`{k}`" for k, (s, _) in CODES.items() if s == c)
        out[c] = {"model": Problem, "description": f"{WHY[c]} (code: {names})" if names else WHY[c]}
        if c in (429, 503):
            out[c]["headers"] = {"Retry-After": {"description": "seconds to wait before sending again", "schema": {"type": "integer"}}}
    return out


def allowed_methods(request: Request) -> list[str]:
    """Every method some route takes at this request's path (a 405's ``Allow``): Starlette's own
    405 names only the first route that matched the path, and GET and DELETE of a stream are two."""
    methods: set[str] = set()
    scope = {**request.scope, "method": "__none__"}
    for route in request.app.router.routes:
        for inner in _flatten(route):
            if getattr(inner, "methods", None) and inner.matches(scope)[0] != Match.NONE:
                methods |= set(inner.methods)
    return sorted(methods)


def _flatten(route):
    inner = getattr(route, "original_router", None)
    if inner is None:
        yield route
    else:
        for r in inner.routes:
            yield from _flatten(r)


async def http_error(request: Request, exc: StarletteHTTPException):
    code = getattr(exc, "code", None) or DEFAULT_CODE.get(exc.status_code, "internal_error" if exc.status_code >= 500 else "invalid_request")
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request)) or headers.get("Allow", "")
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code in (404, 405) and detail in ("Not Found", "Method Not Allowed"):
        detail = (f"no such path: {request.url.path}" if exc.status_code == 404 else
                  f"{request.method} is not allowed on {request.url.path}; allowed: {headers['Allow']}")
    if exc.status_code < 200 or exc.status_code in (204, 304):  # no body allowed
        return JSONResponse(None, status_code=exc.status_code, headers=headers)
    return problem(exc.status_code, code, detail, request.url.path, headers)


async def redis_down(request: Request, exc: Exception) -> JSONResponse:
    M.REDIS_UP.set(0)
    return problem(503, "redis_unavailable", f"Redis unavailable: {exc}; retry later", request.url.path, {"Retry-After": "1"})


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    errs = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))} for e in exc.errors()]
    malformed = any(e["type"] == "json_invalid" for e in errs)
    detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errs[:10]) or "invalid request"
    code = "malformed_body" if malformed else "invalid_request"
    if errs and all(e["loc"] == ["query", "seq"] for e in errs):
        code = "invalid_seq"  # ?seq=-1 on a CSV chunk is what "seq": -1 in a JSON one is (a new user's finding)
    elif len(errs) == 1 and errs[0]["loc"] == ["body"] and errs[0]["type"] == "missing":
        # no body at all, as on a chunk (was 422 'body: Field required' here and 400 'empty_body' there)
        return problem(400, "empty_body", "empty body: send a JSON object", request.url.path)
    elif errs and all(e["loc"][:2] in (["body", "values"], ["body", "times"], ["body", "series"]) for e in errs) \
            and request.url.path.rstrip("/").endswith("/v1/detect"):
        code = "invalid_series"  # a NaN in 'values' is what an empty or ragged series is (the trial of 2026-12-06)
    return problem(400 if malformed else 422, code, detail, request.url.path, errors=errs)


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    return problem(500, "internal_error", "internal error (the server's log has the details)", request.url.path)


def install(app: FastAPI) -> None:
    app.add_exception_handler(rexc.ConnectionError, redis_down)
    app.add_exception_handler(rexc.TimeoutError, redis_down)
    # a Redis Cluster that lost a shard or cannot be reached: the same outage, not a bug
    # (ClusterDownError and MasterDownError; RedisClusterException: no node reachable, slot not covered)
    for exc in (rexc.ClusterError, rexc.RedisClusterException, rexc.TryAgainError):
        app.add_exception_handler(exc, redis_down)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)


def document(app: FastAPI) -> None:
    """Every 4xx/5xx response of the app's OpenAPI schema as ``application/problem+json`` with
    the Problem schema (FastAPI documents its own 422 as ``HTTPValidationError`` in JSON)."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = generate()
            ref = {"$ref": "#/components/schemas/Problem"}
            for path in schema.get("paths", {}).values():
                for op in path.values():
                    for status, resp in op.get("responses", {}).items():
                        if status[:1] in "45":
                            resp["content"] = {PROBLEM_JSON: {"schema": ref}}
            comps = schema.setdefault("components", {}).setdefault("schemas", {})
            problem_schema = comps.setdefault("Problem", Problem.model_json_schema(ref_template="#/components/schemas/{model}"))
            problem_schema["properties"]["code"]["enum"] = list(CODES)
            text = str(schema["paths"])
            for unused in ("HTTPValidationError", "ValidationError"):
                if f"/{unused}'" not in text:
                    comps.pop(unused, None)
        return app.openapi_schema

    app.openapi = openapi

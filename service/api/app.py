"""The application factory: settings, the store, error handlers, ASGI wrappers and one router
per resource (service/api/routes). Routes are thin: validate, call the store or service.api.crud,
answer."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI

from service import metrics as M
from service.api import errors
from service.api.http11 import ProblemH11Protocol
from service.api.middleware import BodyLimit, CheckLengthAndCount, StrictJson, redact_uvicorn_logs
from service.api.routes import detect, ingest, ops, pages, results, streams
from service.settings import Settings
from service.store.api import ApiStore


def create_app(settings: Settings, redis_url: str, worker_metrics: Sequence[str] = ()) -> FastAPI:
    """The API. ``worker_metrics``: /metrics URLs of worker processes (``cusp serve``'s children)
    whose series this process's /metrics includes; with any, /readyz also needs a live worker."""
    # the schema and its documentation pages are served by the pages router, behind the API key
    app = FastAPI(title="cusp", version="0.1.0", description="Streaming change-point detection on online Bayesian evidence (SGAIS).",
                  openapi_url=None, docs_url=None, redoc_url=None)
    redact_uvicorn_logs()
    app.state.settings = settings
    app.state.store = ApiStore(redis_url)
    app.state.worker_metrics = tuple(worker_metrics)
    M.WORKERS.inc(0)  # always exported, 0 in an API-only process
    errors.install(app)
    if settings.cors:  # opt-in: without it no CORS headers, so other sites' pages cannot read answers
        from fastapi.middleware.cors import CORSMiddleware

        origins = [o.strip().rstrip("/") for o in settings.allowed_origins.split(",") if o.strip()]
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["Authorization", "Content-Type", "X-API-Key", "Last-Event-ID"])
    app.add_middleware(StrictJson)  # inside BodyLimit: the body it reads is counted there
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(CheckLengthAndCount, limit=settings.max_body_bytes)
    for module in (ops, streams, ingest, results, detect, pages):
        app.include_router(module.router)
    ingest.document_limits(app, settings)
    errors.document(app)
    return app


def server_options(settings: Settings) -> dict:
    """uvicorn settings of cusp's API beyond host and port; ``cusp serve`` and the tests' live
    servers both use these. The sans-I/O websockets implementation (uvicorn's default since
    0.50; the legacy one is deprecated). A WebSocket message over CUSP_MAX_BODY_BYTES gets a
    413 error message and the connection stays open; the protocol layer closes it (1009) only
    past twice the limit (at least uvicorn's 16 MiB default), so a raised limit is not
    shadowed and memory stays bounded. HTTP/1.1 through h11 with cusp's problem+json answer to a
    request it cannot parse (``service.api.http11``; uvicorn's own is plain text). At SIGTERM, requests
    in flight get SHUTDOWN_GRACE_SECONDS to finish, then are cancelled: a live SSE feed never ends on its
    own (a WebSocket feed is closed with 1012), and `cusp serve` waited on it for ever, its workers and
    embedded Redis still running (an operator's trial); a follower reconnects with Last-Event-ID."""
    return {"http": ProblemH11Protocol, "ws": "websockets-sansio",
            "ws_max_size": max(16 * 1024 * 1024, 2 * settings.max_body_bytes),
            "timeout_graceful_shutdown": SHUTDOWN_GRACE_SECONDS}


#: seconds a stopping API gives its open requests (``server_options``); within Kubernetes' default 30 s grace
SHUTDOWN_GRACE_SECONDS = 5

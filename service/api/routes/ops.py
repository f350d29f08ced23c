"""Probes and metrics: /healthz (liveness), /readyz (Redis reachable and, under ``cusp serve``
with worker processes or with CUSP_READY_NEEDS_WORKERS=true, a worker that made progress within
a lease), /metrics (Prometheus); and /v1/errors, the error codes (the problem types' URI)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import redis.exceptions as rexc
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service import metrics as M
from service.api import crud
from service.api.deps import Read, SettingsDep, StoreDep
from service.api.errors import CODES, READ, WHY, errors
from service.api.schemas import ErrorCodes, Health, Ready
from service.supervise import scrape

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=Health)
async def healthz() -> dict:
    return {"status": "ok"}


def worker_window(lease_seconds: float) -> float:
    """Readiness needs a worker that made progress within this many seconds: one lease. A moving
    worker writes its heartbeat after every poll and, while it works through chunks, at least every
    third of a lease (service/worker.py); one that has not for a whole lease has let its leases lapse."""
    return lease_seconds


@router.get("/readyz", response_model=Ready, response_model_exclude_none=True,
            responses={503: {"model": Ready, "description": "Redis unreachable, or (when workers are required) no worker made progress within a lease"}})
async def readyz(request: Request, store: StoreDep, settings: SettingsDep):
    needs_workers = settings.ready_needs_workers
    if needs_workers is None:  # cusp serve runs worker processes: they must be moving too
        needs_workers = bool(request.app.state.worker_metrics)
    window = worker_window(settings.lease_seconds)
    try:
        await asyncio.wait_for(store.ping(), 2.0)
        alive = await asyncio.wait_for(store.live_workers(time.time(), window), 2.0) if needs_workers else None
    except (rexc.RedisError, rexc.RedisClusterException, OSError, asyncio.TimeoutError) as exc:
        M.REDIS_UP.set(0)
        return JSONResponse({"status": "unavailable", "redis": str(exc) or "timeout"}, status_code=503)
    M.REDIS_UP.set(1)
    if alive == 0:  # workers stuck, failing every poll, or crash-looping (cusp_workers 0); their logs say why
        return JSONResponse({"status": "unavailable", "redis": "ok",
                             "workers": f"no worker has made progress in the last {window:g} s (starting, stuck, failing or "
                                        "crashing: see the workers' /healthz and logs)"},
                            status_code=503)
    return {"status": "ready", "redis": "ok"}


#: how long /metrics waits for Redis (a PING, then the stream gauges) and, at once, for each worker process's
#: exposition: 3.5 s at most, within Prometheus's 4 s scrape timeout (deploy/prometheus)
METRICS_REDIS_SECONDS = 1.0
METRICS_WORKER_SECONDS = 1.5


@router.get("/metrics", response_class=PlainTextResponse, dependencies=[Read],
            responses={401: {"description": WHY[401], "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}})
async def metrics(request: Request, store: StoreDep):
    # within Prometheus's scrape timeout (deploy/prometheus: 4 s) whatever hangs: a Redis that does not
    # answer (its socket timeout, 5 s) or worker processes stopped (2 s each, one after another) made the
    # whole target time out, so CuspTargetDown fired for the API and CuspRedisDown could not (an
    # operator's trial); a Redis Cluster with no node up answered 503 here
    # (Redis is up when it answers a PING in time; a slow refresh of the stream gauges, one config read a
    # stream after a restart, leaves them as they were rather than say Redis is down, a review)
    try:
        await asyncio.wait_for(store.ping(), METRICS_REDIS_SECONDS)
        M.REDIS_UP.set(1)
    except (rexc.RedisError, rexc.RedisClusterException, OSError, asyncio.TimeoutError):
        M.REDIS_UP.set(0)
    else:
        with contextlib.suppress(rexc.RedisError, rexc.RedisClusterException, OSError, asyncio.TimeoutError):
            await asyncio.wait_for(crud.refresh_stream_gauges(store), METRICS_REDIS_SECONDS)
    worker_metrics = request.app.state.worker_metrics
    if worker_metrics:
        keys = request.app.state.settings.keys
        texts = await asyncio.to_thread(scrape, list(worker_metrics), METRICS_WORKER_SECONDS, next(iter(keys), None))
        return PlainTextResponse(M.merged_exposition(texts), media_type=CONTENT_TYPE_LATEST)
    return PlainTextResponse(generate_latest(M.REGISTRY), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/errors", response_model=ErrorCodes, summary="The error codes", dependencies=[Read], responses=errors(*READ))
async def error_codes() -> dict:
    """Every ``code`` an error answer (RFC 9457 problem details) may carry, with its HTTP status
    and title; a problem's ``type`` is ``/v1/errors#<code>``."""
    return {"errors": [{"code": c, "status": s, "title": t} for c, (s, t) in CODES.items()]}

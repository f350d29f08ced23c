"""Probes and metrics: /healthz (liveness), /readyz (Redis reachable and, under ``cusp serve``
with worker processes, a worker alive), /metrics (Prometheus)."""

from __future__ import annotations

import asyncio
import time

import redis.exceptions as rexc
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service import metrics as M
from service.api import crud
from service.api.deps import Read, SettingsDep, StoreDep
from service.api.errors import WHY
from service.api.schemas import Health, Ready
from service.supervise import scrape

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=Health)
async def healthz() -> dict:
    return {"status": "ok"}


def worker_window(lease_seconds: float) -> float:
    """Readiness of a process that supervises workers: one of them reported within this many
    seconds (at least 6 leases: a worker reports once per pass over its pairs, which may take a
    few leases)."""
    return max(60.0, 6 * lease_seconds)


@router.get("/readyz", response_model=Ready, response_model_exclude_none=True,
            responses={503: {"model": Ready, "description": "Redis unreachable, or no worker process of cusp serve has reported lately"}})
async def readyz(request: Request, store: StoreDep, settings: SettingsDep):
    supervised = bool(request.app.state.worker_metrics)  # cusp serve runs worker processes: they must be alive too
    window = worker_window(settings.lease_seconds)
    try:
        await asyncio.wait_for(store.ping(), 2.0)
        alive = await asyncio.wait_for(store.live_workers(time.time(), window), 2.0) if supervised else None
    except (rexc.RedisError, OSError, asyncio.TimeoutError) as exc:
        M.REDIS_UP.set(0)
        return JSONResponse({"status": "unavailable", "redis": str(exc) or "timeout"}, status_code=503)
    M.REDIS_UP.set(1)
    if alive == 0:  # e.g. every worker process crash-looping (cusp_workers 0); the log says why
        return JSONResponse({"status": "unavailable", "redis": "ok",
                             "workers": f"no worker process has reported in the last {window:.0f} s (starting, or crashing: see the log)"},
                            status_code=503)
    return {"status": "ready", "redis": "ok"}


@router.get("/metrics", response_class=PlainTextResponse, dependencies=[Read],
            responses={401: {"description": WHY[401], "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}})
async def metrics(request: Request, store: StoreDep):
    try:
        await crud.refresh_stream_gauges(store)
        M.REDIS_UP.set(1)
    except (rexc.RedisError, OSError):
        M.REDIS_UP.set(0)
    worker_metrics = request.app.state.worker_metrics
    if worker_metrics:
        texts = await asyncio.to_thread(scrape, list(worker_metrics))
        return PlainTextResponse(M.merged_exposition(texts), media_type=CONTENT_TYPE_LATEST)
    return PlainTextResponse(generate_latest(M.REGISTRY), media_type=CONTENT_TYPE_LATEST)

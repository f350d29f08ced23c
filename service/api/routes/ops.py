"""Probes and metrics: /healthz (liveness), /readyz (Redis reachable), /metrics (Prometheus)."""

from __future__ import annotations

import asyncio

import redis.exceptions as rexc
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service import metrics as M
from service.api import crud
from service.api.deps import Read, StoreDep
from service.api.errors import WHY
from service.api.schemas import Health, Ready
from service.supervise import scrape

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=Health)
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz", response_model=Ready, responses={503: {"model": Ready, "description": "Redis unreachable"}})
async def readyz(store: StoreDep):
    try:
        await asyncio.wait_for(store.ping(), 2.0)
    except (rexc.RedisError, OSError, asyncio.TimeoutError) as exc:
        M.REDIS_UP.set(0)
        return JSONResponse({"status": "unavailable", "redis": str(exc) or "timeout"}, status_code=503)
    M.REDIS_UP.set(1)
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

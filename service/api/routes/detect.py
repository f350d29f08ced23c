"""One-shot detection: ``POST /v1/detect`` takes a whole series and answers its change points,
each model's evidence and posterior probability and each chunk's log predictive. Nothing is
stored: the request is validated as a stream's would be (``crud.config_from_request``) and run
by ``cusp.Detector.for_stream``, the models a worker would run for such a stream, off the event
loop."""

from __future__ import annotations

import asyncio
import math

import numpy as np
from fastapi import APIRouter, Request

from cusp.detector import Detector
from cusp.errors import InputError
from models import ModelError
from models.registry import default_portfolio
from service import times as T
from service.api import crud
from service.api.deps import Json, Read, SettingsDep
from service.api.errors import ApiError, errors
from service.api.schemas import (DETECT_DEFAULT_CHUNKS, MAX_DETECT_CHUNKS, MAX_DETECT_ROWS, DetectChange, DetectChunk,
                                 DetectEvent, DetectIn, DetectModel, DetectOut, DetectWithdrawn, ModelFrame, StreamIn)
from service.data import MAX_COLUMNS, MAX_MAGNITUDE, too_large
from service.detect import DetectorConfig
from service.settings import Settings
from service.sgais import EngineError, TooLarge

router = APIRouter(prefix="/v1", tags=["detect"], strict_content_type=False)  # no Content-Type: JSON (``Json``)

#: one-shot computations running at once per API process; more requests wait their turn
CONCURRENT = 2


@router.post("/detect", response_model=DetectOut, dependencies=[Read, Json], responses=errors(400, 401, 413, 415, 422))
async def detect(body: DetectIn, request: Request, settings: SettingsDep) -> DetectOut:
    data, times = series_of(body)
    try:
        cfg = crud.config_from_request(stream_request(body, data.shape[1]))
    except ApiError as exc:
        if exc.code != "invalid_stream":
            raise
        # no stream here: its settings are the request's (the detector's), its columns the series'
        raise ApiError(422, "invalid_request", exc.detail) from None
    crud.initial_states(cfg)  # the sampler settings and the particle limit, checked as at create (the states are not kept)
    chunk = chunk_size(body.chunk_size, data.shape[0], settings)
    if times is None and DetectorConfig.from_dict(cfg.detector).run_length_seconds is not None:
        raise ApiError(422, "invalid_series", f"detector expected_run_length={cfg.detector['expected_run_length']!r} is a "
                                              "duration: it needs the rows' times ('times', or 'series' with timestamps); "
                                              "or give it in observations")
    async with gate(request):
        det = await asyncio.to_thread(run, cfg, data, chunk, times)
    return answer(det, times)


def gate(request: Request) -> asyncio.Semaphore:
    state = request.app.state
    if getattr(state, "detect_gate", None) is None:
        state.detect_gate = asyncio.Semaphore(CONCURRENT)
    return state.detect_gate


def series_of(body: DetectIn) -> tuple[np.ndarray, list | None]:
    """The rows ``[T, C]`` and the times as given (or None), or 413/422 naming the fault."""
    if (body.values is None) == (body.series is None):
        raise ApiError(422, "invalid_series", "give the series as 'values' (with optional 'times') or as 'series', not both or neither")
    if body.series is not None:
        if body.times is not None:
            raise ApiError(422, "invalid_series", "'times' goes with 'values'; 'series' points carry their own timestamps")
        raw, times = [p.value for p in body.series], [p.timestamp for p in body.series]
        what = "series"
    else:
        raw, times, what = body.values, body.times, "values"
    if not raw:
        raise ApiError(422, "invalid_series", f"{what} is empty")
    if len(raw) > MAX_DETECT_ROWS:
        raise ApiError(413, "series_too_long", f"{what} has {len(raw):,} rows; POST /v1/detect takes at most {MAX_DETECT_ROWS:,} "
                                 "(create a stream for longer series)")
    shapes = {len(r) if isinstance(r, list) else None for r in raw}
    if len(shapes) > 1:
        first = len(raw[0]) if isinstance(raw[0], list) else None
        bad = next(i for i, r in enumerate(raw) if (len(r) if isinstance(r, list) else None) != first)
        def shape(r) -> str:
            return f"{len(r)} value{'s' if len(r) != 1 else ''}" if isinstance(r, list) else "a number"
        raise ApiError(422, "invalid_series", f"{what}[{bad}] is {shape(raw[bad])}, {what}[0] {shape(raw[0])}: all rows "
                                 "need the same number of values")
    data = np.asarray(raw, dtype=np.float64)
    data = data[:, None] if data.ndim == 1 else data
    if data.shape[1] == 0 or data.shape[1] > MAX_COLUMNS:
        raise ApiError(422, "invalid_series", f"{what}: rows must have 1 to {MAX_COLUMNS} values, got {data.shape[1]}")
    at = too_large(data)  # ('values' are checked as they are read; 'series' points here)
    if at is not None:
        where = f"series[{at[0]}].value" if what == "series" else f"values[{at[0]}]"
        where += f"[{at[1]}]" if isinstance(raw[at[0]], list) else ""
        raise ApiError(422, "invalid_series", f"{where} is {float(data[at]):g}: values must be within +-{MAX_MAGNITUDE:g}")
    if times is not None:
        check_times(times, data.shape[0], "times" if what == "values" else "series[].timestamp")
    return data, times


def check_times(times: list, rows: int, what: str) -> None:
    """One time per row, each as stream ingest reads times (``service.times``: RFC 3339 with an
    offset, a date, or epoch seconds in the years 1 to 9999), strictly increasing."""
    try:
        T.parse_all(times, rows, what)
    except T.TimeError as exc:
        raise ApiError(422, "invalid_series", str(exc)) from None


def stream_request(body: DetectIn, width: int) -> StreamIn:
    columns = body.columns or [f"x{i}" for i in range(width)]
    if len(columns) != width:
        raise ApiError(422, "invalid_series", f"columns names {len(columns)} columns but the rows have {width} values")
    req = StreamIn(name="detect", columns=columns, models=body.models or list(default_portfolio(width)),
                   sampler=body.sampler, seed=body.seed, detector=body.detector)
    try:
        crud.check_names(req)
    except ApiError as exc:
        raise ApiError(422, "invalid_series", exc.detail) from None  # (the columns' names: 'invalid_stream' named no stream)
    return req


def chunk_size(asked: int | None, rows: int, settings: Settings) -> int:
    chunk = asked or math.ceil(rows / DETECT_DEFAULT_CHUNKS)
    if chunk > settings.max_chunk_rows:
        raise ApiError(422, "invalid_request", f"chunk_size {chunk} exceeds CUSP_MAX_CHUNK_ROWS={settings.max_chunk_rows}")
    if asked is not None and asked > 1 and asked >= rows:
        # (cut to the series before: one chunk, and an answer without change points that looked like "none")
        raise ApiError(422, "invalid_request", f"chunk_size {asked} is not below the series' {rows:,} rows: in one chunk no "
                                               "change can be found (a change needs chunks on both sides of it); use a "
                                               f"smaller chunk_size, or leave it out (ceil(rows / {DETECT_DEFAULT_CHUNKS}))")
    if math.ceil(rows / chunk) > MAX_DETECT_CHUNKS:
        raise ApiError(422, "invalid_request", f"{rows:,} rows in chunks of {chunk} make {math.ceil(rows / chunk):,} chunks; the limit is "
                                 f"{MAX_DETECT_CHUNKS:,}: use chunk_size >= {math.ceil(rows / MAX_DETECT_CHUNKS)}")
    return chunk


def run(cfg, data: np.ndarray, chunk: int, times: list | None = None) -> Detector:
    """The stream's models over the series (in a worker thread); with the rows' times, a duration
    expected_run_length counts their mean interval, as the workers do."""
    det = Detector.for_stream(cfg, chunk)
    try:
        det.update(data, times).flush()
    except (InputError, ModelError, EngineError) as exc:  # (nothing is kept: the reason without cusp.Detector's note)
        reason = getattr(exc, "reason", str(exc))
        # a value the models cannot hold is the series' fault, not the model spec's
        code = "invalid_series" if getattr(exc, "too_large", False) or isinstance(exc, TooLarge) else "invalid_model"
        raise ApiError(422, code, reason) from None
    return det


def answer(det: Detector, times: list | None) -> DetectOut:
    when = (lambda i: times[i]) if times is not None else (lambda i: None)  # noqa: E731
    changes = det.changepoints
    is_cp, conf = [False] * det.n, [0.0] * det.n
    for c in changes:
        is_cp[c.location], conf[c.location] = True, c.confidence
    probs, results, events, frames = det.probabilities, det.results, det.events, det.frames
    return DetectOut(
        rows=det.n, chunk_size=max(r for _, r in det.chunks),
        changepoints=[DetectChange(index=c.location, time=when(c.location), detected_at=c.detected_at, delay=c.delay,
                                   confidence=c.confidence, support=c.support, columns=det.columns_moved(c)) for c in changes],
        withdrawn=[DetectWithdrawn(index=w.location, time=when(w.location), detected_at=w.detected_at,
                                   withdrawn_at=w.withdrawn_at, confidence=w.confidence, support=w.support)
                   for w in det.withdrawn],
        is_change_point=is_cp, confidence_scores=conf,
        models=[DetectModel(name=m, spec=spec, method=results[m][-1].method, log_evidence=results[m][-1].log_evidence,
                            posterior_probability=probs[m],
                            changepoints=[DetectEvent(index=e.location, time=when(e.location), detected_at=e.detected_at,
                                                      delay=e.delay, confidence=e.confidence, log_bayes_factor=e.log_bayes_factor,
                                                      log_prior_odds=e.log_prior_odds, columns=det.columns_moved(e))
                                          for e in events[m]],
                            log_predictive=[r.log_predictive for r in results[m]],
                            annealing_steps=[r.annealing_steps for r in results[m]],
                            warnings=sorted({w for r in results[m] for w in r.warnings}),
                            frame=None if frames[m] is None else ModelFrame(**frames[m]))
                for m, spec in zip(det.names, det.models)],
        chunks=[DetectChunk(start=s, rows=r) for s, r in det.chunks], notes=det.notes)

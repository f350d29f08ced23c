"""Request and response schemas (never the engine's types)."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictInt, Tag, field_validator, model_validator

from service.data import MAX_COLUMNS, MAX_MAGNITUDE
from service.detect.config import DETECT_DEFAULT_CHUNKS


#: names of streams and models as the API takes them (service.store.keys.STREAM_NAME, MODEL_NAME), for the
#: OpenAPI schema only: the routes check them themselves, with messages that say what is wrong
NAME_SCHEMA = {"minLength": 1, "maxLength": 64, "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*$"}
#: a result id as ``since`` takes it ('', '0' or '0-0': from the start; result ids start with a time in ms)
RESULT_ID_PATTERN = "^(0|0-0|0*[1-9][0-9]{12,19}(-[0-9]{1,20})?)?$"


class ModelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: str = Field(..., description="model spec, e.g. 'gmm:components=5'", examples=["gmm:components=5"])
    name: str | None = Field(None, description="name of the model within the stream (default: derived from the spec)",
                             json_schema_extra=NAME_SCHEMA)
    target: str | None = Field(None, description="target column for regression models (default: the last column)")
    prior: float = Field(1.0, gt=0, allow_inf_nan=False, strict=True, description="prior weight of this model among the stream's models")


def _model_kind(v: Any) -> str:
    return "object" if isinstance(v, (dict, ModelIn)) else "spec"


#: a stream's model: a spec string or an object; told apart by type, so a bad object (a prior of 0)
#: gets its own error, not also "Input should be a valid string" from the other shape
ModelItem = Annotated[Annotated[ModelIn, Tag("object")] | Annotated[str, Tag("spec")], Discriminator(_model_kind)]


class SamplerIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    preset: Literal["paper", "accurate"] = "paper"
    overrides: dict[str, Any] = Field(default_factory=dict, description="SGAIS settings, e.g. {'particles': 20}")


class StreamIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., description="stream name: letters, digits, '_', '.', '-' (max 64)", json_schema_extra=NAME_SCHEMA)
    columns: list[str] = Field(..., min_length=1, max_length=MAX_COLUMNS, json_schema_extra={"items": {"type": "string", "minLength": 1},
                                                                                     "uniqueItems": True})
    models: list[ModelItem] | None = Field(
        None, min_length=1, max_length=16,
        description="the stream's models (specs or objects); left out: the default portfolio (README), for one "
                    "column 'level', 'ar', 'trend', 'student-t' and 'seasonal' in the series' own units, whose model average gives the "
                    "stream's answer; for several columns 'gaussian:warmup=5' (a frame per column from its first 5 rows)",
        examples=[["level", "ar", "trend"], [{"spec": "gmm:components=5", "name": "gmm5"}]])
    sampler: SamplerIn = Field(default_factory=SamplerIn)
    seed: int = Field(0, ge=0, le=2**62, strict=True)
    detector: dict[str, Any] = Field(
        default_factory=dict,
        description="change-point detector settings (docs: README), e.g. {'expected_run_length': 5000, "
                    "'threshold': 0.999}; {'enabled': false} turns it off")
    max_backlog: int = Field(10_000, ge=0, le=10**9, strict=True,
                             description="most chunks accepted but not yet processed by the stream's slowest model; a chunk "
                                         "beyond it is refused with 429 and Retry-After, nothing stored (0: no limit)")


class ModelFrame(BaseModel):
    """The reference frame a metric-series model fixed from its first rows: its prior is on
    (y - centre) / scale, so this is the effective, data-dependent prior (README, "Models for
    metric series"); centre and scale are null until the warm-up is done, and one per column for
    ``gaussian`` with a warm-up (the default of a stream of several columns). The scale is fixed;
    for the metric-series models the centre moves at a change the model adopts, to where the old
    regime expected the next row (the new regime's prior is centred there)."""

    warmup_rows: int
    centre: float | list[float] | None
    scale: float | list[float] | None
    periods: dict[str, float] | None = Field(None, description="`seasonal` without a period only: each candidate period "
                                             "(observations) and its posterior probability given the rows so far")


class ModelOut(BaseModel):
    name: str = Field(description="the model's name in this stream: results' 'model' and ?model=; as given in the create "
                                  "request, else derived from the spec (':' and '=' dropped, e.g. 'gmm_components2'); "
                                  "?model= takes the spec too")
    spec: str = Field(description="the model's spec as given, e.g. 'gmm:components=2' (what cusp replay calls the model)")
    method: Literal["exact", "sgais"] | None = Field(None, description="exact (closed form, conjugate models) or sgais")
    target: str | None
    prior: float = Field(1.0, description="the model's prior weight, as given at create (relative: posterior_probability "
                                          "weighs each model's evidence by it)")
    observations: int
    chunks: int
    last_seq: int
    log_evidence: float
    log_evidence_per_observation: float | None = Field(
        description="log_evidence / observations, every observation counted (a model's warm-up rows add nothing to "
                    "the log-evidence but count here; null before the first)")
    posterior_probability: float | None
    probability_observations: int | None = Field(
        None, description="the observations posterior_probability compares the models on: all they have seen when they have "
                          "seen the same; while one is behind, the last chunk every model applied (the stream's answer's)")
    lag_chunks: int
    error: str | None
    frame: ModelFrame | None = Field(None, description="metric-series models (level, ar, trend, seasonal, local-trend, local-seasonal, "
                                                       "negbin, student-t; one centre and scale per column for student-t of several "
                                                       "columns) and gaussian or gmm with a warmup (one per column): the frame fixed "
                                                       "from their warm-up, i.e. their effective prior (the centre moves "
                                                       "to the old regime's expected level at a change the model adopts)")


class StreamOut(BaseModel):
    name: str
    columns: list[str]
    sampler: dict[str, Any] = Field(description="the sampler settings as given: preset and overrides")
    detector: dict[str, Any] = Field(default_factory=dict, description="the detector settings as given")
    sampler_settings: dict[str, Any] | None = Field(
        None, description="the SGAIS settings in effect: the preset with the overrides applied, every setting (README); "
                          "particles and lr null: each model's own")
    detector_settings: dict[str, Any] | None = Field(
        None, description="the detector settings in effect: those given, the rest at their defaults (README)")
    max_backlog: int = Field(0, description="chunks the slowest model may have to process before ingest answers 429 (0: no limit)")
    seed: int
    last_seq: int
    next_seq: int
    dead_letters: int
    models: list[ModelOut]
    rows: int = Field(0, description="rows accepted")
    first_time: str | None = Field(None, description="the first row's time (RFC 3339, UTC; null before the first chunk)")
    last_time: str | None = Field(None, description="the last row's time: a chunk's own times must start after it")
    notes: list[str] = Field(default_factory=list, description="what the stream's answer cannot say by itself: a column "
                             "that looks like sparse counts (whole numbers >= 0, a quarter or more of them 0, over 20 rows "
                             "or more) where no count model runs or student-t runs beside one, as POST /v1/detect says")


TIMES_DOC = ("the rows' times, one per row, strictly increasing and after the stream's last time: RFC 3339 strings with "
             "an offset or Z, dates YYYY-MM-DD (midnight UTC) or epoch seconds. Without them the rows get the chunk's "
             "arrival time")


class ChunkRows(BaseModel):
    """A chunk as rows; documents the JSON body (parsed by ``service.api.chunks``, not by pydantic)."""

    model_config = ConfigDict(extra="forbid", title="ChunkRows")
    seq: int = Field(..., ge=0, le=2**53, description="per-stream sequence number: 0, then up by 1")
    rows: list[Annotated[list[float], Field(min_length=1, max_length=MAX_COLUMNS)]] = Field(
        ..., min_length=1, description="rows of finite numbers, one value per column")
    time: list[str | float] | None = Field(None, description=TIMES_DOC, examples=[["2026-11-26T08:00:00Z", "2026-11-26T08:00:01Z"]])


class ChunkColumns(BaseModel):
    """A chunk as columns; documents the JSON body (parsed by ``service.api.chunks``, not by pydantic)."""

    model_config = ConfigDict(extra="forbid", title="ChunkColumns")
    seq: int = Field(..., ge=0, le=2**53, description="per-stream sequence number: 0, then up by 1")
    columns: dict[str, list[float] | list[float | str]] = Field(
        ..., description="column name -> values (finite numbers), all of one length; may hold the rows' times as 'time' "
                         "(RFC 3339 strings or epoch seconds) instead of the field time")
    time: list[str | float] | None = Field(None, description=TIMES_DOC)


class ChunkAck(BaseModel):
    seq: int
    status: Literal["accepted", "duplicate"]
    id: str = Field(description="the chunk's id, 'chunk-<seq>' (not a result id: since= refuses it)",
                    examples=["chunk-17"], json_schema_extra={"pattern": "^chunk-[0-9]+$"})
    rows: int | None = None


class Problem(BaseModel):
    """Every error answer (RFC 9457 problem details, ``application/problem+json``): ``code`` is
    stable and machine-readable (GET /v1/errors lists them), ``detail`` says what was wrong in
    words; request validation failures also list each field in ``errors``."""

    type: str = Field(description="URI reference of the problem type: /v1/errors#<code>", examples=["/v1/errors#seq_gap"])
    title: str = Field(description="short summary of the problem type (the same for every error of a code)")
    status: int = Field(description="the HTTP status", examples=[409])
    detail: str = Field(description="what went wrong in this request", examples=["seq 7 is out of order: expected seq 5"])
    instance: str | None = Field(None, description="the request's path")
    code: str = Field(description="stable error code (GET /v1/errors)", examples=["seq_gap"])
    errors: list[dict[str, Any]] | None = Field(None, description="request validation failures: loc, msg and type of each")


class ErrorCode(BaseModel):
    code: str
    status: int
    title: str


class ErrorCodes(BaseModel):
    errors: list[ErrorCode]


class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    status: Literal["ready", "unavailable"]
    redis: str
    workers: str | None = Field(None, description="under cusp serve with worker processes: why none is counted as alive")


class StreamList(BaseModel):
    streams: list[str]


class ResultEntry(BaseModel):
    """A chunk's result (kind "result"): the entry's id, the model, the stream's seq and chunk
    index, then the engine's numbers for the chunk, listed here so that the API's schema does
    not depend on the engine's types. Every result has them today; a field the engine adds
    later passes through, one it drops is left out (never sent as null): only id, model and
    kind are required, so an entry of another shape is answered as stored, never with a 500."""

    model_config = ConfigDict(extra="allow")
    id: str = Field(description="result id; pass as since= to resume after it")
    model: str
    kind: Literal["result"]
    seq: int = None
    chunk: int = Field(None, description="the chunk's index in the stream (0-based)")
    n: int = Field(None, description="observations seen after this chunk")
    rows: int = None
    log_evidence: float = Field(None, description="running log p(y_1..n | model), nats")
    log_predictive: float = Field(None, description="log p(chunk | history, model), nats")
    annealing_steps: int = Field(None, description="intermediate distributions the chunk needed (0: exact method)")
    ess_before: float | None = Field(None, description="ESS of the incoming weights (null: exact method, no particles)")
    ess_after: float | None = Field(None, description="ESS of the final weights (null: exact method)")
    ess_min: float | None = Field(None, description="lowest ESS after a reweighting (null: exact method)")
    resamples: int = None
    capped: bool = Field(None, description="the step cap forced the last temperature increment")
    seconds: float = None
    log_predictive_per_observation: float | None = Field(
        None, description="log_predictive per scored row (null: the chunk was all a model's warm-up)")
    log_evidence_per_observation: float = Field(
        None, description="the running log_evidence / n, every observation seen counted: a model's warm-up rows, "
                          "conditioned on and not scored, add nothing to the log-evidence but count in n (per scored row: "
                          "log_predictive_per_observation, chunk by chunk)")
    method: Literal["exact", "sgais"] = Field(None, description="exact (closed form) or sgais")
    warnings: list[str] = Field(None, description="why the result may be unreliable (README, Reliability): "
                                                  "'capped', 'reference_mismatch', 'stuck_mode', 'prior_conflict', 'evidence_restated', "
                                                  "'quadrature_edge'; empty when nothing is wrong")
    reliable: bool = Field(None, description="no warnings")
    reference_log_evidence: float | None = Field(
        None, description="the exact log-evidence beside an SGAIS estimate (a conjugate model run with sampler=sgais): "
                          "after a change the model adopted, the exact value of the rows since its restart plus the "
                          "log-evidence before it, as log_evidence counts them")
    conditioned: int = Field(None, description="rows of the chunk a model conditioned on without scoring them (its warm-up)")
    restated: float = Field(None, description="nats the log-evidence moved at this chunk beside its log predictive: a fresh "
                                              "estimate of the evidence so far was averaged in (a mixture's mode check); "
                                              "the earlier log-evidence was low by about this much (0: none)")
    outliers: list[dict] = Field(None, description="readings a closed-form model took out as outliers at this chunk "
                                                   "(README, Outliers): each its 'location' (observation index) and "
                                                   "'log_bayes_factor' (of the readings taken out together: the "
                                                   "same on each); the log-evidence moved by it, once, beside the "
                                                   "log predictive")
    time_start: str | None = Field(None, description="the time of the chunk's first row (RFC 3339, UTC): as sent, or its arrival time")
    time_end: str | None = Field(None, description="the time of the chunk's last row (RFC 3339, UTC)")


class ColumnMove(BaseModel):
    """How one column moved at a change point (streams of several columns): its mean and standard
    deviation over the detector's rows of the regime before the change (those it kept since the
    regime began, after its warm-up) and over the rows from the change to its report
    (service.detect.moves). A description of the data, not of the model; rough where few rows
    came after the change (rows_after on the entry)."""

    column: str | int = Field(description="the column's name (its index where the columns have none)")
    shift: float | None = Field(description="(mean_after - mean_before) / sd_before: how far the column moved, in its "
                                            "spread before the change; 0 for a constant column that stayed, null for one "
                                            "that moved from a constant (or from a single row)")
    scale: float | None = Field(description="sd_after / sd_before (null without both)")
    mean_before: float
    mean_after: float
    sd_before: float | None = Field(description="sample standard deviation (null for a single row)")
    sd_after: float | None
    rows_before: int = Field(description="the rows before the change these figures are over")
    rows_after: int = Field(description="the rows from the change to its report")


COLUMNS_DOC = ("with several columns, how each moved, in the stream's column order: its mean and standard deviation "
               "before and after the change over the rows the detector held (README, 'Which columns moved'); null with "
               "one column")


class ChangepointEntry(BaseModel):
    """A change point one model reported (kind "changepoint"). As for results, only id, model
    and kind are always there; the fields below are what the detector reports today."""

    model_config = ConfigDict(extra="allow")
    id: str
    model: str
    kind: Literal["changepoint"]
    seq: int = Field(None, description="the chunk that holds location (row: its index in that chunk); a stream "
                                       "change point's seq is the chunk after which it was found")
    location: int = Field(None, description="index (0-based, over the whole stream) of the first observation of the new regime")
    chunk: int = None
    detected_at: int = Field(None, description="observations seen when it was reported")
    delay: int = None
    confidence: float = None
    log_bayes_factor: float = None
    log_prior_odds: float = None
    adapted: bool = Field(None, description="whether the model restarted there")
    row: int = Field(None, description="the row of chunk seq at location (0-based)")
    columns: list[ColumnMove] | None = Field(None, description=COLUMNS_DOC)
    location_time: str | None = Field(None, description="the time of the observation at location (RFC 3339, UTC); null when unknown")
    detected_time: str | None = Field(None, description="the time of the last observation when it was reported (RFC 3339, UTC)")
    delay_seconds: float | None = Field(None, description="detected_time - location_time, in seconds. detected_time is the "
                                                              "last observation's time (index detected_at - 1), so with rows a "
                                                              "time unit apart it is delay - 1 units")


class StreamChangepointEntry(BaseModel):
    """A change point of the stream (kind "stream_changepoint", model "*"): its models' events
    weighted by their posterior probabilities (service.detect.StreamAnswer); with one model, that
    model's events. The stream's primary answer: it is what cusp_stream_changepoints_total counts,
    what the alert rules fire on and what the live page draws."""

    model_config = ConfigDict(extra="allow")
    id: str
    model: Literal["*"]
    kind: Literal["stream_changepoint"]
    seq: int = Field(None, description="the chunk after which it was found (a model's change point gives the chunk "
                                       "that holds location instead)")
    location: int = Field(None, description="index (0-based, over the whole stream) of the first observation of the new regime")
    detected_at: int = Field(None, description="observations seen when it was found")
    delay: int = Field(None, description="detected_at - location: observations seen after location when it was found "
                                         "(a change found late, after later ones, has a large delay; absent on entries "
                                         "stored before 2026-12-07)")
    confidence: float = Field(None, description="a lower bound on the posterior probability of a change within the "
                                                "stream's resolution of location")
    support: dict[str, tuple[float, float]] = Field(None, description="model -> [posterior probability (over no change and this change), event confidence]")
    columns: list[ColumnMove] | None = Field(None, description=COLUMNS_DOC + " (from the event of the model that placed it)")
    location_time: str | None = Field(None, description="the time of the observation at location (RFC 3339, UTC); null when unknown")
    detected_time: str | None = Field(None, description="the time of the last observation when it was reported (RFC 3339, UTC)")
    delay_seconds: float | None = Field(None, description="detected_time - location_time, in seconds. detected_time is the "
                                                              "last observation's time (index detected_at - 1), so with rows a "
                                                              "time unit apart it is delay - 1 units")


class StreamWithdrawnEntry(BaseModel):
    """A change point of the stream withdrawn (kind "stream_changepoint_withdrawn", model "*"):
    judged again a horizon (20 of the stream's resolutions) after it was found, its probability was
    below 0.5 (README, "Withdrawn change points"). Its "stream_changepoint" entry stays where it was;
    GET /changepoints lists it under "withdrawn" instead of "stream"."""

    model_config = ConfigDict(extra="allow")
    id: str
    model: Literal["*"]
    kind: Literal["stream_changepoint_withdrawn"]
    seq: int = Field(None, description="the chunk after which it was withdrawn")
    location: int = Field(None, description="the withdrawn change's location (as its stream_changepoint entry had it)")
    detected_at: int = Field(None, description="observations seen when it was found")
    withdrawn_at: int = Field(None, description="observations seen when it was withdrawn")
    confidence: float = Field(None, description="its probability when withdrawn (below 0.5)")
    support: dict[str, tuple[float, float]] = Field(None, description="model -> [posterior probability, probability of this change], when withdrawn")
    location_time: str | None = Field(None, description="the time of the observation at location (RFC 3339, UTC); null when unknown")
    withdrawn_time: str | None = Field(None, description="the time of the last observation when it was withdrawn (RFC 3339, UTC)")


class DeadLetterEntry(BaseModel):
    """A chunk a model could not process (kind "dead_letter"): its seq and the error."""

    model_config = ConfigDict(extra="allow")
    id: str
    model: str
    kind: Literal["dead_letter"]
    seq: int = None
    error: str = None


KNOWN_KINDS = ("result", "changepoint", "stream_changepoint", "stream_changepoint_withdrawn", "dead_letter")


class OtherEntry(BaseModel):
    """An entry of a kind this version does not know, answered as stored."""

    model_config = ConfigDict(extra="allow")
    id: str
    model: str
    kind: str = Field(json_schema_extra={"not": {"enum": list(KNOWN_KINDS)}})


def _entry_kind(v: Any) -> str:
    kind = v.get("kind") if isinstance(v, dict) else getattr(v, "kind", None)
    return kind if kind in KNOWN_KINDS else "other"


Entry = Annotated[Annotated[ResultEntry, Tag("result")] | Annotated[ChangepointEntry, Tag("changepoint")]
                  | Annotated[StreamChangepointEntry, Tag("stream_changepoint")]
                  | Annotated[StreamWithdrawnEntry, Tag("stream_changepoint_withdrawn")] | Annotated[DeadLetterEntry, Tag("dead_letter")]
                  | Annotated[OtherEntry, Tag("other")], Discriminator(_entry_kind)]


class ChangepointList(BaseModel):
    changepoints: list[ChangepointEntry] = Field(description="each model's change points, in the order they were reported")
    stream: list[StreamChangepointEntry] = Field(
        description="the stream's change points, in the order they were found (not always by location: one can be "
                    "found after a later one, its delay then large; cusp.Detector.changepoints sorts by location): "
                    "each model's events weighted by its "
                    "posterior probability (with one model: its events). Kept in their own store, apart from the "
                    "results: trimming the result stream does not lose them (CUSP_CHANGEPOINT_MAXLEN caps it). Those "
                    "withdrawn since are under withdrawn, not here")
    withdrawn: list[StreamWithdrawnEntry] = Field(
        default_factory=list,
        description="the stream's change points withdrawn, in the order withdrawn: each judged again a horizon after it "
                    "was found, with a probability below 0.5 then")


class DeadLetter(BaseModel):
    id: str
    model: str
    seq: int = Field(description="the chunk's seq (an integer, as everywhere else; a string until 2026-11-27)")
    error: str


class DeadLetters(BaseModel):
    dead_letters: list[DeadLetter]


EntryKind = Literal[KNOWN_KINDS]  # the kinds ?kind= filters on


class EvidencePage(BaseModel):
    results: list[Entry]
    next: str | None = Field(None, description="pass as since= to get the following page (a result id)")
    has_more: bool = Field(False, description="whether entries matching the filter follow next (false: none now)")


# --- one-shot detection (POST /v1/detect) ---------------------------------------------------------
#: the most rows (observations) one POST /v1/detect may send (413 beyond)
MAX_DETECT_ROWS = 100_000
#: the most chunks one POST /v1/detect may ask for (rows / chunk_size; 422 beyond)
MAX_DETECT_CHUNKS = 2_000

FiniteFloat = Annotated[float, Field(allow_inf_nan=False, strict=True)]  # strict: true and "1" are not numbers


class SeriesPoint(BaseModel):
    """One point in the shape of Azure's change-point API: a timestamp and a value."""

    model_config = ConfigDict(extra="forbid")
    timestamp: str | StrictInt | FiniteFloat = Field(..., description="RFC 3339 time or epoch seconds")
    value: FiniteFloat | list[FiniteFloat] = Field(..., description="the value (or one row of values)")


#: Azure change-point fields ``POST /v1/detect`` refuses, each with cusp's way to say it
AZURE_FIELDS = {
    "period": "name a seasonal model instead, e.g. \"models\": [\"level\", \"seasonal:period=7\"] (without one, "
              "the default portfolio's seasonal model weighs common periods itself)",
    "threshold": "give the detector's threshold instead, \"detector\": {\"threshold\": 0.99} (the posterior "
                 "probability a change needs)",
    "stableTrendWindow": "cusp has no such window: a change is placed at its row, and the detector's training "
                         "sample and expected_run_length set how soon changes may follow each other",
}


class DetectIn(BaseModel):
    """A whole series to detect change points in; nothing is stored. Give ``values`` (with
    optional ``times``) or ``series``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"values": [10.1, 9.8, 10.3, 10.0, 9.9, 10.2, 10.1, 9.7, 10.0, 10.2, 15.1, 14.8, 15.3, 15.0, 14.9, 15.2, 15.1, 14.7,
                    15.0, 15.2],
         "chunk_size": 1},
        {"series": [{"timestamp": "2024-05-01T00:00:00Z", "value": 3.2}, {"timestamp": "2024-05-01T00:01:00Z", "value": 3.4}],
         "models": ["level", "trend"]},
    ]})
    values: list[FiniteFloat] | list[list[FiniteFloat]] | None = Field(
        None, description=f"the series: numbers (one column) or rows of numbers (one value per column); at most "
                          f"{MAX_DETECT_ROWS:,} rows (413 beyond)")
    times: list[str | StrictInt | FiniteFloat] | None = Field(
        None, description="one time per row, strictly increasing: RFC 3339 strings (with an offset or Z) or epoch "
                          "seconds; change points then carry the time of their first row")
    series: list[SeriesPoint] | None = Field(
        None, description="instead of values and times: [{timestamp, value}], the shape of Azure's change-point API")
    columns: list[str] | None = Field(None, min_length=1, max_length=MAX_COLUMNS,
                                      description="column names (default x0, x1, ...); a model's 'target' names one")
    models: list[ModelItem] | None = Field(
        None, min_length=1, max_length=16,
        description="model specs, as for a stream (default: the default portfolio for the data's width: level, ar, "
                    "trend, student-t and seasonal for one column, gaussian otherwise); plug-ins too")
    chunk_size: int | None = Field(
        None, ge=1, strict=True, description=f"rows per chunk (default: ceil(rows / {DETECT_DEFAULT_CHUNKS})); at most "
                                f"{MAX_DETECT_CHUNKS:,} chunks and CUSP_MAX_CHUNK_ROWS rows per chunk")
    seed: int = Field(0, ge=0, le=2**62, strict=True)
    sampler: SamplerIn = Field(default_factory=SamplerIn)
    detector: dict[str, Any] = Field(default_factory=dict, description="change-point detector settings, as for a stream")
    # Azure's change-point body: its required granularity (and customInterval) are taken and not
    # needed (cusp reads the spacing from the timestamps); its tuning fields are refused, naming
    # cusp's own (``_azure``)
    granularity: Literal["yearly", "monthly", "weekly", "daily", "hourly", "minutely", "secondly", "microsecond",
                         "none"] | None = Field(None, description="accepted for Azure-shaped bodies and not needed: the "
                                                                  "spacing comes from the timestamps")
    customInterval: int | None = Field(None, ge=1, strict=True, description="accepted with 'granularity', not needed")

    @model_validator(mode="before")
    @classmethod
    def _azure(cls, v: Any) -> Any:
        """Azure's tuning fields, refused with what to send instead (not silently ignored: each
        would change the answer there)."""
        if isinstance(v, dict):
            for key, instead in AZURE_FIELDS.items():
                if key in v:
                    raise ValueError(f"{key!r} (from Azure's change-point API) is not taken here: {instead}")
        return v

    @field_validator("values", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        """A NaN or infinity named by its place (the union of the two shapes otherwise reports both
        shapes' errors, one of them about the other shape)."""
        if isinstance(v, list):
            rows = [isinstance(x, list) for x in v]
            if any(rows) and not all(rows):  # numbers and rows mixed: one message, not both shapes' errors
                i = rows.index(not rows[0])
                what = "a row" if rows[i] else "a number"
                raise ValueError(f"values[{i}] is {what}, values[0] {'a row' if rows[0] else 'a number'}: give numbers "
                                 "(one column) or rows of numbers, not both")
            for i, x in enumerate(v):
                for j, y in enumerate(x) if isinstance(x, list) else ((None, x),):
                    place = f"values[{i}]" if j is None else f"values[{i}][{j}]"
                    if isinstance(y, bool) or not isinstance(y, (int, float)):  # one message, not both shapes' errors
                        shown = "null" if y is None else "true" if y is True else "false" if y is False else repr(str(y)[:40])
                        raise ValueError(f"{place} is {shown}: values must be numbers (a list of numbers, or a "
                                         "list of rows of numbers)")
                    if isinstance(y, float) and not math.isfinite(y):
                        raise ValueError(f"{place} is {y}: values must be finite numbers")
                    if abs(y) > MAX_MAGNITUDE:  # (an int beyond float64 has no float: shown by its digits)
                        shown = str(y) if len(str(y)) <= 24 else f"{str(y)[:8]}... ({len(str(y))} digits)"
                        raise ValueError(f"{place} is {shown}: values must be within +-{MAX_MAGNITUDE:g}")
        return v


class DetectEvent(BaseModel):
    """A change point one model reported."""

    index: int = Field(description="index (0-based) of the first row of the new regime")
    time: str | int | float | None = Field(None, description="that row's time, as given (null without times)")
    detected_at: int = Field(description="rows seen when it was reported")
    delay: int = Field(description="detected_at - index: rows seen after index when it was reported (as a stream's "
                       "change points and cusp replay say)")
    confidence: float = Field(description="posterior probability of the change")
    log_bayes_factor: float
    log_prior_odds: float
    columns: list[ColumnMove] | None = Field(None, description=COLUMNS_DOC)


class DetectChange(BaseModel):
    """A change point of the series: the models' events weighted by their posterior probabilities
    (with one model, its own events)."""

    index: int = Field(description="index (0-based) of the first row of the new regime")
    time: str | int | float | None = Field(None, description="that row's time, as given (null without times)")
    detected_at: int = Field(description="rows seen when the evidence for it first reached the threshold")
    delay: int = Field(description="detected_at - index: rows seen after index when it was found (as a stream's "
                       "change points and cusp replay say; a new user missed it here)")
    confidence: float = Field(description="a lower bound on the posterior probability of a change within one chunk of index")
    support: dict[str, tuple[float, float]] = Field(description="model -> [posterior probability (over no change and this change), event confidence]")
    columns: list[ColumnMove] | None = Field(None, description=COLUMNS_DOC + " (from the event of the model that placed it)")


class DetectWithdrawn(BaseModel):
    """A change point the evidence later rejected: found, then judged again a horizon (20 of the
    stream's resolutions) after it was found, with a probability below 0.5 then (README, "Withdrawn
    change points")."""

    index: int = Field(description="index (0-based) of the row where it was placed")
    time: str | int | float | None = Field(None, description="that row's time, as given (null without times)")
    detected_at: int = Field(description="rows seen when it was found")
    withdrawn_at: int = Field(description="rows seen when it was withdrawn")
    confidence: float = Field(description="its probability when withdrawn (below 0.5)")
    support: dict[str, tuple[float, float]] = Field(description="model -> [posterior probability, probability of this change], when withdrawn")


class DetectModel(BaseModel):
    name: str
    spec: str
    method: str = Field(description="exact (closed form) or sgais")
    log_evidence: float = Field(description="log p(series | model), nats")
    posterior_probability: float = Field(description="with the models' priors")
    changepoints: list[DetectEvent]
    log_predictive: list[float] = Field(description="per chunk: log p(chunk | earlier rows, model), nats")
    annealing_steps: list[int] = Field(description="per chunk (0: exact method)")
    warnings: list[str] = Field(description="reliability warnings any chunk had (README, Reliability)")
    frame: ModelFrame | None = Field(None, description="a metric-series model's frame, fixed from its first rows: its "
                                     "prior's effective units (null for models whose prior is in the data's units)")


class DetectChunk(BaseModel):
    start: int = Field(description="index of the chunk's first row")
    rows: int


class DetectOut(BaseModel):
    rows: int
    chunk_size: int
    changepoints: list[DetectChange] = Field(description="the series' change points, by index")
    withdrawn: list[DetectWithdrawn] = Field(default_factory=list, description="change points found and later withdrawn "
                                             "(not in changepoints), in the order withdrawn")
    is_change_point: list[bool] = Field(description="per row: does a change point start there (Azure's shape)")
    confidence_scores: list[float] = Field(description="per row: the change point's confidence there, else 0")
    models: list[DetectModel]
    chunks: list[DetectChunk]
    notes: list[str] = Field(default_factory=list, description="what the answer cannot say by itself: every row in one "
                             "chunk or in the models' warm-up, too few scored after it, a candidate that stayed below "
                             "the threshold, a column that looks like sparse counts")

"""Prometheus metrics: every metric cusp exports is defined here (prefix ``cusp_``, base units).

Labels are ``stream`` and ``model`` where they apply; their cardinality is bounded by
configuration (streams and models are created explicitly, ``CUSP_MAX_STREAMS``). The API
process and every ``cusp worker`` process each expose these on their own ``/metrics``;
series that a process does not touch are simply absent from its exposition.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)
SM = ("stream", "model")

LOG_EVIDENCE = Gauge("cusp_log_evidence_nats", "Running log-evidence log p(y_1..n | model), nats.", SM, registry=REGISTRY)
LOG_EVIDENCE_PER_OBS = Gauge(
    "cusp_log_evidence_per_observation_nats", "Running log-evidence divided by observations seen (warm-up rows, not scored, counted), nats.", SM, registry=REGISTRY
)
CHUNK_LOG_PREDICTIVE = Gauge(
    "cusp_chunk_log_predictive_nats_per_observation",
    "Last chunk's log predictive log p(chunk | history) divided by its rows, nats.",
    SM,
    registry=REGISTRY,
)
ANNEALING_STEPS = Histogram(
    "cusp_annealing_steps",
    "Annealing steps (intermediate distributions) a chunk needed.",
    SM,
    buckets=(1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 1000),
    registry=REGISTRY,
)
ANNEALING_STEPS_LAST = Gauge("cusp_annealing_steps_last", "Annealing steps the last chunk needed.", SM, registry=REGISTRY)
ESS = Gauge("cusp_effective_sample_size", "Effective sample size of the particle weights after the last chunk.", SM, registry=REGISTRY)
RESULT_RELIABLE = Gauge(
    "cusp_result_reliable",
    "1 if the model's last result carried no reliability warning, else 0 (see cusp_unreliable_chunks_total).",
    SM,
    registry=REGISTRY,
)
UNRELIABLE_CHUNKS = Counter(
    "cusp_unreliable_chunks",
    "Chunks whose result carried a reliability warning, by warning (README: Reliability).",
    ("stream", "model", "warning"),
    registry=REGISTRY,
)
RESAMPLES = Counter("cusp_resamples", "Particle resampling events.", SM, registry=REGISTRY)
CHUNKS = Counter("cusp_chunks_processed", "Chunks applied to a model.", SM, registry=REGISTRY)
OBSERVATIONS = Counter("cusp_observations_processed", "Observations applied to a model.", SM, registry=REGISTRY)
OBSERVATIONS_SEEN = Gauge("cusp_observations_seen", "Observations a model has seen in total.", SM, registry=REGISTRY)
CHANGEPOINTS = Counter("cusp_changepoints", "Change points detected.", SM, registry=REGISTRY)
OUTLIERS = Counter(
    "cusp_outliers",
    "Observations the detector took for outliers: scored in the log-evidence, not learned from (the model goes on "
    "without them; exact models that adapt).", SM, registry=REGISTRY
)
CHANGEPOINT_CONFIDENCE = Gauge(
    "cusp_changepoint_last_confidence", "Confidence (posterior probability) of the last detected change point.", SM, registry=REGISTRY
)
CHANGEPOINT_LAST_OBSERVATION = Gauge(
    "cusp_changepoint_last_observation", "Observation index of the last detected change point.", SM, registry=REGISTRY
)
STREAM_CHANGEPOINTS = Counter(
    "cusp_stream_changepoints",
    "The stream's change points: its models' events weighted by their posterior probabilities (with one model, its "
    "events). The stream's primary answer; the change-point alert fires on it.",
    ("stream",),
    registry=REGISTRY,
)
STREAM_CHANGEPOINTS_WITHDRAWN = Counter(
    "cusp_stream_changepoints_withdrawn",
    "The stream's change points withdrawn: judged again a horizon (20 resolutions) after each was found, with a "
    "probability below 0.5 then (cusp_stream_changepoints_total counted each when it was found).",
    ("stream",),
    registry=REGISTRY,
)
STREAM_CHANGEPOINT_CONFIDENCE = Gauge(
    "cusp_stream_changepoint_last_confidence", "Confidence (a lower bound on its posterior probability) of the stream's last change point "
    "standing (the API's, from Redis at each scrape).",
    ("stream",), registry=REGISTRY,
)
STREAM_CHANGEPOINT_LAST_OBSERVATION = Gauge(
    "cusp_stream_changepoint_last_observation", "Observation index of the stream's last change point standing (the API's, from Redis "
    "at each scrape).", ("stream",), registry=REGISTRY
)
MODEL_POSTERIOR = Gauge(
    "cusp_model_posterior_probability", "Posterior probability of the model among its stream's models.", SM, registry=REGISTRY
)
CHUNK_SECONDS = Histogram(
    "cusp_chunk_processing_seconds",
    "Wall time to process one chunk (engine, detector and the atomic apply).",
    SM,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
INGEST_LAG = Gauge("cusp_ingest_lag_chunks", "Chunks ingested but not yet applied to the model.", SM, registry=REGISTRY)
REDELIVERIES = Counter("cusp_redeliveries", "Chunks processed again after a failed attempt or a lost lease.", SM, registry=REGISTRY)
FENCED_WRITES = Counter("cusp_fenced_writes", "Writes refused because the worker's lease had been taken over.", SM, registry=REGISTRY)
DEAD_LETTERS = Counter("cusp_dead_letters", "Chunks parked in the dead-letter stream after repeated failures.", SM, registry=REGISTRY)
WORKER_LEASES = Gauge("cusp_worker_leases", "Stream x model leases this process holds.", registry=REGISTRY)
WORKER_WARM_BYTES = Gauge("cusp_worker_warm_bytes", "Memory of the pairs this process keeps warm (states, reservoirs, detector data), "
                          "bytes; CUSP_WORKER_WARM_BYTES caps it between chunks.", registry=REGISTRY)
WORKER_RELOADS = Counter("cusp_worker_reloads", "Pairs reloaded from Redis after they were let cool to keep within "
                         "CUSP_WORKER_WARM_BYTES.", registry=REGISTRY)
WORKERS = Gauge("cusp_workers", "Worker loops running in this process.", registry=REGISTRY)
INGESTED_CHUNKS = Counter("cusp_ingested_chunks", "Chunks accepted (202) by the API.", ("stream",), registry=REGISTRY)
INGESTED_ROWS = Counter("cusp_ingested_observations", "Observations accepted by the API.", ("stream",), registry=REGISTRY)
REJECTED = Counter("cusp_ingest_rejected", "Ingest requests rejected, by reason.", ("reason",), registry=REGISTRY)
HTTP_REQUESTS = Counter("cusp_http_requests", "HTTP requests answered, by route template and status class.", ("route", "status"), registry=REGISTRY)
REDIS_UP = Gauge("cusp_redis_up", "1 if the last Redis round trip of this process succeeded, else 0.", registry=REGISTRY)
STREAMS = Gauge("cusp_streams", "Streams that exist.", registry=REGISTRY)
SPARSE_COUNTS = Gauge(
    "cusp_stream_sparse_counts",
    "1 where a column of the stream looks like sparse counts (whole numbers >= 0, a quarter or more 0) and no count "
    "model runs or student-t runs beside one (GET /v1/streams/{s} notes it), else 0.", ("stream",), registry=REGISTRY,
)


def forget(stream: str, model: str | None = None) -> int:
    """Remove this process's series of ``stream`` (and ``model``; None: the series labelled by the
    stream alone) from every labelled metric; returns how many were removed. A worker calls it for
    pairs it no longer holds, so its exposition follows its leases, not its history."""
    return _remove(stream, model, lambda collector, names: (model is None) != ("model" in names))


#: the API's own series of a stream (the API forgets them when it deletes the stream); a worker's
#: ``forget_stream`` leaves them, should a worker run in the API's process (tests do)
API_SERIES = (INGESTED_CHUNKS, INGESTED_ROWS, SPARSE_COUNTS, STREAM_CHANGEPOINT_CONFIDENCE, STREAM_CHANGEPOINT_LAST_OBSERVATION)


def forget_stream(stream: str) -> int:
    """Remove every worker series of ``stream`` (of each of its models and its own) from this
    process's metrics; returns how many were removed."""
    return _remove(stream, None, lambda collector, names: not any(collector is c for c in API_SERIES))


def _remove(stream: str, model: str | None, chosen) -> int:
    """Remove the series labelled ``stream`` (and ``model``, unless None) of the labelled metrics
    ``chosen(collector, label names)`` picks; returns how many were removed."""
    removed = 0
    for collector in list(REGISTRY._collector_to_names):  # noqa: SLF001 - stable in prometheus_client
        names = getattr(collector, "_labelnames", ())
        if "stream" not in names or not chosen(collector, names):
            continue
        si, mi = names.index("stream"), names.index("model") if model is not None else None
        for labels in list(getattr(collector, "_metrics", {})):  # noqa: SLF001
            if labels[si] == stream and (mi is None or labels[mi] == model):
                collector.remove(*labels)
                removed += 1
    return removed


def keep_streams(collectors, streams) -> int:
    """Remove the series of ``collectors`` whose stream is not one of ``streams``; returns how many.
    The API's scrape sets these gauges for every stream it reads; a stream deleted through another
    API replica was forgotten only there, and its series stayed here (a review)."""
    keep, removed = set(streams), 0
    for collector in collectors:
        si = collector._labelnames.index("stream")  # noqa: SLF001
        for labels in list(collector._metrics):  # noqa: SLF001
            if labels[si] not in keep:
                collector.remove(*labels)
                removed += 1
    return removed


def metric_names() -> set[str]:
    """Every sample name this module can expose (with _total/_bucket/_sum/_count suffixes)."""
    names: set[str] = set()
    for collector in list(REGISTRY._collector_to_names):  # noqa: SLF001 - stable in prometheus_client
        names.update(REGISTRY._collector_to_names[collector])  # noqa: SLF001
    return names


# --- one exposition for `cusp serve`: the API's own metrics plus its worker processes' ----------
# Unlabelled gauges that describe a process are combined across processes like this; every other
# gauge series keeps the first value seen (the API's own first: it computes lag and posterior
# probabilities from Redis at scrape time), and counter and histogram samples add up.
_COMBINE = {"cusp_workers": sum, "cusp_worker_leases": sum, "cusp_redis_up": min}


class _Families:
    def __init__(self, families: list):
        self._families = families

    def collect(self):
        return self._families


def merged_exposition(texts: list[str]) -> bytes:
    """This process's REGISTRY merged with other processes' expositions (Prometheus text format),
    as one valid exposition: one family per name, one sample per name and label set.

    Counters and histograms keep their ``_created`` samples (the earliest of the processes'): the
    change-point alerts count a counter born within their window by its ``_created`` time, since
    increase() cannot see a series whose first sample is already 1 (a change counted before
    Prometheus's first scrape). The text parser reads a worker's ``X_created`` lines back as a
    gauge family of their own; they are folded into family X again here. (prometheus_client's
    multiprocess mode, the usual alternative to this merge, exports no ``_created`` at all.)"""
    from prometheus_client import generate_latest
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple, list[Sample]]] = {}
    sources = [list(REGISTRY.collect())]  # every family cusp defines, with its type, even without samples
    timed = {f.name for f in sources[0] if f.type in ("counter", "histogram", "summary")}
    for t in texts:
        try:
            sources.append(list(text_string_to_metric_families(t)))
        except ValueError:  # a worker cut off mid-answer: its series are missing from this scrape, no 500
            continue
    for source in sources:
        for fam in source:
            name = fam.name
            if name.endswith("_created") and name[: -len("_created")] in timed:
                name = name[: -len("_created")]
            elif name.endswith("_created"):
                continue  # not one of ours
            if name not in families:
                families[name] = Metric(name, fam.documentation, fam.type, fam.unit)
                values[name] = {}
            for s in fam.samples:
                values[name].setdefault((s.name, tuple(sorted(s.labels.items()))), []).append(s)
    out = []
    for name, fam in families.items():
        for (_, _), got in values[name].items():
            first = got[0]
            if len(got) == 1:
                value = first.value
            elif first.name.endswith("_created"):
                value = min(s.value for s in got)
            elif fam.type == "gauge":
                value = _COMBINE[name]([s.value for s in got]) if name in _COMBINE else first.value
            else:
                value = sum(s.value for s in got)
            fam.samples.append(Sample(first.name, first.labels, value))
        out.append(fam)
    return generate_latest(_Families(out))  # type: ignore[arg-type]

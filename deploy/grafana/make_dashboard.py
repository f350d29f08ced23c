"""Write deploy/grafana/dashboards/cusp.json, cusp's Grafana dashboard.

    python deploy/grafana/make_dashboard.py            # rewrite the JSON
    python deploy/grafana/make_dashboard.py --check    # exit 1 if the JSON is out of date

The JSON is generated so that every panel uses the same datasource, selectors and layout
rules; tests/test_deploy.py regenerates it and compares, and checks that every metric a
query names is one that service/metrics.py exports. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards" / "cusp.json"

#: uid of the datasource in provisioning/datasources/prometheus.yml
DATASOURCE_UID = "cusp-prometheus"
DS = {"type": "prometheus", "uid": DATASOURCE_UID}
#: uid of the dashboard (stable: links and the Grafana home setting refer to it)
DASHBOARD_UID = "cusp-overview"

SEL = '{stream=~"$stream", model=~"$model"}'
SEL_STREAM = '{stream=~"$stream"}'
SM = "{{stream}} / {{model}}"


class Layout:
    """Places panels left to right on Grafana's 24-column grid, wrapping to new rows."""

    def __init__(self) -> None:
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def take_id(self) -> int:
        pid = self.next_id
        self.next_id += 1
        return pid

    def place(self, w: int, h: int) -> dict:
        if self.x + w > 24:
            self.newline()
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def newline(self) -> None:
        if self.x:
            self.y += self.row_h
        self.x = 0
        self.row_h = 0


def target(expr: str, legend: str = "", ref: str = "A", **extra) -> dict:
    t = {"datasource": DS, "editorMode": "code", "expr": expr, "legendFormat": legend or "__auto", "range": True, "refId": ref}
    t.update(extra)
    return t


def row(lay: Layout, title: str) -> dict:
    lay.newline()
    panel = {"collapsed": False, "gridPos": {"h": 1, "w": 24, "x": 0, "y": lay.y}, "id": lay.take_id(), "panels": [], "title": title, "type": "row"}
    lay.y += 1
    return panel


def timeseries(
    lay: Layout,
    title: str,
    targets: list[dict],
    *,
    unit: str = "short",
    description: str = "",
    w: int = 12,
    h: int = 8,
    bars: bool = False,
    stack: bool = False,
    min_: float | None = None,
    max_: float | None = None,
    decimals: int | None = None,
) -> dict:
    defaults: dict = {
        "color": {"mode": "palette-classic"},
        "custom": {
            "axisPlacement": "auto",
            "drawStyle": "bars" if bars else "line",
            "fillOpacity": 60 if bars else (30 if stack else 0),
            "lineInterpolation": "stepAfter" if bars else "linear",
            "lineWidth": 1 if bars else 2,
            "pointSize": 4,
            "showPoints": "never" if bars else "auto",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "normal" if stack else "none"},
        },
        "unit": unit,
    }
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "datasource": DS,
        "description": description,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "gridPos": lay.place(w, h),
        "id": lay.take_id(),
        "options": {
            "legend": {"calcs": ["lastNotNull"], "displayMode": "table", "placement": "right", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
        "title": title,
        "type": "timeseries",
    }


def stat(
    lay: Layout,
    title: str,
    targets: list[dict],
    *,
    unit: str = "short",
    description: str = "",
    w: int = 4,
    h: int = 4,
    thresholds: list[tuple[float | None, str]] | None = None,
    mappings: list[dict] | None = None,
    decimals: int | None = None,
    instant: bool = True,
) -> dict:
    steps = [{"color": c, "value": v} for v, c in (thresholds or [(None, "blue")])]
    defaults: dict = {
        "color": {"mode": "thresholds"},
        "mappings": mappings or [],
        "thresholds": {"mode": "absolute", "steps": steps},
        "unit": unit,
    }
    if decimals is not None:
        defaults["decimals"] = decimals
    if instant:
        for t in targets:
            t["instant"] = True
            t["range"] = False
    return {
        "datasource": DS,
        "description": description,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "gridPos": lay.place(w, h),
        "id": lay.take_id(),
        "options": {
            "colorMode": "background",
            "graphMode": "none",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "value_and_name",
        },
        "targets": targets,
        "title": title,
        "type": "stat",
    }


def heatmap(lay: Layout, title: str, expr: str, *, description: str = "", w: int = 12, h: int = 8) -> dict:
    return {
        "datasource": DS,
        "description": description,
        "fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "linear"}}}, "overrides": []},
        "gridPos": lay.place(w, h),
        "id": lay.take_id(),
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64, "exponent": 0.5, "fill": "dark-orange", "reverse": False, "scale": "exponential"},
            "legend": {"show": True},
            "rowsFrame": {"layout": "auto"},
            "tooltip": {"mode": "single", "yHistogram": True},
            "yAxis": {"axisPlacement": "left", "unit": "short"},
        },
        "targets": [target(expr, "{{le}}", format="heatmap")],
        "title": title,
        "type": "heatmap",
    }


def query_variable(name: str, query: str, description: str) -> dict:
    return {
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "datasource": DS,
        "definition": query,
        "description": description,
        "includeAll": True,
        "label": name,
        "multi": True,
        "name": name,
        "options": [],
        "query": query,
        "refresh": 2,
        "regex": "",
        "skipUrlSync": False,
        "sort": 1,
        "type": "query",
    }


def counted(counter: str, sel: str, window: str, window_s: str, fn: str = "increase", by: str = "stream, model") -> str:
    """Events of a counter in a window, per ``by`` (stream and model), including the first event
    of a series created by that event (prometheus_client creates a labelled child on first use,
    and increase()/changes() need two samples of a series): a series created within the
    window (its ``_created`` sample, a unix time) counts whole, an older one by ``fn``."""
    return (
        f"sum by ({by}) (({counter}_total{sel} and (time() - {counter}_created{sel} < {window_s}))"
        f" or {fn}({counter}_total{sel}[{window}]))"
    )


def quantiles(metric_bucket: str, sel: str) -> list[dict]:
    out = []
    for ref, q in zip("ABC", ("0.5", "0.9", "0.99")):
        expr = f"histogram_quantile({q}, sum by (le) (rate({metric_bucket}{sel}[$__rate_interval])))"
        out.append(target(expr, f"p{round(float(q) * 100)}", ref))
    return out


def build() -> dict:
    lay = Layout()
    panels: list[dict] = []

    # ---------------------------------------------------------------- evidence
    panels.append(row(lay, "Evidence"))
    panels.append(
        timeseries(
            lay,
            "Log-evidence per observation",
            [target(f"max by (stream, model) (cusp_log_evidence_per_observation_nats{SEL})", SM)],
            unit="suffix: nats/obs",
            description="Running log p(y_1..n | model) / n. A change point shows as a cusp; on one stream the highest curve is the model the data favour.",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Chunk log predictive per observation",
            [target(f"max by (stream, model) (cusp_chunk_log_predictive_nats_per_observation{SEL})", SM)],
            unit="suffix: nats/obs",
            description="log p(chunk | history, model) / rows of the last chunk. Drops sharply when the data stop looking like what the model has seen (alert CuspEvidenceCusp).",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Posterior model probability",
            [target(f"max by (stream, model) (cusp_model_posterior_probability{SEL})", SM)],
            unit="percentunit",
            min_=0,
            max_=1,
            description="Posterior probability of each model among its stream's models (equal prior odds).",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Log-evidence",
            [target(f"max by (stream, model) (cusp_log_evidence_nats{SEL})", SM)],
            unit="suffix: nats",
            description="Running log p(y_1..n | model).",
        )
    )

    # ---------------------------------------------------------------- sampler
    panels.append(row(lay, "Sampler (SGAIS)"))
    panels.append(
        timeseries(
            lay,
            "Annealing steps (last chunk)",
            [target(f"max by (stream, model) (cusp_annealing_steps_last{SEL})", SM)],
            bars=True,
            w=8,
            decimals=0,
            description="Intermediate distributions the last chunk needed. Spikes when a chunk moves the posterior far (alert CuspAnnealingStepSpike).",
        )
    )
    panels.append(
        heatmap(
            lay,
            "Annealing steps per chunk (distribution)",
            f"sum by (le) (increase(cusp_annealing_steps_bucket{SEL}[$__rate_interval]))",
            w=8,
            description="How many chunks needed how many annealing steps, per time bucket.",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Effective sample size",
            [target(f"max by (stream, model) (cusp_effective_sample_size{SEL})", SM)],
            w=8,
            min_=0,
            description="ESS of the particle weights after the last chunk.",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Resampling rate",
            [target(f"sum by (stream, model) (rate(cusp_resamples_total{SEL}[$__rate_interval]))", SM)],
            unit="ops",
            w=12,
            description="Particle resampling events per second.",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Observations processed",
            [
                target(f"sum by (stream, model) (rate(cusp_observations_processed_total{SEL}[$__rate_interval]))", SM, "A"),
                target(f"sum by (stream) (rate(cusp_ingested_observations_total{SEL_STREAM}[$__rate_interval]))", "{{stream}} ingested", "B"),
            ],
            unit="suffix: obs/s",
            w=12,
            description="Observations applied to each model and accepted by the API, per second.",
        )
    )

    # ---------------------------------------------------------------- change points
    panels.append(row(lay, "Change points"))
    panels.append(
        stat(
            lay,
            "Change points (in time range)",
            [target(counted("cusp_stream_changepoints", SEL_STREAM, "$__range", "$__range_s", by="stream"), "{{stream}}"),
             target(counted("cusp_stream_changepoints_withdrawn", SEL_STREAM, "$__range", "$__range_s", by="stream"),
                    "{{stream}} withdrawn", "B")],
            w=6,
            h=6,
            decimals=0,
            thresholds=[(None, "green"), (1, "orange")],
            description="The stream's change points in the selected time range: its models' events weighted by their posterior probabilities (with one model, its events); drawn as red annotations on the time series, and what the CuspChangePointDetected alert fires on. 'withdrawn': those the evidence rejected a horizon (20 resolutions) after they were found (README, Withdrawn change points). A worker's counter created by its first change point counts whole.",
        )
    )
    panels.append(
        stat(
            lay,
            "Last change-point confidence",
            [target(f"max by (stream) (cusp_stream_changepoint_last_confidence{SEL_STREAM})", "{{stream}}")],
            unit="percentunit",
            w=6,
            h=6,
            thresholds=[(None, "blue"), (0.9, "orange"), (0.99, "red")],
            description="Confidence of the stream's last change point: a lower bound on its posterior probability, averaged over the models.",
        )
    )
    panels.append(
        stat(
            lay,
            "Last change-point location (observation)",
            [target(f"max by (stream) (cusp_stream_changepoint_last_observation{SEL_STREAM})", "{{stream}}")],
            w=6,
            h=6,
            decimals=0,
            description="Observation index of the stream's last change point.",
        )
    )
    panels.append(
        stat(
            lay,
            "Model events (in time range)",
            [target(counted("cusp_changepoints", SEL, "$__range", "$__range_s"), SM)],
            w=6,
            h=6,
            decimals=0,
            thresholds=[(None, "green"), (1, "blue")],
            description="Each model's own change points (its detector's events) in the selected time range, before the models are weighed: a model the data reject may report changes the stream's answer does not. Drawn as orange annotations when 'Model events' is switched on; they do not alert.",
        )
    )

    # ---------------------------------------------------------------- operations
    panels.append(row(lay, "Operations"))
    panels.append(
        stat(
            lay,
            "Redis",
            [target("min(cusp_redis_up)", "redis")],
            w=4,
            thresholds=[(None, "red"), (1, "green")],
            mappings=[{"type": "value", "options": {"0": {"text": "DOWN", "color": "red"}, "1": {"text": "UP", "color": "green"}}}],
            description="min over cusp processes of cusp_redis_up: DOWN if any process's last Redis round trip failed.",
        )
    )
    panels.append(
        stat(
            lay,
            "Worker loops",
            [target("sum(cusp_workers)", "workers")],
            w=4,
            thresholds=[(None, "red"), (1, "green")],
            description="Worker loops running, over all processes (cusp serve's in-process ones and every cusp worker).",
        )
    )
    panels.append(
        stat(
            lay,
            "Leases held",
            [target("sum(cusp_worker_leases)", "leases")],
            w=4,
            description="Stream x model leases held by all workers together (one per stream x model being processed).",
        )
    )
    panels.append(
        stat(lay, "Streams", [target("max(cusp_streams)", "streams")], w=4, description="Streams that exist.")
    )
    panels.append(
        stat(
            lay,
            "Dead letters (in time range)",
            # (a stream's first dead letter creates its series at 1: increase() alone read 0, an operator's trial)
            [target(f"sum({counted('cusp_dead_letters', SEL, '$__range', '$__range_s')})", "dead letters")],
            w=4,
            decimals=0,
            thresholds=[(None, "green"), (1, "red")],
            description="Chunks parked in the dead-letter stream after repeated failures (alert CuspDeadLetters).",
        )
    )
    panels.append(
        stat(
            lay,
            "Max ingest lag",
            [target(f"max(cusp_ingest_lag_chunks{SEL})", "chunks")],
            w=4,
            decimals=0,
            thresholds=[(None, "green"), (20, "orange"), (100, "red")],
            description="Largest number of chunks ingested but not yet applied, over all stream x model.",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Ingest lag",
            [target(f"max by (stream, model) (cusp_ingest_lag_chunks{SEL})", SM)],
            unit="short",
            min_=0,
            description="Chunks ingested but not yet applied to each model (alert CuspIngestLagHigh above 100 for 5m).",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Chunk processing time",
            quantiles("cusp_chunk_processing_seconds_bucket", SEL),
            unit="s",
            min_=0,
            description="p50 / p90 / p99 of the wall time per chunk (engine, detector and the atomic apply), over the selected streams and models.",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Leases per worker process",
            [target("sum by (instance) (cusp_worker_leases)", "{{instance}}")],
            stack=True,
            decimals=0,
            w=8,
            description="How the stream x model leases are spread over the worker processes.",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Worker memory: warm pairs",
            [target("sum by (instance) (cusp_worker_warm_bytes)", "{{instance}}")],
            unit="bytes",
            w=8,
            description="Memory of the pairs each worker keeps warm (states, reservoirs, detector data), capped by "
                        "CUSP_WORKER_WARM_BYTES; beyond it the least recently used pairs cool and are reloaded from Redis "
                        "for their next chunk.",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Pairs reloaded after cooling",
            [target("sum by (instance) (rate(cusp_worker_reloads_total[$__rate_interval]))", "{{instance}}")],
            unit="ops",
            w=8,
            description="Pairs per second a worker reloads from Redis because CUSP_WORKER_WARM_BYTES made it let them cool. "
                        "Steadily many: raise the cap or add workers.",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Redeliveries, fenced writes, dead letters",
            [
                target(counted("cusp_redeliveries", SEL, "$__rate_interval", "($__interval_ms / 1000)"), "redelivered " + SM, "A"),
                target(counted("cusp_fenced_writes", SEL, "$__rate_interval", "($__interval_ms / 1000)"), "fenced " + SM, "B"),
                target(counted("cusp_dead_letters", SEL, "$__rate_interval", "($__interval_ms / 1000)"), "dead-lettered " + SM, "C"),
            ],
            bars=True,
            w=8,
            description="Chunks processed again (failed attempt or lost lease), writes refused by the fencing token (a lease taken over), and chunks dead-lettered.",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Redis up per process",
            [target("cusp_redis_up", "{{job}} {{instance}}")],
            min_=0,
            max_=1,
            decimals=0,
            w=8,
            description="1 if the last Redis round trip of the process succeeded.",
        )
    )
    panels.append(
        timeseries(
            lay,
            "HTTP requests",
            [target("sum by (route, status) (rate(cusp_http_requests_total[$__rate_interval]))", "{{route}} {{status}}")],
            unit="reqps",
            description="HTTP requests answered by the API, by route template and status class.",
        )
    )
    panels.append(
        timeseries(
            lay,
            "Ingest: chunks accepted and rejected",
            [
                target(f"sum by (stream) (rate(cusp_ingested_chunks_total{SEL_STREAM}[$__rate_interval]))", "accepted {{stream}}", "A"),
                target("sum by (reason) (rate(cusp_ingest_rejected_total[$__rate_interval]))", "rejected: {{reason}}", "B"),
            ],
            unit="reqps",
            description="Chunks accepted (202) per stream, and ingest requests rejected by reason.",
        )
    )

    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                },
                {
                    "datasource": DS,
                    "enable": True,
                    "expr": counted("cusp_stream_changepoints", SEL_STREAM, "1m", "60", fn="changes", by="stream") + " > 0",
                    "iconColor": "red",
                    "name": "Change points",
                    "step": "15s",
                    "tagKeys": "stream",
                    "textFormat": "change point on {{stream}}",
                    "titleFormat": "Change point",
                    "useValueForTime": False,
                },
                {
                    "datasource": DS,
                    "enable": True,
                    "expr": counted("cusp_stream_changepoints_withdrawn", SEL_STREAM, "1m", "60", fn="changes", by="stream") + " > 0",
                    "iconColor": "gray",
                    "name": "Withdrawn change points",
                    "step": "15s",
                    "tagKeys": "stream",
                    "textFormat": "a change point of {{stream}} withdrawn (GET /v1/streams/{{stream}}/changepoints lists it)",
                    "titleFormat": "Change point withdrawn",
                    "useValueForTime": False,
                },
                {
                    "datasource": DS,
                    "enable": False,
                    "expr": counted("cusp_changepoints", SEL, "1m", "60", fn="changes") + " > 0",
                    "iconColor": "orange",
                    "name": "Model events",
                    "step": "15s",
                    "tagKeys": "stream,model",
                    "textFormat": "{{model}} reported a change on {{stream}}",
                    "titleFormat": "Model event",
                    "useValueForTime": False,
                },
            ]
        },
        "description": "cusp: online Bayesian evidence, annealing effort and change points per stream x model, and the service's health.",
        "editable": False,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "links": [],
        "panels": panels,
        "refresh": "5s",
        "schemaVersion": 39,
        "tags": ["cusp"],
        "templating": {
            "list": [
                query_variable("stream", "label_values(cusp_log_evidence_nats, stream)", "Streams (from cusp_log_evidence_nats)."),
                query_variable(
                    "model", 'label_values(cusp_log_evidence_nats{stream=~"$stream"}, model)', "Models of the selected streams."
                ),
            ]
        },
        "time": {"from": "now-30m", "to": "now"},
        "timepicker": {"refresh_intervals": ["5s", "10s", "30s", "1m", "5m"]},
        "timezone": "browser",
        "title": "cusp: change-point detection",
        "uid": DASHBOARD_UID,
        "version": 1,
        "weekStart": "",
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the dashboard JSON is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is out of date: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

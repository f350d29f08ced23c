"""``cusp replay``: run SGAIS over a file offline, one trace line per chunk and model."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from models import ModelError, build_model
from models.registry import default_model_name, default_portfolio, same_name
from service import times as T
from service.data import TIME_COLUMNS, DataError, log_model_probabilities, read_series, resolve_target
from service.detect import DetectorConfig, OfflineRun, StreamAnswer, stream_window
from service.detect.answer import CountWatch, counts_note
from service.detect.config import DETECT_DEFAULT_CHUNKS
from service.detect.moves import moved, named
from service.seeding import seed_for
from service.sgais import WARNINGS, ConfigError, EngineError, SGAISConfig, build_sampler


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", help="CSV file with a header row, or a .npy array")
    p.add_argument("--time-column", metavar="NAME",
                   help="the CSV column holding the rows' times (RFC 3339, dates or epoch seconds; strictly increasing); "
                        f"default: a column named {', '.join(TIME_COLUMNS)} (any case) if there is one. The trace then "
                        "carries times as the service's results do")
    p.add_argument("--model", action="append", metavar="SPEC",
                   help="model spec, e.g. gmm:components=5 (repeat for several competing models); "
                        "default: the default portfolio (README), as for a stream created without models")
    p.add_argument("--target", help="target column (name or index) for regression models; default: the last column")
    p.add_argument("--chunk-size", type=int, default=None,
                   help=f"rows per chunk (default: {EVIDENCE_CHUNK}; with --detect, ceil(rows / {DETECT_DEFAULT_CHUNKS}) up to "
                        f"{EVIDENCE_CHUNK}, as POST /v1/detect: a change needs chunks around it, and a series shorter than "
                        f"one chunk gets none)")
    p.add_argument("--particles", type=int, help="particles M (default: the preset's)")
    p.add_argument("--sampler", default="paper", help="sampler preset: paper (default), accurate, or paper-plain (the paper's Algorithm 1 without this engine's mode jumps, warm-up and default control variates)")
    p.add_argument("--seed", type=int, default=0,
                   help="the stream's seed: each model's is derived from it and its place in the --model list, as the service does")
    p.add_argument("--out", help="write the trace as JSON lines here (default: stdout)")
    p.add_argument("--plot", help="draw into this PNG, against the rows' times (or the observation index): the data with the stream's change "
                                  "points (--detect), each model's log-evidence and chunk log predictive per observation "
                                  "with its own change points, and annealing steps where a model samples")
    p.add_argument("--detect", action="store_true",
                   help="detect change points (printed to stderr, 'changepoint' lines in the trace, marks on the plot)")
    p.add_argument("--detector", action="append", default=[], metavar="KEY=VALUE",
                   help="detector setting, e.g. threshold=0.999 (repeatable; see README)")
    p.add_argument("--model-events", action="store_true",
                   help="with several models, print each model's own change points as they come (always in the trace); "
                        "without it, a count per model at the end: the stream's change points are the answer")


#: column names that usually number the rows rather than measure anything (``run``'s note)
INDEX_NAMES = ("year", "month", "week", "day", "hour", "quarter", "index", "idx", "id", "t", "n", "row")


class Progress:
    """A one-line progress bar on a terminal's stderr; silent otherwise."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.t0, self.last = total, enabled, time.perf_counter(), 0.0

    def __call__(self, done: int, note: str = "") -> None:
        now = time.perf_counter()
        if not self.enabled or (now - self.last < 0.1 and done < self.total):
            return
        self.last = now
        frac = done / self.total
        bar = "#" * int(30 * frac)
        rate = done / max(now - self.t0, 1e-9)
        sys.stderr.write(f"\r[{bar:<30}] {done}/{self.total} obs  {rate:,.0f} obs/s {note}")
        if done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def file_error(exc: ModelError | EngineError, path, label: str, first: int, rows: int, names: list[str]) -> Exception:
    """A model's refusal (``ModelError``, ``TooLarge``) or its sampler's failure in the chunk of ``rows``
    rows from the file's row ``first`` (from 0), said of the file: a value by its row, numbered as
    ``read_series`` numbers a file's rows (from 1, the header not counted), and its column by name
    ("row 2, column 0 has -3.0" of the chunk from row 0 reads "row 3, column 'x' has -3.0"); else by
    the chunk's rows. A ModelError's message names its model already; the others get ``label``."""
    row = getattr(exc, "row", None)
    if row is None:
        if isinstance(exc, ModelError):
            return DataError(f"{path}: {exc.naming(names)}")
        return EngineError(f"{path}, rows {first + 1}-{first + rows}: {label}: {exc}")
    text = re.sub(rf"\brow {row}\b", f"row {first + row + 1}", str(exc), count=1)
    if exc.column is not None and 0 <= exc.column < len(names):
        text = re.sub(rf"\bcolumn {exc.column}\b", f"column {names[exc.column]!r}", text, count=1)
    return DataError(f"{path}: {text}" if isinstance(exc, ModelError) else f"{path}: {label}: {text}")


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    if args.chunk_size is not None and args.chunk_size < 1:
        raise DataError("--chunk-size must be a positive integer")
    if not 0 <= args.seed <= 2**62:  # the API's limits (a stream's seed), so a replay can be a stream
        raise DataError("--seed must be an integer in [0, 2^62]")
    names, data, stamps = read_series(args.data, args.time_column)
    counters = [n for n in names if n.strip().lower() in INDEX_NAMES]
    if stamps is None and data.shape[1] > 1 and counters:  # a new user's yearly CSV ran as two-column data
        print(f"note: column {', '.join(map(repr, counters))} is modelled as data with the others; if it numbers the rows "
              "(a year, an index), leave it out of the file, or give the rows' times as --time-column (RFC 3339 times, "
              "dates or epoch seconds)", file=sys.stderr)
    chosen = args.chunk_size is None
    if chosen:
        args.chunk_size = default_chunk_size(data.shape[0], args.detect)
    target = resolve_target(names, args.target)
    overrides = {} if args.particles is None else {"particles": args.particles}
    config = SGAISConfig.preset(args.sampler, **overrides)
    specs = list(dict.fromkeys(args.model or default_portfolio(data.shape[1])))
    # each model named as the service names it (``gmm:components=3``: ``gmm_components3``), its spec beside it
    labels = [default_model_name(s) for s in specs]
    for i, label in enumerate(labels):
        same = same_name(specs[i], specs[:i])
        if same is not None:
            raise ConfigError(f"--model {specs[i]} is named {label!r}, as --model {same} is (a model "
                              "is named by its spec with ':' as '_' and '=' left out): drop one")
    spec_of = dict(zip(labels, specs))
    if args.detector and not args.detect:  # (was ignored without a word: a new user's trial)
        raise ConfigError(f"--detector {args.detector[0]} sets the change-point detector, which runs with --detect: add it")
    dcfg = DetectorConfig.from_dict({**parse_settings(args.detector), **({} if args.detect else {"enabled": False})})
    if dcfg.run_length_seconds is not None and stamps is None:
        raise ConfigError(f"detector: expected_run_length={dcfg.expected_run_length!r} is a duration; it needs the rows' "
                          "times (a time column, --time-column NAME); or give it in observations")
    samplers = {label: build_sampler(build_model(spec_of[label], data.shape[1], target), config) for label in labels}
    if chosen:  # said once the models and settings are known to be good (it came before a bad spec's error)
        print(f"chunks of {args.chunk_size} row{'' if args.chunk_size == 1 else 's'} (--chunk-size to change)", file=sys.stderr)
    out = open(args.out, "w") if args.out else sys.stdout  # noqa: SIM115 - closed below
    progress = Progress(data.shape[0], sys.stderr.isatty())
    traces: dict[str, list[dict]] = {label: [] for label in labels}
    found: dict[str, list] = {label: [] for label in labels}
    stream_found: list[int] = []  # the stream's (model-averaged) change points standing, for the plot
    withdrawn = 0  # and how many were withdrawn
    # each model's own events as they come: with one model (they are the stream's), or when asked; with
    # several, a count at the end (a new user's random walk: about 100 such lines, `level`, `trend` and
    # `student-t` following the walk by restarts, and no stream change, read as 100 changes)
    own_lines = len(labels) == 1 or args.model_events
    try:
        # model i of the list gets the seed the service gives the i-th model of a stream seeded --seed
        runs = {label: OfflineRun(s, seed_for(args.seed, i), dcfg) for i, (label, s) in enumerate(samplers.items())}
        # the stream's answer: each model's events weighted by its posterior probability, chunk by chunk as the service does
        answer = StreamAnswer(labels, stream_window([s.model for s in samplers.values()], dcfg), dcfg.threshold,
                              explain=True)
        for chunk, lo in enumerate(range(0, data.shape[0], args.chunk_size)):
            rows = data[lo : lo + args.chunk_size]
            end = None if stamps is None else float(stamps[lo + rows.shape[0] - 1])
            when = {} if stamps is None else {"time_start": T.format(float(stamps[lo])), "time_end": T.format(end)}
            interval = None if stamps is None else T.seconds_per_row(float(stamps[0]), end, lo + rows.shape[0])
            evidence, new = {}, {}
            for label, run in runs.items():
                try:
                    result, events = run.step(rows, interval)
                except (ModelError, EngineError) as exc:  # named by the file's row and column, as the reader names them
                    raise file_error(exc, args.data, label, lo, rows.shape[0], names) from None
                if stamps is not None:  # as the service: an event's time is that of row `row` of its chunk
                    events = [replace(ev, location_time=float(stamps[ev.seq * args.chunk_size + ev.row])) for ev in events]
                evidence[label], new[label] = (result.n, result.log_evidence), events
                line = {"model": label, "spec": spec_of[label], "chunk": chunk, **result.to_dict(), **when}
                traces[label].append(line)
                out.write(json.dumps(line) + "\n")
                for where, gain in result.outliers:
                    print(f"{label}: observation {where} taken for an outlier (log Bayes factor {gain:.1f}): the model goes "
                          "on without it", file=sys.stderr)
                for ev in events:
                    found[label].append(ev)
                    timed = T.timed(ev.location_time, end) if stamps is not None else {}
                    out.write(json.dumps({"model": label, "spec": spec_of[label], "kind": "changepoint", **ev.to_dict(),
                                          "columns": named(ev.columns, names), **timed}) + "\n")
                    if own_lines:
                        print(f"{label}: change point at observation {ev.location}{at(timed)} (chunk {ev.chunk}), confidence "
                              f"{ev.confidence:.4f}, log Bayes factor {ev.log_bayes_factor:.1f}, detected at {ev.detected_at}"
                              f"{moved(ev.columns, names)}", file=sys.stderr)
            pending = {label: run.pending for label, run in runs.items()}
            standing = {label: run.standing for label, run in runs.items()}
            made = answer.chunk(rows.shape[0], evidence, new, pending, standing) if args.detect else []
            for w in answer.withdrawn if args.detect else ():  # (judged before the chunk's new changes, as the service)
                stream_found.remove(w.location)
                withdrawn += 1
                timed = T.timed_withdrawal(w.location_time, end) if stamps is not None else {}
                out.write(json.dumps({"model": "*", "kind": "stream_changepoint_withdrawn", **w.to_dict(), **timed}) + "\n")
                print(f"stream (model-averaged): {w.describe()}", file=sys.stderr)
            for c in made:
                stream_found.append(c.location)
                timed = T.timed(c.location_time, end) if stamps is not None else {}
                out.write(json.dumps({"model": "*", "kind": "stream_changepoint", **c.to_dict(),
                                      "columns": named(c.columns, names), **timed}) + "\n")
                support = ", ".join(f"{m} p={p:.3g}" for m, (p, _) in sorted(c.support.items()))
                print(f"stream (model-averaged): change point at observation {c.location}{at(timed)}, confidence "
                      f"{c.confidence:.4f}, detected at {c.detected_at} ({support}){moved(c.columns, names)}", file=sys.stderr)
            progress(min(lo + args.chunk_size, data.shape[0]))
    finally:
        if out is not sys.stdout:
            out.close()
    if args.detect:
        if not stream_found:  # (nothing was printed about change points: a new user's trial)
            print(f"stream (model-averaged): no change {'stands' if withdrawn else 'found'} (threshold {dcfg.threshold:g}"
                  f"{f'; {withdrawn} withdrawn' if withdrawn else ''})", file=sys.stderr)
        if not own_lines and any(found.values()):
            counts = ", ".join(f"{label} {len(found[label])}" for label in labels)
            print(f"each model's own change points (not the stream's: it weighs them by the models' probabilities; "
                  f"'changepoint' lines in the trace, --model-events to print them): {counts}", file=sys.stderr)
        # why, where the answer cannot say: rows all warm-up, too few scored, a candidate below the threshold
        scored = {label: sum(t["rows"] - t["conditioned"] for t in traces[label]) for label in labels}
        infos = {label: r.sampler.model.frame_info(getattr(r.state, "post", r.state)) for label, r in runs.items()}
        for note in answer.notes(scored, {label: i["warmup_rows"] for label, i in infos.items() if i}):
            print(f"stream (model-averaged): {note}", file=sys.stderr)
        watch = CountWatch()
        watch.take(data)
        hint = counts_note(watch, names or [f"x{j}" for j in range(data.shape[1])], specs)
        if hint:
            print(f"note: {hint}", file=sys.stderr)
    final = {label: t[-1]["log_evidence"] for label, t in traces.items()}
    probs = log_model_probabilities(final)
    for label in labels:
        print(f"{label}: log-evidence {final[label]:.3f} nats over {data.shape[0]} observations "
              f"({traces[label][-1]['method']}), posterior probability {probs[label]:.4f}", file=sys.stderr)
        model, state = runs[label].sampler.model, runs[label].state
        info = model.frame_info(getattr(state, "post", state))  # (a sampled model's frame is in its state)
        if info is not None:  # a data-dependent prior: say which (issue 20)
            print(f"{label}: prior on (y - centre) / scale, centre {_g(info['centre'])}, scale {_g(info['scale'])} (from its "
                  f"first {model.warmup} rows, which are conditioned on, not scored; after a change the model adopted, "
                  "centred where the old regime expected the next row)" if info["centre"] is not None else
                  f"{label}: still in its warm-up of {model.warmup} rows (no frame yet)", file=sys.stderr)
        periods = info["periods"] if info is not None else None  # (its keys are the periods as {p:g})
        if periods:
            print(f"{label}: period (observations) posterior " + ", ".join(f"{p}: {w:.3g}" for p, w in periods.items()),
                  file=sys.stderr)
        warned = Counter(w for t in traces[label] for w in t["warnings"])
        for w, count in sorted(warned.items()):
            print(f"{label}: WARNING {count} of {len(traces[label])} chunks: {w}: {WARNINGS[w]}", file=sys.stderr)
    if not args.detect:  # (a new user's trial read the evidence alone as "no change found")
        print(f"change points: not looked for; add --detect (then chunks of ceil(rows / {DETECT_DEFAULT_CHUNKS}), at most "
              f"{EVIDENCE_CHUNK}, unless --chunk-size)", file=sys.stderr)
    if args.plot:
        plot_traces(traces, args.plot, {label: [e.location for e in evs] for label, evs in found.items()} if args.detect else None,
                    data=data.numpy(), columns=names, stream=stream_found if args.detect else None, stamps=stamps)
    return 0


#: ``cusp replay``'s chunk size for the evidence alone (the paper's)
EVIDENCE_CHUNK = 500


def default_chunk_size(rows: int, detect: bool) -> int:
    """``--chunk-size``'s default: ``EVIDENCE_CHUNK``; with the detector, as ``POST /v1/detect``'s
    (ceil(rows / ``DETECT_DEFAULT_CHUNKS``): at most that many chunks), up to ``EVIDENCE_CHUNK``. In
    chunks of 500 a series of 25 yearly values was one chunk and its jump went unreported."""
    return min(EVIDENCE_CHUNK, max(1, math.ceil(rows / DETECT_DEFAULT_CHUNKS))) if detect else EVIDENCE_CHUNK


def at(timed: dict) -> str:
    return f" ({timed['location_time']})" if timed.get("location_time") else ""


def parse_settings(items: list[str]) -> dict:
    """``key=value`` strings into a dict of JSON values (numbers, true/false) or strings."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"detector setting {item!r} is not key=value")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def plot_traces(traces: dict[str, list[dict]], path: str, changepoints: dict[str, list[int]] | None = None,
                data: np.ndarray | None = None, columns: list[str] | None = None, stream: list[int] | None = None,
                stamps: np.ndarray | None = None) -> None:
    """A PNG of the replay against the rows' times (``stamps``, epoch seconds) or, without them, the
    observation index (linear): the data (up to four columns) with
    the stream's model-averaged change points (solid black, with ``--detect``); each model's
    log-evidence per observation and each chunk's log predictive per observation, with that model's
    own change points (dashed, its colour); and the annealing steps per chunk where a model samples
    (the exact models take none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def x_of(i) -> np.ndarray:  # observation indices -> the x axis (a chunk's result at n: its last row, n - 1)
        i = np.asarray(i, dtype=np.int64)
        if stamps is None:
            return i
        return (np.asarray(stamps, dtype=np.float64)[np.clip(i, 0, len(stamps) - 1)] * 1e6).astype("datetime64[us]")

    sampled = any(r["annealing_steps"] for t in traces.values() for r in t)
    panels = (["data"] if data is not None else []) + ["evidence", "predictive"] + (["steps"] if sampled else [])
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.4 * len(panels) + 0.6), sharex=True, squeeze=False)
    ax = dict(zip(panels, axes[:, 0]))
    if data is not None:
        x = x_of(np.arange(data.shape[0]))
        for j in range(min(data.shape[1], 4)):
            ax["data"].plot(x, data[:, j], lw=0.7, label=columns[j] if columns else f"x{j}")
        ax["data"].set_ylabel("data")
        if data.shape[1] > 1:
            ax["data"].legend(loc="upper left", fontsize="small")
    for label, t in traces.items():
        n = x_of([r["n"] - 1 for r in t])
        line, = ax["evidence"].plot(n, [r["log_evidence_per_observation"] for r in t], label=label)
        scored = [k for k, r in enumerate(t) if r["log_predictive_per_observation"] is not None]
        ax["predictive"].plot(n[scored], [t[k]["log_predictive_per_observation"] for k in scored], color=line.get_color(),
                              lw=0.8, label=label)
        if sampled:
            ax["steps"].plot(n, [r["annealing_steps"] for r in t], color=line.get_color(), label=label)
        for cp in x_of((changepoints or {}).get(label, [])):
            for name in panels[-3 if sampled else -2:]:
                ax[name].axvline(cp, color=line.get_color(), ls="--", lw=0.8)
    for cp in x_of(stream or []):
        for a in ax.values():
            a.axvline(cp, color="black", lw=1.2)
    ax["evidence"].set_ylabel("log-evidence / obs")
    ax["predictive"].set_ylabel("chunk log pred. / obs")
    if sampled:
        ax["steps"].set_ylabel("annealing steps")
    ax["evidence"].legend(loc="lower right", fontsize="small")
    axes[-1, 0].set_xlabel(("time (UTC)" if stamps is not None else "observation")
                           + ("; black: the stream's change points, dashed: each model's" if stream is not None else ""))
    if stamps is not None:
        fig.autofmt_xdate()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


USER_ERRORS = (DataError, ModelError, ConfigError, EngineError, ValueError, OSError)


def _g(v) -> str:
    """A frame's centre or scale: a number, or one per column (10 digits: a centre of 9999.9995 with
    a scale of 8e-4 printed as 10000 at 6, a new user's trial)."""
    return f"{v:.10g}" if isinstance(v, float) else "[" + ", ".join(f"{x:.10g}" for x in v) + "]"

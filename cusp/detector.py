"""``cusp.Detector``: change-point detection in-process, river-style.

    det = cusp.Detector()                  # the default portfolio of models for the data's width
    for x in series:
        det.update(x)                      # a value, a row, or a chunk of rows (times=...: theirs)
    det.changepoints                       # the stream's model-averaged change points
    det.evidence, det.probabilities        # each model's log-evidence and posterior probability

It runs what a worker runs for a stream (``service.detect.OfflineRun`` per model, built and
seeded by ``service.runtime`` from a ``StreamConfig``) and averages change points over the
models chunk by chunk as the service's workers do (``service.detect.StreamAnswer``, window: the
models' training sample, widened to the largest chunk: ``service.detect.stream_window``), so the
same data, seed and chunking give the server's numbers. ``POST /v1/detect`` runs one of
these over a whole series (``Detector.for_stream``).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from cusp.errors import InputError
from cusp.times import epoch_seconds
from models import ModelError
from models.registry import build_model, default_model_name, default_portfolio, parse_spec, same_name, spec_problem
from service.data import MAX_COLUMNS, MAX_MAGNITUDE, log_model_probabilities, too_large
from service.detect import DetectorConfig, Event, OfflineRun, StreamAnswer, StreamChange, StreamWithdrawal, stream_window
from service.detect.answer import CountWatch, counts_note, standing_changes
from service.detect.moves import named
from service.runtime import build, model_seed, sampler_config
from service.sgais import ChunkResult, ConfigError, EngineError, TooLarge
from service.sgais.engine import beyond_limit
from service.store import ModelEntry, StreamConfig
from service.times import seconds_per_row

#: the largest seed the service accepts (``POST /v1/streams``)
MAX_SEED = 2**62
#: rows of a table fed one at a time without ``columns`` are read as values: a second 1-D update
#: of the same length up to this (or a row of a 2-D numpy array, of any width) is warned about
ROW_WARNING_WIDTH = 8
#: a first ``update`` of more rows than this without ``chunk_size`` is warned about: one chunk, in
#: which no change can be found (a new user's whole series gave nothing, silently)
ONE_CHUNK_WARNING = 250


class Detector:
    """Change-point detection over a stream in this process.

    models: model specs (``["level", "ar"]``, ``"gmm:components=3"``; plug-ins too); None: the
    default portfolio for the data's width (``models.registry.default_portfolio``).
    chunk_size: None: every ``update`` is one chunk, as every POST is for the service; k: rows
    are buffered and processed k at a time (``flush()`` processes a partial chunk).
    seed: the stream's seed (model i gets ``service.seeding.seed_for(seed, i)``, as a stream's
    models do). columns: the data's width, or its columns' names (default: from the first ``update``;
    a 1-D input is then a one-column series' values, so give it to update row by row). target: the
    target column's index for regression models. priors: spec (or name) -> prior weight of the model.
    Results are keyed by the models' names, as the service names them: the spec with ':' as '_'
    and '=' left out (``gmm:components=3``: ``gmm_components3``; ``level``: ``level``).
    sampler, sampler_settings: the SGAIS preset ('paper' or 'accurate') and overrides, e.g.
    ``{"particles": 20}``. Other keyword arguments are detector settings (README, "Change-point
    detection"): ``threshold=0.999``, ``expected_run_length=5000``, ``enabled=False``...

    Bad arguments or data raise ``cusp.InputError`` naming the problem, before anything is
    processed; a chunk that a model cannot hold (a value that overflows only in its frame) is
    taken by no model and raises ``cusp.InputError`` too, and with ``chunk_size`` that chunk and the
    rows buffered after it are dropped, the chunks before it kept (the message says which).
    Settings are public attributes; what was learned is private and rebuilt by ``reset()``.
    """

    def __init__(self, models: Sequence[str] | str | None = None, chunk_size: int | None = None, seed: int = 0, *,
                 columns: int | Sequence[str] | None = None, target: int | None = None, priors: Mapping[str, float] | None = None,
                 sampler: str = "paper", sampler_settings: Mapping[str, Any] | None = None, **settings: Any):
        self.models = _specs(models)
        for spec in self.models or ():
            problem = spec_problem(spec)
            if problem is not None:  # as the API refuses it ('level:' would be named 'level_' there)
                raise InputError(f"model {spec!r}: {problem}")
        self.chunk_size = _optional_int("chunk_size", chunk_size, 1)
        if not _is_int(seed) or not 0 <= seed <= MAX_SEED:
            raise InputError(f"seed must be an integer in [0, 2**62], got {seed!r}")
        self.seed = int(seed)
        self.column_names = _column_names(columns)
        self.columns = len(self.column_names) if self.column_names is not None else _optional_int("columns", columns, 1)
        if self.columns is not None and self.columns > MAX_COLUMNS:
            raise InputError(f"columns must be at most {MAX_COLUMNS} (as a stream's), got {self.columns}")
        self.target = _optional_int("target", target, 0)
        if self.target is not None and self.columns is not None and self.target >= self.columns:
            raise InputError(f"target must be a column index below columns={self.columns}, got {self.target}")
        self.priors = dict(priors or {})
        for spec, p in self.priors.items():  # (keyed by a model's spec or its name, as results are)
            if self.models is not None and spec not in self.models and spec not in map(default_model_name, self.models):
                raise InputError(f"priors: {spec!r} is not one of the models {list(self.models)}")
            if not isinstance(p, numbers.Real) or isinstance(p, bool) or not (0 < p < math.inf):
                raise InputError(f"priors[{spec!r}] must be a positive finite number, got {p!r}")
        self.sampler = sampler
        self.sampler_settings = dict(sampler_settings or {})
        self.settings = settings
        try:
            sampler_config(StreamConfig("detector", [], [], {"preset": sampler, "overrides": self.sampler_settings}))
        except (ConfigError, TypeError) as exc:
            raise InputError(f"sampler: {exc}") from None
        try:
            self.config = DetectorConfig.from_dict(settings)
        except ConfigError as exc:
            raise InputError(str(exc)) from None
        self._reset()
        if self.columns is not None:
            self._start(self._stream_config(self.columns))

    @classmethod
    def for_stream(cls, cfg: StreamConfig, chunk_size: int | None = None) -> "Detector":
        """The detector of a stream with config ``cfg`` (its models, names, priors, sampler, seed
        and detector settings, already validated, as ``service.api.crud.config_from_request``
        makes them): what ``POST /v1/detect`` runs. Results are keyed by the models' names."""
        det = cls.__new__(cls)
        det.models, det.chunk_size, det.seed = tuple(m.spec for m in cfg.models), chunk_size, cfg.seed
        det.columns, det.column_names, det.target = len(cfg.columns), list(cfg.columns), None
        det.priors = {m.name: m.prior for m in cfg.models}
        det.sampler, det.sampler_settings = cfg.sampler.get("preset", "paper"), dict(cfg.sampler.get("overrides", {}))
        det.settings, det.config = dict(cfg.detector), DetectorConfig.from_dict(cfg.detector)
        det._given = cfg  # (``reset`` starts from it again: its names, targets and priors)
        det._reset()
        det._start(cfg)
        return det

    # --- state --------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything seen; the settings stay."""
        self._reset()
        if getattr(self, "_given", None) is not None:
            self._start(self._given)
        elif self.columns is not None:
            self._start(self._stream_config(self.columns))

    def _reset(self) -> None:
        self._cfg: StreamConfig | None = None
        self._runs: dict[str, OfflineRun] = {}
        self._log_prior: dict[str, float] = {}
        self._results: dict[str, list[ChunkResult]] = {}
        self._events: dict[str, list[Event]] = {}
        self._chunks: list[tuple[int, int]] = []  # (first observation, rows) of each chunk processed
        self._pending = np.zeros((0, self.columns or 0))
        self._answer: StreamAnswer | None = None
        self._changes: list[StreamChange] = []
        self._withdrawn: list[StreamWithdrawal] = []
        self._counts = CountWatch()  # (``notes``: a hint where a column looks like sparse counts)
        self._width: int | None = self.columns
        self._stamps: list[float] = []  # each row's time (epoch seconds), pending rows included
        self._timed: bool | None = None  # whether the updates give times (None: no update yet)
        self._first_1d: int | None = None  # the first update's length, when a 1-D input set the width to 1

    def _stream_config(self, width: int) -> StreamConfig:
        specs = self.models or default_portfolio(width)
        if self.target is not None and self.target >= width:
            raise InputError(f"target column {self.target} is out of range for rows of {width} columns")
        names = self.column_names or [f"x{i}" for i in range(width)]
        # each model named as the service names it (``gmm:components=3``: ``gmm_components3``)
        labels = [default_model_name(s) for s in specs]  # (distinct: ``_specs``)
        return StreamConfig(name="detector", columns=names,
                            models=[ModelEntry(name=n, spec=s, target=self.target,
                                               prior=float(self.priors.get(s, self.priors.get(n, 1.0))))
                                    for n, s in zip(labels, specs)],
                            sampler={"preset": self.sampler, "overrides": self.sampler_settings}, seed=self.seed,
                            detector=dict(self.settings))

    def _start(self, cfg: StreamConfig) -> None:
        """Each model's sampler and detector, seeded as the service seeds the stream's models."""
        runs = {}
        for e in cfg.models:
            try:
                runs[e.name] = OfflineRun(build(cfg, e), model_seed(cfg, e), self.config)
            except (ModelError, ConfigError) as exc:
                raise InputError(f"model {e.spec!r}: {exc}") from None
        self._cfg, self._runs, self._width = cfg, runs, len(cfg.columns)
        self._log_prior = {e.name: math.log(e.prior) for e in cfg.models}
        self._results = {name: [] for name in runs}
        self._events = {name: [] for name in runs}
        self._answer = StreamAnswer(list(runs), stream_window([r.sampler.model for r in runs.values()], self.config),
                                    self.config.threshold, self._log_prior, explain=True)
        self._pending = np.zeros((0, self._width))

    # --- input --------------------------------------------------------------------------------
    def update(self, x: Any, times: Any = None) -> "Detector":
        """Take a value (one observation of a one-column series), a row (one observation of
        several columns: a 1-D sequence once the width is above 1), or a chunk (a 2-D array of
        rows; a 1-D sequence of a one-column series' values). Returns the detector.

        times: the rows' times, one per row (a list even for one row), strictly increasing and
        after the last update's, in any form ``cusp.Client.post`` takes (``cusp.times``): then
        events and change points carry ``location_time`` (epoch seconds), as the service's do,
        and an ``expected_run_length`` given as a duration ('30d') counts the rows' mean interval
        as the service's workers do (it needs times then: InputError without). Give times with every update or with none."""
        rows = self._rows(x)
        stamps = self._times_of(times, rows.shape[0])
        if self._cfg is None:
            self._start(self._stream_config(rows.shape[1]))
        self._check(rows)
        self._warn_rows_as_values(x, rows)
        if self.chunk_size is None and self.n == 0 and rows.shape[0] > ONE_CHUNK_WARNING:
            warnings.warn(f"cusp.Detector: update() with {rows.shape[0]:,} rows and no chunk_size is one chunk; a "
                          "change is found where the chunks after it differ, so a whole series in one update finds "
                          "none. Give chunk_size (POST /v1/detect and cusp replay use ceil(rows / 250)) or update "
                          "in the chunks the data arrive in", UserWarning, stacklevel=2)
        n0, timed0 = self.n, self._timed
        if stamps is not None:
            self._stamps += stamps
        self._timed = stamps is not None
        try:
            self._take(rows)
        except InputError as exc:
            raise self._dropped(exc, n0) from None
        except Exception:  # (a sampler's failure: the rows neither taken nor buffered lose their times)
            del self._stamps[self.n + self.pending:]
            if self.n + self.pending == 0:
                self._timed = timed0
            raise
        return self

    def _dropped(self, exc: InputError, n0: int) -> InputError:
        """After a chunk that no model took (a value it cannot hold, ``_step_models``): that chunk and
        the rows buffered after it are dropped with their times, the chunks before it stay taken.
        The error to raise: ``exc`` with, in chunks, which observations were dropped; ``reason``
        holds ``exc``'s own message (``POST /v1/detect`` answers with it: there nothing is kept)."""
        dropped = self.pending
        self._pending = self._pending[:0]
        del self._stamps[self.n:]
        if self.n == 0:
            self._timed = None  # (no row kept: the next update may come with times or without)
        if self.chunk_size is None:
            exc.reason = str(exc)
            return exc
        new = type(exc)(f"{exc} (observations {self.n} to {self.n + dropped - 1}: that chunk and the rows buffered after "
                        f"it were dropped; {self.n - n0} rows before them were processed by this call)")
        new.reason, new.too_large = str(exc), getattr(exc, "too_large", False)
        return new

    def _take(self, rows: np.ndarray) -> None:
        """Process ``rows``: as one chunk, or buffered and processed ``chunk_size`` at a time."""
        if self.chunk_size is None:
            self._step(rows)
            return
        self._pending = np.concatenate([self._pending, rows]) if len(self._pending) else rows
        k = self.chunk_size
        while self._pending.shape[0] >= k:
            self._step(self._pending[:k])
            self._pending = self._pending[k:]

    def flush(self) -> "Detector":
        """Process the buffered rows (fewer than ``chunk_size``) as one chunk."""
        if len(self._pending):
            try:
                self._step(self._pending)
            except InputError as exc:  # dropped with their times (no model took them, ``update``)
                raise self._dropped(exc, self.n) from None
            self._pending = self._pending[:0]
        return self

    def _rows(self, x: Any) -> np.ndarray:
        try:
            raw = np.asarray([x] if isinstance(x, (str, bytes)) else x)
        except (TypeError, ValueError):  # ragged rows, say
            raise InputError(f"update(x): x must be a number, a row or rows of numbers of one width, got "
                             f"{type(x).__name__}") from None
        # numbers only, as the service takes (numpy would read "1.5" and True as numbers)
        kinds = {raw.dtype.kind} if raw.dtype.kind != "O" else {
            "b" if isinstance(v, (bool, np.bool_)) else "U" if isinstance(v, (str, bytes)) else "N" if v is None else "f"
            for v in raw.ravel()}
        if kinds & {"U", "S", "b"}:
            raise InputError(f"update(x): x must be numbers, not {'booleans' if 'b' in kinds else 'text'}")
        if "N" in kinds:  # (numpy reads None as nan: "is nan" named a value the caller never gave)
            at = next(i for i, v in enumerate(raw.ravel()) if v is None)
            where = f"row {at // raw.shape[-1]}, column {at % raw.shape[-1]}" if raw.ndim == 2 else f"value {at}"
            raise InputError(f"update(x): {where} is None, not a number (a missing reading? leave the row out)")
        try:
            # a copy: a read-only view (a pandas Series' values) would make torch warn, and callers may rewrite theirs
            a = np.array(raw, dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError(f"update(x): x must be a number, a row or rows of numbers, got {type(x).__name__}") from None
        width = self._width
        if a.ndim == 0:
            a = a.reshape(1, 1)
        elif a.ndim == 1:
            a = a[None, :] if width is not None and width > 1 else a[:, None]
        elif a.ndim != 2:
            raise InputError(f"update(x): x must be a number, a row or a 2-D array of rows, got {a.ndim} dimensions")
        if a.shape[0] == 0 or a.shape[1] == 0:
            raise InputError("update(x): x is empty")
        if width is not None and a.shape[1] != width:
            raise InputError(f"update(x): rows of {a.shape[1]} values, but this detector's data have {width} columns")
        if a.shape[1] > MAX_COLUMNS:
            raise InputError(f"update(x): rows of {a.shape[1]} values; at most {MAX_COLUMNS} columns (as a stream's)")
        bad = ~np.isfinite(a)
        if bad.any():
            r, c = map(int, np.argwhere(bad)[0])
            raise InputError(f"update(x): row {r}, column {c} is {a[r, c]}; values must be finite numbers")
        big = too_large(a)
        if big is not None:  # as the service refuses them at ingest: beyond it the models' statistics overflow
            r, c = big
            raise InputError(f"update(x): row {r}, column {c} is {a[r, c]:g}; values must be within +-{MAX_MAGNITUDE:g}")
        return np.ascontiguousarray(a)

    def _warn_rows_as_values(self, x: Any, rows: np.ndarray) -> None:
        """A width inferred from a 1-D first update is 1, so rows of several columns given one at a
        time (``for row in table: det.update(row)``) were read as a one-column series, silently
        (a review, 2026-11-28). Warned, once: a row of a 2-D numpy array (a view of it, as iterating
        it gives), at once; another 1-D update of the same length up to ``ROW_WARNING_WIDTH`` (a
        table's width; longer ones are a series' batches: a new user's batches of 50 were warned
        about, and rows of 4 went unwarned where ``chunk_size`` 2 divided them)."""
        length = int(rows.shape[0])
        if self.columns is not None or self._width != 1 or np.ndim(x) != 1 or length < 2 or self._first_1d == 0:
            return
        base = getattr(x, "base", None) if isinstance(x, np.ndarray) else None
        row_of_table = base is not None and getattr(base, "ndim", 0) == 2 and base.shape[1] == length and base.shape[0] > 1
        again = self._first_1d == length and length <= ROW_WARNING_WIDTH
        if self._first_1d is None:
            self._first_1d = length
        if row_of_table or again:
            self._first_1d = 0  # warned
            warnings.warn(f"cusp.Detector: each 1-D update of {length} values is read as {length} rows of a one-column "
                          f"series; if each is one row of {length} columns, give columns={length} (or the rows as a "
                          "2-D array). columns=1 says they are values", UserWarning, stacklevel=3)

    def _times_of(self, times: Any, rows: int) -> list[float] | None:
        """The rows' times as epoch seconds (None without), checked against the earlier updates'."""
        if times is None:
            if self._timed:
                raise InputError("update(x, times): this detector's earlier rows came with times; give times with every update")
            if self.config.run_length_seconds is not None:  # as cusp replay and POST /v1/detect: not silently 1000 rows
                raise InputError(f"update(x, times): expected_run_length={self.config.expected_run_length!r} is a duration; "
                                 "it needs the rows' times (or give it in observations)")
            return None
        if self._timed is False:
            raise InputError("update(x, times): this detector's earlier rows came without times; give times with every update or none")
        stamps = epoch_seconds(times, rows)
        if self._stamps and not stamps[0] > self._stamps[-1]:
            raise InputError(f"update(x, times): times[0] ({stamps[0]} epoch seconds) is not after the last update's last "
                             f"time ({self._stamps[-1]})")
        return stamps

    def _check(self, rows: np.ndarray) -> None:
        """Every model can take the rows (before any model is fed them)."""
        t = torch.from_numpy(rows)
        for name, run in self._runs.items():
            try:
                feats = run.sampler.model.featurize(t)
            except ModelError as exc:
                raise InputError(f"model {name!r}: {exc.naming(self.column_names or ())}") from None
            if not bool(torch.isfinite(feats).all()):
                raise InputError(f"model {name!r}: values too large (their squares overflow float64)")

    def _step(self, chunk: np.ndarray) -> None:
        with _one_thread():
            self._step_models(chunk)

    def _step_models(self, chunk: np.ndarray) -> None:
        t = torch.from_numpy(np.ascontiguousarray(chunk))
        evidence, new = {}, {}
        # the mean time between rows through this chunk, for an expected_run_length given as a duration
        through = self.n + int(chunk.shape[0])
        interval = seconds_per_row(self._stamps[0], self._stamps[through - 1], through) if self._timed else None
        # every model takes the chunk, or none does (one that cannot leaves the others as they were);
        # first a value beyond what a model holds (``Model.value_limit``), as the API refuses it
        for name, run in self._runs.items():
            model = run.sampler.model
            # (the frame alone: ``frame_info`` also weighs ``seasonal``'s periods, 65 us a chunk against 4)
            fr = model.frame(getattr(run.state, "post", run.state)) if model.has_frame else None
            frame = (fr[0], fr[1], model.warmup) if fr is not None else None
            why = beyond_limit(model, t, frame, self._cfg.columns, first=self.n)  # (by observation, as in a series)
            if why is not None:
                err = InputError(f"model {name!r}: {why}")
                err.too_large = True  # (POST /v1/detect: the series' fault)
                raise err
        proposals = {}
        for name, run in self._runs.items():
            try:
                proposals[name] = run.propose(t, interval)
            except (TooLarge, ModelError) as exc:  # (a value the model's frame or statistics cannot hold)
                err = InputError(f"model {name!r}: {exc}")
                err.too_large = isinstance(exc, TooLarge)  # (POST /v1/detect: the series' fault)
                raise err from None
            except EngineError as exc:  # (the sampler's failure: diverged particles)
                raise EngineError(f"model {name!r}, chunk {len(self._chunks)}: {exc}") from None
        for name, run in self._runs.items():
            result, new[name] = run.commit(proposals[name])
            if self._timed:  # the time of each event's first new observation, as the service gives it
                new[name] = [replace(e, location_time=self._stamps[e.location]) for e in new[name]]
            self._results[name].append(result)
            self._events[name] += new[name]
            evidence[name] = (result.n, result.log_evidence)
        self._chunks.append((self.n, int(chunk.shape[0])))
        self._counts.take(chunk)
        self._changes += self._answer.chunk(int(chunk.shape[0]), evidence, new,
                                            {name: run.pending for name, run in self._runs.items()},
                                            {name: run.standing for name, run in self._runs.items()})
        self._withdrawn += self._answer.withdrawn

    # --- answers ------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """The models' names (their specs; a stream's model names for ``for_stream``)."""
        return list(self._runs)

    @property
    def n(self) -> int:
        """Observations processed (buffered ones not counted)."""
        return sum(r for _, r in self._chunks)

    @property
    def pending(self) -> int:
        """Rows buffered until a chunk is full."""
        return int(len(self._pending))

    @property
    def chunks(self) -> list[tuple[int, int]]:
        """(first observation, rows) of each chunk processed."""
        return list(self._chunks)

    @property
    def results(self) -> dict[str, list[ChunkResult]]:
        """Each model's result per chunk (``log_predictive``, ``log_evidence``, ``annealing_steps``...)."""
        return {m: list(r) for m, r in self._results.items()}

    @property
    def events(self) -> dict[str, list[Event]]:
        """Each model's own change points (``location``, ``confidence``, ``log_bayes_factor``...)."""
        return {m: list(e) for m, e in self._events.items()}

    def columns_moved(self, change: StreamChange | Event) -> list[dict] | None:
        """How each column moved at a change point (``changepoints``) or a model's event (``events``),
        named and in the columns' order: ``shift`` (in sd before the change), ``scale`` (sd after
        over sd before), the means and sds over the detector's rows before and after it, and how
        many rows (README, "Which columns moved"; ``service.detect.moves``). None with one column."""
        return named(change.columns, self._cfg.columns if self._cfg is not None else self.column_names)

    @property
    def outliers(self) -> dict[str, list[int]]:
        """Each model's readings taken out as outliers (observation indices; closed-form models: the
        model goes on without them, README "Outliers"). From ``results``' ``outliers``."""
        return {m: [at for res in r for at, _ in res.outliers] for m, r in self._results.items()}

    @property
    def evidence(self) -> dict[str, float]:
        """Each model's running log-evidence log p(y_1..n | model), nats (0 before any chunk)."""
        return {m: (r[-1].log_evidence if r else 0.0) for m, r in self._results.items()}

    @property
    def frames(self) -> dict[str, dict | None]:
        """Each model's frame: for a model whose prior is fixed from the data's first rows (the
        metric-series models, ``gaussian:warmup=N``, ``gmm:warmup=N``), ``warmup_rows``, ``centre`` and
        ``scale`` (None during the warm-up; per column for ``gaussian``, ``gmm`` and a several-column
        ``student-t``) and, for
        ``seasonal`` without a period, the candidate ``periods``' probabilities; None for a model
        whose prior is in the data's units.
        As the service shows it (``GET /v1/streams/{name}``, a model's ``frame``)."""
        return {m: run.sampler.model.frame_info(getattr(run.state, "post", run.state)) for m, run in self._runs.items()}

    @property
    def probabilities(self) -> dict[str, float]:
        """Each model's posterior probability given the data so far (with the models' priors)."""
        return log_model_probabilities(self.evidence, self._log_prior) if self._runs else {}

    @property
    def notes(self) -> list[str]:
        """What the answer cannot say by itself, in words: that every row so far is the models'
        warm-up, or too few were scored after it for a change to be found, and the most probable
        candidate that stayed below the threshold (``service.detect.StreamAnswer.notes``). Empty
        before any chunk. ``POST /v1/detect`` answers them as ``notes``."""
        if self._answer is None:
            return []
        scored = {m: sum(r.rows - r.conditioned for r in res) for m, res in self._results.items()}
        out = self._answer.notes(scored, {m: f["warmup_rows"] for m, f in self.frames.items() if f})
        hint = counts_note(self._counts, self._cfg.columns, [e.spec for e in self._cfg.models])
        return out + ([hint] if hint else [])

    @property
    def changepoints(self) -> list[StreamChange]:
        """The stream's change points: each model's events weighted by its posterior probability
        (``service.detect.StreamAnswer``; with one model, its own events). Each has
        ``location`` (index of the first observation of the new regime), ``detected_at``,
        ``confidence``, ``support`` (model -> [posterior probability over no change and this change, event confidence]) and
        ``location_time`` (epoch seconds, where ``update`` was given times; else None), and
        ``delay`` (``detected_at - location``). Sorted by location; the service's
        ``GET /v1/streams/{s}/changepoints`` lists them in the order they were found (a change can be
        found after a later one: sort by ``location`` to compare). A change the evidence rejected
        later is not among them: it is in ``withdrawn``."""
        return sorted(standing_changes(self._changes, self._withdrawn), key=lambda c: c.location)

    @property
    def withdrawn(self) -> list[StreamWithdrawal]:
        """The stream changes withdrawn: judged again ``StreamAnswer.HORIZON`` resolutions after
        each was found, with a probability below ``StreamAnswer.WITHDRAW`` (0.5) then. Each has
        ``location``, ``detected_at``, ``withdrawn_at``, ``confidence`` (its probability when withdrawn),
        ``support`` and ``location_time``; in the order withdrawn. As the service lists them
        (``GET /v1/streams/{s}/changepoints``'s ``withdrawn``)."""
        return list(self._withdrawn)

    def __repr__(self) -> str:
        return (f"Detector(models={list(self._runs) or self.models}, chunk_size={self.chunk_size}, seed={self.seed}, "
                f"n={self.n}, changepoints={[c.location for c in self.changepoints]})")


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _column_names(columns: Any) -> list[str] | None:
    """The columns' names when ``columns`` gives them (a list, a pandas Index, ...; None when it is a
    width or None), checked as the service checks a stream's columns."""
    if columns is None or _is_int(columns):
        return None
    if isinstance(columns, (str, bytes, Mapping)) or not hasattr(columns, "__iter__"):
        raise InputError(f"columns must be an integer >= 1 or a list of column names, got {type(columns).__name__}")
    names = list(columns)
    if not 1 <= len(names) <= MAX_COLUMNS or not all(isinstance(c, str) and c.strip() for c in names):
        raise InputError(f"columns: give 1 to {MAX_COLUMNS} names, each a non-blank string (got {len(names)}, "
                         f"first {names[:3]!r})")
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise InputError(f"columns: names must be unique; {twice[:3]!r} given twice")
    return [str(c) for c in names]  # (numpy's str_ as str)


def _optional_int(what: str, x: Any, low: int) -> int | None:
    if x is None:
        return None
    if not _is_int(x) or x < low:
        raise InputError(f"{what} must be an integer >= {low} (or None), got {x!r}")
    return int(x)


_threads_lock = threading.Lock()
_threads_users = 0
_threads_saved = 1


@contextlib.contextmanager
def _one_thread():
    """One intra-op thread while models run, as a worker and ``cusp replay`` do (their small tensors
    ran about 10x slower on 2 threads of a busy machine), the caller's setting back when the last
    detector running in the process is done. ``POST /v1/detect`` runs detectors in threads, and
    torch's setting is partly per thread (OpenMP's) and partly process-wide, so each call sets it in
    its own thread, and the count decides who restores: the first saves it, the last restores it."""
    global _threads_users, _threads_saved
    with _threads_lock:
        if _threads_users == 0:
            _threads_saved = torch.get_num_threads()
        _threads_users += 1
    torch.set_num_threads(1)
    try:
        yield
    finally:
        with _threads_lock:
            _threads_users -= 1
            if _threads_users == 0:
                torch.set_num_threads(_threads_saved)


def _check_settings(i: int, spec: str) -> None:
    """A spec's settings, checked before any data: the model is built for a few widths, and a spec
    that none of them takes is refused now with the first width's error (``local-trend:discount=2``
    was taken until the first update); one that fits some width waits for the data's."""
    errors = []
    for width in _PROBE_WIDTHS:
        try:
            build_model(spec, width)
            return
        except ModelError as exc:
            errors.append(exc)
    raise InputError(f"models[{i}]: {errors[0]}") from None


#: the widths ``_check_settings`` builds a spec for (one column, a target and a feature, several)
_PROBE_WIDTHS = (1, 2, 5)


def _specs(models: Sequence[str] | str | None) -> tuple[str, ...] | None:
    """The model specs, checked by name and settings now (their widths at the first data)."""
    if models is None:
        return None
    if isinstance(models, str):
        models = [models]
    if not isinstance(models, Sequence) or not models:
        raise InputError(f"models must be a non-empty list of model specs (or None: the default portfolio), got {models!r}")
    out = []
    for i, spec in enumerate(models):
        if not isinstance(spec, str):
            raise InputError(f"models[{i}] must be a spec string like 'gmm:components=3', got {spec!r}")
        try:
            parse_spec(spec)
        except ModelError as exc:
            raise InputError(f"models[{i}]: {exc}") from None
        _check_settings(i, spec)
        if spec in out:
            raise InputError(f"models[{i}]: {spec!r} is listed twice")
        same = same_name(spec, out)
        if same is not None:  # (the API refuses such a list too: a model's name is used twice)
            raise InputError(f"models[{i}]: {spec!r} is named {default_model_name(spec)!r}, as {same!r} is (a model is "
                             "named by its spec with ':' as '_' and '=' left out): drop one")
        out.append(spec)
    return tuple(out)

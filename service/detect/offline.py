"""Detection in memory: ``OfflineRun`` (one model and its detector), ``detect_series`` and
``detect_stream`` (a stream's models, seeded as the service seeds them, and its answer)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import torch

from service.detect.answer import StreamAnswer, StreamChange, StreamWithdrawal, standing_changes
from service.detect.config import DetectorConfig
from service.detect.detector import Detector, detector_seed, stream_window
from service.detect.state import Event
from service.sgais import ChunkResult, Sampler, SGAISConfig, build_sampler


class OfflineRun:
    """One model with its detector over chunks in memory (``cusp replay --detect``, benchmarks,
    tests): ``step(chunk) -> (ChunkResult, events)`` with stream-wide ``n`` and log-evidence.
    Seeded like the service: ``seed`` is the model's seed, the detector's is derived from it."""

    def __init__(self, sampler: Sampler, seed: int, config: DetectorConfig | None = None):
        self.sampler = sampler
        self.detector = Detector(sampler, config) if (config or DetectorConfig()).enabled else None
        self.state, self.reservoir = sampler.init(seed), sampler.new_reservoir()
        self.dstate = self.detector.init(detector_seed(seed)) if self.detector else None
        self.chunks = 0
        self.pending: list[tuple[int, float]] = []  # the last step's open challengers (``Step.pending``)
        self.standing: tuple[int, float] | None = None  # and its last change weighed on (``Step.standing``)

    def step(self, chunk: torch.Tensor, seconds_per_row: float | None = None) -> tuple[ChunkResult, list[Event]]:
        """One chunk; ``seconds_per_row``: the series' mean time between rows through it (for an
        expected_run_length given as a duration: ``Detector.use_interval``)."""
        return self.commit(self.propose(chunk, seconds_per_row))

    def propose(self, chunk: torch.Tensor, seconds_per_row: float | None = None) -> "Proposal":
        """``step``'s work without its effect: this run is as it was until ``commit`` (so a stream's
        models take a chunk together or not at all, ``cusp.Detector``). Raises what the sampler
        or the detector raise."""
        new, result, writes = self.sampler.update(self.state, chunk, self.reservoir)
        if self.detector is None:
            return Proposal(new, result, writes, [], None, self.dstate, self.pending, self.standing)
        # (the reservoir as the worker passes it: before the chunk)
        step = self.detector.update(self.dstate, self.chunks, chunk, self.state, new, result, seconds_per_row,
                                    self.reservoir)
        if step.promoted is not None:
            new = step.promoted
        reservoir = step.reservoir if step.promoted is not None else None
        return Proposal(new, step.result, writes, step.events, reservoir, step.state, step.pending, step.standing)

    def commit(self, p: "Proposal") -> tuple[ChunkResult, list[Event]]:
        """Take ``propose``'s chunk: (its ChunkResult, its events)."""
        if p.reservoir is not None:
            self.reservoir = p.reservoir.copy()
        else:  # (an outlier taken out keeps the history)
            self.reservoir.apply(p.writes)
        self.state, self.dstate, self.pending, self.standing = p.state, p.dstate, p.pending, p.standing
        self.chunks += 1
        return p.result, p.events


@dataclass
class Proposal:
    """A chunk ``OfflineRun.propose`` processed and ``commit`` takes: the sampler's state after it,
    the result, the history's writes (or a promoted challenger's whole history), the events and
    the detector's state, open challengers and standing change after it."""

    state: object
    result: ChunkResult
    writes: object
    events: list[Event]
    reservoir: object
    dstate: object
    pending: list[tuple[int, float]]
    standing: tuple[int, float] | None


def detect_series(data, model_spec: str, chunk_size: int = 500, seed: int = 0, config: DetectorConfig | None = None,
                  sampler_config: SGAISConfig | None = None, target: int | None = None,
                  on_chunk: Callable[[ChunkResult, list[Event]], None] | None = None) -> list[Event]:
    """Run SGAIS with the detector over ``data [T, C]`` offline; the change points found."""
    from models import build_model

    x = torch.as_tensor(data, dtype=torch.float64)
    if x.dim() == 1:
        x = x[:, None]
    model = build_model(model_spec, x.shape[1], target)
    run = OfflineRun(build_sampler(model, sampler_config or SGAISConfig()), seed, config or DetectorConfig())
    events: list[Event] = []
    for lo in range(0, x.shape[0], chunk_size):
        result, found = run.step(x[lo : lo + chunk_size])
        events += found
        if on_chunk is not None:
            on_chunk(result, found)
    return events


def detect_stream(data, model_specs: Sequence[str] | None = None, chunk_size: int = 500, seed: int = 0,
                  config: DetectorConfig | None = None, sampler_config: SGAISConfig | None = None,
                  target: int | None = None) -> tuple[dict[str, list[Event]], list["StreamChange"]]:
    """A stream's models with their detectors over ``data [T, C]`` offline, seeded as the service
    seeds a stream's models (model i: ``service.seeding.seed_for(seed, i)``), and the stream's answer:
    (each model's events, the model-averaged change points less those withdrawn, ``StreamAnswer.WITHDRAW``;
    ``cusp.Detector.withdrawn`` lists those). ``model_specs`` None: the default
    portfolio for the data's width (``models.registry.default_portfolio``)."""
    from models import build_model
    from models.registry import default_portfolio
    from service.seeding import seed_for

    x = torch.as_tensor(data, dtype=torch.float64)
    if x.dim() == 1:
        x = x[:, None]
    specs = list(model_specs or default_portfolio(x.shape[1]))
    cfg = config or DetectorConfig()
    runs = {spec: OfflineRun(build_sampler(build_model(spec, x.shape[1], target), sampler_config or SGAISConfig()),
                             seed_for(seed, i), cfg) for i, spec in enumerate(specs)}
    events: dict[str, list[Event]] = {spec: [] for spec in specs}
    answer = StreamAnswer(specs, stream_window([r.sampler.model for r in runs.values()], cfg), cfg.threshold)
    changes: list[StreamChange] = []
    withdrawn: list[StreamWithdrawal] = []
    for lo in range(0, x.shape[0], chunk_size):
        chunk = x[lo : lo + chunk_size]
        evidence, new = {}, {}
        for spec, run in runs.items():
            result, new[spec] = run.step(chunk)
            events[spec] += new[spec]
            evidence[spec] = (result.n, result.log_evidence)
        changes += answer.chunk(chunk.shape[0], evidence, new, {spec: run.pending for spec, run in runs.items()},
                                {spec: run.standing for spec, run in runs.items()})
        withdrawn += answer.withdrawn
    return events, sorted(standing_changes(changes, withdrawn), key=lambda c: c.location)

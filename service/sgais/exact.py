"""The exact method: closed-form evidence for conjugate models, with SGAIS's interface.

A conjugate model (``Model.conjugate``: ``gaussian``, ``linear-regression`` with its known
noise) has a posterior in closed form, so its log predictive of a chunk, log p(chunk | history),
is exact and costs O(chunk) whatever the history: no particles, no annealing, no sampling
error, and no dependence on where the data sit (raw units, offsets of 1e6, scales of 1e-4).
``build_sampler`` gives these models an ``ExactSampler`` unless their spec says
``sampler=sgais``. It keeps the reservoir sample of the history like SGAIS (so a stream can
switch method, and the detector's challengers, which keep their rows in one, work the same)
and a generator (the reservoir's draws), saved with the state.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from models.base import Model
from service.data import MAX_MAGNITUDE
from service.sgais.config import SGAISConfig
from service.sgais.engine import WARNINGS, ChunkResult, SamplerBase, TooLarge, overflowing, prepare, refuse_beyond
from service.sgais.reservoir import Reservoir, ReservoirWrites, algorithm_r
from service.sgais.state import decode, encode


#: A model computed by deterministic quadrature (``student-t``, models/heavy.py) may say that its
#: posterior reached the edge of its grid (``Model.exact_warnings``): registered beside the
#: engine's warnings, so results, metrics, logs and ``cusp replay`` carry it like the others.
WARNINGS.setdefault(
    "quadrature_edge",
    "the posterior reached the edge of the model's quadrature grid (after its rows were dropped: a change the "
    "detector has not restarted at; or on values too far from the model's frame to fit a grid): the log-evidence "
    "is that of a prior cut to the grid, too low",
)


#: the layouts of ``post`` this version reads (``ExactState.layout``, the digit of the magic). 2: a
#: model's posterior in a form an earlier release would misread (``student-t``'s distinct values with
#: their counts, 2026-11-28), so that such a release refuses it (not a state it reads: a ValueError) instead
EXACT_LAYOUTS = (1, 2)


def exact_layout(model, post: torch.Tensor) -> int:
    """The layout version ``model``'s posterior ``post`` needs (``Model.exact_layout``; 1 by default)."""
    hook = getattr(model, "exact_layout", None)
    return int(hook(post)) if hook is not None else 1


@dataclass(frozen=True)
class ExactState:
    """post [P]: the posterior's parameters (``Model.exact_init``'s layout); log_evidence: log
    p(y_1..n), exact; n, chunks: observations and chunks seen; rng: the reservoir's generator;
    layout: the version of ``post``'s layout, written in the magic (``EXACT_LAYOUTS``): a release
    that knows only layout 1 takes a state of layout 2 for an unknown kind and refuses it."""

    PREFIX = b"CUSPEXACT"

    post: torch.Tensor
    log_evidence: float
    n: int
    chunks: int
    rng: torch.Tensor
    layout: int = 1

    def to_bytes(self) -> bytes:
        header = {"log_evidence": repr(float(self.log_evidence)), "n": int(self.n), "chunks": int(self.chunks)}
        return encode(b"%s%d\n" % (self.PREFIX, self.layout), header, {"post": self.post, "rng": self.rng})

    @classmethod
    def from_bytes(cls, raw: bytes) -> "ExactState":
        end = raw.find(b"\n", 0, 16)
        tag = raw[len(cls.PREFIX) : end] if raw.startswith(cls.PREFIX) and end > 0 else b""
        layout = {b"%d" % k: k for k in EXACT_LAYOUTS}.get(tag, 0)
        if not layout:
            raise ValueError(f"not an exact state layout this version reads ({raw[:16]!r}; it reads {EXACT_LAYOUTS})")
        header, tensors = decode(raw[: end + 1], raw)
        return cls(log_evidence=float(header["log_evidence"]), n=header["n"], chunks=header["chunks"], layout=layout,
                   **tensors)


class ExactSampler(SamplerBase):
    """``Sampler``'s interface (init, update, new_reservoir, log_fit) over a conjugate model's
    closed form. ``config`` is used for the reservoir's capacity only."""

    method = "exact"

    def __init__(self, model: Model, config: SGAISConfig):
        if not model.conjugate:
            raise ValueError(f"model {model.name!r} has no closed-form posterior")
        self.model = model
        self.config = config.for_model(model)

    def init(self, seed: int) -> ExactState:
        g = torch.Generator().manual_seed(int(seed))
        return self._fresh(self.model.exact_init(), g)

    def _fresh(self, post: torch.Tensor, g: torch.Generator) -> ExactState:
        """A state before any row, its layout read from ``post`` (``exact_layout``)."""
        return ExactState(post=post, log_evidence=0.0, n=0, chunks=0, rng=g.get_state(), layout=exact_layout(self.model, post))

    def restart(self, seed: int, incumbent: ExactState) -> ExactState:
        """A fresh posterior for a restart at a change point: ``Model.exact_restart`` (a model with a
        warm-up frame keeps the incumbent's scale, centred where the incumbent expected the next row,
        so the restart is scored from its first row)."""
        g = torch.Generator().manual_seed(int(seed))
        return self._fresh(self.model.exact_restart(incumbent.post), g)

    def shift(self, seed: int, incumbent: ExactState) -> ExactState | None:
        """A restart at a level shift: the incumbent's posterior (given the rows before the change)
        with a new level (``Model.exact_shift``); None where the model has none, or has no frame yet."""
        hook = getattr(self.model, "exact_shift", None)
        post = hook(incumbent.post) if hook is not None else None
        if post is None:
            return None
        g = torch.Generator().manual_seed(int(seed))
        return self._fresh(post, g)

    def log_fit(self, state: ExactState, rows: torch.Tensor) -> float:
        """Mean over featurized ``rows [B, F]`` of each row's log posterior predictive under ``state``."""
        return float(self.row_fits(state, rows).mean())

    def row_fits(self, state: ExactState, rows: torch.Tensor) -> torch.Tensor:
        """Each featurized row's log posterior predictive under ``state``: ``[B]``."""
        with torch.inference_mode():
            return self.model.exact_row_log_predictive(state.post, rows)

    def _refuse_beyond(self, frame, chunk: torch.Tensor, skip: int) -> None:
        """TooLarge (``beyond_limit``'s message) for a value of ``chunk`` past its first ``skip`` rows
        beyond the model's limit in ``frame`` (``Model.frame``: (centre, scale)). Nothing to check for a
        framed model whose frame is not fixed (None), nor for one without a frame that takes every value
        the API and ``cusp replay`` let in (``service.data.MAX_MAGNITUDE``)."""
        model = self.model
        if not model.has_frame:
            if model.value_limit >= MAX_MAGNITUDE:
                return
            centre, scale = 0.0, 1.0
        else:
            if frame is None:
                return
            centre, scale = frame
        rows = chunk[skip:]
        if _within(rows.numpy(), centre, scale, model.value_limit):
            return
        if skip:  # (the rows before them: the warm-up that fixed the frame; named by their row in the chunk)
            rows = torch.cat([torch.as_tensor(centre, dtype=torch.float64).expand(skip, chunk.shape[1]), rows])
        refuse_beyond(model, rows, (centre, scale, getattr(model, "warmup", 0)) if model.has_frame else None)

    def update(self, state: ExactState, chunk: torch.Tensor, reservoir: Reservoir) -> tuple[ExactState, ChunkResult, ReservoirWrites]:
        """As ``Sampler.update``: raw rows ``[B, C]``; the reservoir is read (checked), not written."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            rows = prepare(self.model, self.config, state.n, chunk, reservoir)
            conditioned = self.model.exact_conditioned(state.post, int(rows.shape[0]))
            # a value beyond what the model holds in its frame, as the API and cusp.Detector refuse it
            # (``beyond_limit``): one that reached a worker before the API knew the frame was taken where
            # its statistics held it, and left `student-t` at its grid's edge, every later chunk refused
            # (a warm-up with an sd of 1e-5, then 1e148: a new user's trial; cusp replay stopped later).
            # The frame before the chunk, or the one the chunk's warm-up rows fix (checked on the rows
            # after them, once the update has made it: nothing is kept until this returns)
            frame = self.model.frame(state.post) if self.model.has_frame else None
            self._refuse_beyond(frame, chunk, 0)
            post, lp = self.model.exact_update(state.post, rows)
            if self.model.has_frame and frame is None and conditioned < int(chunk.shape[0]):
                self._refuse_beyond(self.model.frame(post), chunk, conditioned)
            lp = float(lp)  # a plain float whatever the model returns (a numpy scalar would be stored as its repr)
            hook = getattr(self.model, "exact_warnings", None)
            warnings = tuple(hook(state.post, post)) if hook is not None else ()
            g = torch.Generator()
            g.set_state(state.rng)
            writes = algorithm_r(g, state.n, rows, self.config.reservoir_capacity)
        if not math.isfinite(lp) or not all(bool(np.isfinite(t.numpy()).all()) for t in _tensors(post)):
            # a value so far out that the statistics overflow float64 (e.g. 1e160 squared): refused,
            # state unchanged (the worker dead-letters it at once), never a -inf or NaN evidence
            fr = self.model.frame_info(state.post)
            where = ""
            if fr and fr.get("scale") is not None:
                at = overflowing(chunk, fr["centre"], fr["scale"])
                row = f"row {at[0]}, {float(chunk[at]):.6g}, overflows " if at is not None else ""
                where = (f" ({row}in its frame: centre {fr['centre']}, scale {fr['scale']}, from the stream's first "
                         f"{fr['warmup_rows']} rows)")
            raise TooLarge(f"the chunk's exact update left float64 (its log predictive, {lp}, or its sufficient "
                           f"statistics): a value in it is too large for this model{where}")
        b = int(rows.shape[0])
        new = ExactState(post=post, log_evidence=state.log_evidence + lp, n=state.n + b, chunks=state.chunks + 1,
                         rng=g.get_state(), layout=exact_layout(self.model, post))
        result = ChunkResult(
            n=new.n, rows=b, log_evidence=new.log_evidence, log_predictive=lp, annealing_steps=0,
            ess_before=None, ess_after=None, ess_min=None, resamples=0, capped=False,
            seconds=time.perf_counter() - t0, method=self.method, conditioned=conditioned, warnings=warnings,
        )
        return new, result, writes


def _within(chunk: np.ndarray, centre, scale, limit: float) -> bool:
    """Are all of ``chunk [B, C]``'s values within ``limit`` scales of the centre (a few us, where
    ``beyond_limit``'s torch ops took 30-50 a row, on every challenger's update too)?"""
    if isinstance(centre, float) and chunk.size <= 64:  # (one column, a few rows: plain floats are quickest)
        reach = limit * scale
        return all(abs(v - centre) <= reach for v in chunk.ravel().tolist())
    with np.errstate(over="ignore", invalid="ignore"):
        return bool((np.abs(chunk - np.asarray(centre, dtype=np.float64)) <= limit * np.asarray(scale, dtype=np.float64)).all())


def _tensors(post) -> list[torch.Tensor]:
    """The tensors of a posterior (a tensor, or a tuple/list/dict of them, nested)."""
    if isinstance(post, torch.Tensor):
        return [post]
    if isinstance(post, dict):
        post = list(post.values())
    if isinstance(post, (list, tuple)):
        return [t for p in post for t in _tensors(p)]
    return []

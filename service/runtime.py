"""Building a stream's samplers from its config: shared by the API (validation, initial
state) and the worker (processing), so both agree on models, settings and seeds."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from models import Model, build_model
from service.seeding import seed_for
from service.sgais import SGAISConfig, Sampler, build_sampler
from service.store import ModelEntry, StreamConfig


@lru_cache(maxsize=4096)
def cached_model(spec: str, n_columns: int, target: int | None) -> Model:
    """``build_model`` memoised: models are frozen, and ingest validates every chunk against
    every model of its stream, so the spec is parsed once rather than per request."""
    return build_model(spec, n_columns, target)


def sampler_config(cfg: StreamConfig) -> SGAISConfig:
    return SGAISConfig.preset(cfg.sampler.get("preset", "paper"), **cfg.sampler.get("overrides", {}))


def build(cfg: StreamConfig, entry: ModelEntry) -> Sampler:
    return build_sampler(build_model(entry.spec, len(cfg.columns), entry.target), sampler_config(cfg))


def model_seed(cfg: StreamConfig, entry: ModelEntry) -> int:
    """Each model of a stream gets its own generator, derived from the stream's seed."""
    return seed_for(cfg.seed, cfg.models.index(entry))


def rows_from_bytes(raw: bytes, n: int, width: int) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(raw, dtype="<f8").reshape(n, width).astype(np.float64))


def log_model_priors(cfg: StreamConfig) -> dict[str, float]:
    """The models' log prior probabilities, normalised in logs: priors may be as large as 1e308 or as small as 5e-324."""
    top = max(m.prior for m in cfg.models)
    log_total = math.log(top) + math.log(sum(m.prior / top for m in cfg.models))
    return {m.name: math.log(m.prior) - log_total for m in cfg.models}


def stream_answer(cfg: StreamConfig):
    """A new ``service.detect.StreamAnswer`` for the stream: its models' names and priors, its
    detector's threshold, its resolution (``stream_window``). Workers, ``cusp.Detector`` and
    ``cusp replay`` build it alike, so they agree on the stream's change points."""
    from service.detect import DetectorConfig, StreamAnswer, stream_window

    dcfg = DetectorConfig.from_dict(cfg.detector)
    models = [cached_model(m.spec, len(cfg.columns), m.target) for m in cfg.models]
    return StreamAnswer([m.name for m in cfg.models], stream_window(models, dcfg), dcfg.threshold, log_model_priors(cfg))

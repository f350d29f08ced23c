"""SGAIS settings: one frozen config, given once to ``build_sampler``."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any


class ConfigError(ValueError):
    """Sampler settings that cannot work (named in the message)."""


#: the paper's particles and step size (papers/001 section 6.1): the defaults of a model that
#: asks for no others (``Model.sgais_particles``, ``sgais_lr``)
PARTICLES = 10
LR = 0.1


@dataclass(frozen=True)
class SGAISConfig:
    """Defaults are the paper's (papers/001 section 6.1) plus systematic resampling.

    particles: M (None: the model's ``sgais_particles``, 30 for logistic regression, else the
    paper's 10). target_ess: the ESS the adaptive schedule aims for after each reweighting,
    as a fraction of M (paper: 5 of 10). sghmc_steps: SGHMC steps per intermediate
    distribution. lr: eta = lr / n, n the observations seen including the current chunk
    (None: the model's ``sgais_lr``, 0.3 for logistic regression, else the paper's 0.1).
    alpha: momentum decay. beta_hat: gradient-noise correction (euler only). batch_size:
    mini-batch drawn with replacement from the reservoir per SGHMC step. resample:
    'systematic', 'multinomial' or 'none' (the paper's plain form). resample_threshold:
    resample when the ESS falls below this fraction of M (None: the target, so every
    intermediate step that met the target resamples). integrator: 'euler' (paper) or
    'baoab'. control_variates: history gradient with a control variate around a reference
    point whose full-reservoir gradient is kept up to date incrementally. max_steps: cap on
    annealing steps per chunk (the last step then jumps to lambda = 1, flagged ``capped``).
    control_variates None: the model's default (``prefers_control_variates``: on for logistic
    regression, whose error otherwise grows ~0.4 nats per chunk from mini-batch noise).
    jumps: mode-jumping Metropolis-Hastings proposals per particle after each SGHMC run, for
    models that have them (``propose_jump``: the mixture), in the chunks that want them
    (``Sampler._jumps_wanted``); 0 turns them off. warmup: SGHMC steps per run are
    sghmc_steps x (1 + warmup x rows / n), n including the chunk (None: the model's
    ``sgais_warmup``, 9 for the mixture and logistic regression, else 0): ten times as many on the first
    chunk, which carries the whole prior-to-posterior move (the paper's 20 left -18 to -116 nats
    on a 5-cluster mixture and about -100 on logistic regression after 500 rows), falling like
    1/n; about +25 % SGHMC work over 200 chunks. 0: the paper's constant steps. None with
    ``first_draws`` on a model that has them (the mixture): 0, the draws carry the first chunk
    (2026-11-28, 3 seeds at the paper preset, errors against ``cusp bench evidence``'s references:
    the same within the seeds' spread on the 3 -> 5 -> 7 clusters at 1e3-1e5 rows, K = 3 and 7,
    stationary clusters and raw units; the late clusters' mean over 6 seeds -30 nats against -19;
    the time 15-40 % less). The detector's restarts, which run without draws, keep it.
    first_draws: for models with a fitted proposal (``Model.first_draws``: the mixture), the
    first chunk's evidence is also estimated by importance sampling with this many draws from a
    law fitted to the chunk, and the two unbiased estimates of its evidence, the annealing's and
    the draws', are averaged (``Sampler._first_chunk``); 0 turns it off (annealing alone). The
    stream's first chunk only: the detector's restarts run without (``Detector.restarts``).
    check_draws: the same at every mode check of the mixture while the reservoir holds every
    row (powers of two of n, and after a surprising chunk), with this many draws around the
    check's fit, half from its Laplace law: a fresh estimate of the evidence so far, averaged with the
    running one (``Sampler._check_modes``); 0 turns it off. 150 was tried (2026-11-28): the same
    errors against ``cusp bench evidence``'s references (6-8 sampler seeds each: the late clusters
    -10.0 and -17.3 nats mean against -16.6 and -15.8, the 3 -> 5 -> 7 clusters at 1e5, K = 3, 5,
    7, -23.8, -32.4, -30.6 against -22.8, -34.8, -36.2, stationary clusters -20.9 against -23.0)
    at 11 % less time on the late clusters, but the particles redrawn from the check at 1,024
    rows predicted worse, and on the paper's clusters shuffled, K = 3, the detector reported a
    change at 2,000 on 1 of 20 sampler seeds (seed 0, the detect bench's), none with 300.
    """

    particles: int | None = None
    target_ess: float = 0.5
    sghmc_steps: int = 20
    lr: float | None = None
    alpha: float = 0.2
    beta_hat: float = 0.0
    batch_size: int = 500
    reservoir_capacity: int = 100_000
    resample: str = "systematic"
    resample_threshold: float | None = None
    integrator: str = "euler"
    control_variates: bool | None = None
    max_steps: int = 2000
    jumps: int = 1
    warmup: float | None = None
    first_draws: int = 1000
    check_draws: int = 300

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        need(self.particles is None or (isinstance(self.particles, int) and not isinstance(self.particles, bool)
                                        and 2 <= self.particles <= 100_000),
             "particles must be an integer in [2, 100000] or null (the model's default)")
        need(0.0 < self.target_ess < 1.0, "target_ess is a fraction of the particles, strictly between 0 and 1")
        need(isinstance(self.sghmc_steps, int) and 0 <= self.sghmc_steps <= 10_000, "sghmc_steps must be an integer in [0, 10000]")
        need(self.lr is None or (isinstance(self.lr, (int, float)) and not isinstance(self.lr, bool) and self.lr > 0
                                 and math.isfinite(self.lr)), "lr must be a positive number or null (the model's default)")
        need(0.0 < self.alpha <= 1.0, "alpha must be in (0, 1]")
        need(0.0 <= self.beta_hat <= self.alpha, "beta_hat must be in [0, alpha]")
        need(isinstance(self.batch_size, int) and 1 <= self.batch_size <= 1_000_000, "batch_size must be an integer in [1, 1000000]")
        need(isinstance(self.reservoir_capacity, int) and self.reservoir_capacity >= 1, "reservoir_capacity must be a positive integer")
        need(self.resample in ("systematic", "multinomial", "none"), "resample must be 'systematic', 'multinomial' or 'none'")
        need(self.resample_threshold is None or 0.0 < self.resample_threshold <= 1.0, "resample_threshold must be in (0, 1]")
        need(self.integrator in ("euler", "baoab"), "integrator must be 'euler' or 'baoab'")
        need(isinstance(self.max_steps, int) and self.max_steps >= 1, "max_steps must be a positive integer")
        need(self.control_variates is None or isinstance(self.control_variates, bool),
             "control_variates must be true, false or null (the model's default)")
        need(self.warmup is None or (isinstance(self.warmup, (int, float)) and not isinstance(self.warmup, bool)
                                     and 0.0 <= self.warmup <= 1000.0), "warmup must be a number in [0, 1000] or null")
        need(isinstance(self.jumps, int) and not isinstance(self.jumps, bool) and 0 <= self.jumps <= 100, "jumps must be an integer in [0, 100]")
        need(isinstance(self.first_draws, int) and not isinstance(self.first_draws, bool) and 0 <= self.first_draws <= 100_000,
             "first_draws must be an integer in [0, 100000]")
        need(isinstance(self.check_draws, int) and not isinstance(self.check_draws, bool) and 0 <= self.check_draws <= 100_000,
             "check_draws must be an integer in [0, 100000]")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "SGAISConfig":
        """'paper' (the paper's defaults with resampling) or 'accurate' (see PRESETS)."""
        if name not in PRESETS:
            raise ConfigError(f"unknown sampler preset {name!r}; known: {', '.join(PRESETS)}")
        config = cls.from_dict({**PRESETS[name], **overrides})
        if config.sghmc_steps == 0:
            # (allowed in the class, where a test isolates the mode jumps with 1,000 particles; a
            # stream's 10 particles then moved by a mixture's occasional mode jump alone: its
            # log-evidence fell 1,800 nats in one chunk, then was restated, the trial of 2026-12-06)
            raise ConfigError("sghmc_steps must be at least 1: with 0 nothing but a mixture's occasional mode jump moves "
                              "the particles, the annealing only reweights and resamples them, and the log-evidence is "
                              "then far too low")
        return config

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "SGAISConfig":
        known = {f.name: f for f in fields(cls)}
        bad = sorted(set(values) - set(known))
        if bad:
            raise ConfigError(f"unknown sampler setting(s) {', '.join(bad)}; known: {', '.join(known)}")
        try:
            return cls(**values)
        except TypeError as exc:  # pragma: no cover - defensive
            raise ConfigError(str(exc)) from None

    def for_model(self, model: Any) -> "SGAISConfig":
        """These settings with the model's own defaults where they are None (``particles``,
        ``lr``, ``control_variates``, ``warmup``): what a sampler runs with."""
        def own(value: Any, attr: str, default: Any) -> Any:
            return value if value is not None else getattr(model, attr, default)

        drawn = self.first_draws > 0 and hasattr(model, "first_draws")  # the first chunk's draws stand in for a warm-up
        return replace(self, particles=own(self.particles, "sgais_particles", PARTICLES), lr=own(self.lr, "sgais_lr", LR),
                       control_variates=own(self.control_variates, "prefers_control_variates", False),
                       warmup=own(self.warmup, "sgais_warmup", 0.0) if not (drawn and self.warmup is None) else 0.0)

    def replace(self, **changes: Any) -> "SGAISConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def run_steps(self, n_prev: int, rows: int, model_warmup: float = 0.0) -> int:
        """SGHMC steps per run for a chunk of ``rows`` after ``n_prev`` observations:
        sghmc_steps x (1 + warmup x rows / (n_prev + rows)), warmup None: ``model_warmup``."""
        w = model_warmup if self.warmup is None else self.warmup
        return int(round(self.sghmc_steps * (1.0 + w * rows / (n_prev + rows))))

    @property
    def resample_fraction(self) -> float:
        """Resample when the ESS falls below this fraction of the particles."""
        return self.resample_threshold if self.resample_threshold is not None else self.target_ess


PRESETS: dict[str, dict[str, Any]] = {
    # the paper's settings plus this engine's corrections (mode jumps, first-chunk warm-up, control
    # variates where the model asks for them); "paper-plain": the paper's Algorithm 1 as published
    "paper": {},
    "paper-plain": {"jumps": 0, "warmup": 0.0, "first_draws": 0, "check_draws": 0, "control_variates": False, "particles": PARTICLES, "lr": LR},
    # lower bias (docs/benchmarks.md): BAOAB splitting, control-variate history gradients,
    # more particles
    "accurate": {"integrator": "baoab", "control_variates": True, "particles": 30},
}

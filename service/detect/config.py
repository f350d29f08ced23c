"""The detector's settings (``DetectorConfig``): validated, with a clear error naming the setting."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from service.sgais.config import ConfigError
from service.times import TimeError, parse_duration

#: observations between changes a duration stands for while a stream's rows span no time yet
DEFAULT_RUN_LENGTH = 1000.0

#: ``expected_run_length="auto"``: no time scale assumed. A regime's length L has the scale-free
#: (Lomax) prior P(L > r) = (1 + r / AUTO_R0)^-AUTO_ALPHA, so a change within the next B rows,
#: given r rows without one, has probability 1 - ((AUTO_R0 + r) / (AUTO_R0 + r + B))^AUTO_ALPHA:
#: after r quiet rows a change within the next r is 1 - 2^-0.1 = 7 % likely whatever r is, so
#: a series of 20 yearly values and a stream of 10^6 readings a second are judged alike. The
#: hazard per row, about AUTO_ALPHA / r, is 1/1000 (a fixed 1000's) at r = 100: higher before,
#: lower after (``Detector.log_prior_odds``)
AUTO = "auto"
#: the default chunk size of a one-shot detection (``POST /v1/detect``, ``cusp replay --detect``) is
#: ceil(rows / this): at most this many chunks
DETECT_DEFAULT_CHUNKS = 250
AUTO_ALPHA = 0.1
AUTO_R0 = 1.0


@dataclass(frozen=True)
class DetectorConfig:
    """expected_run_length: ``"auto"`` (the default): no time scale, the prior probability of a
    change follows the rows seen since the last one (``AUTO``); or the prior mean observations
    between changes (hazard = 1/this), or a
    duration ('30d', '12h', 'PT12H': ``service.times.parse_duration``), turned into observations
    by the stream's mean time between rows so far (``Detector.update``'s ``seconds_per_row``;
    ``DEFAULT_RUN_LENGTH`` observations while its rows span no time);
    threshold: posterior probability of a change needed to report it; max_challengers:
    challengers alive at once (a model with level shifts, ``Model.exact_shift``: places, each
    with its kinds of restart, ``Detector._kinds``); adapt: replace the incumbent by the winning challenger;
    surprise: |z| of a chunk's log predictive per observation, against its running level,
    that nominates a candidate at that chunk; cusum: threshold of a two-sided CUSUM of those
    z-scores (drift 0.5) that nominates the chunk where its excursion began (small
    sustained shifts, point-by-point data); level_shift: a change is reported only if the
    incumbent's mean log predictive per observation since the candidate is this many standard
    errors off its level before it, or for a mixture its components' shares of those rows that far
    off their shares of the regime's rows before (``signals.shares_moved``) (0: off; it keeps a restart that merely escapes a poor
    posterior mode from counting as a change; sampled models only, ``Detector._eligible``); step_spike: annealing steps above running mean + this many
    sd that nominate one; train: observations a challenger sees before it is compared (at
    least its first chunk; 0 = max(10, 2 x parameters)); retire_log_bf: a challenger whose
    log BF falls below this is dropped; max_age: observations after which a challenger is
    dropped (0 = 20 x train, and the one furthest ahead at that age is watched on up to 20 x
    max(train, 10), ``Detector.long_age``; at least 8 of its first chunks; at most the reservoir capacity); warmup: chunks of running level needed
    after a start or a change before nominating; smoothing: weight of the newest chunk in
    the running levels (before ``warmup`` chunks, a chunk whose log predictive per
    observation falls below the mean so far is a candidate); count_change_prior: at a restart
    the model's running log-evidence becomes its evidence over the hypotheses it compared (no
    change, a change at each challenger's place, at their prior odds), not the evidence given
    the change it adopted (``Detector.marginal_gain``; off by default: README, "The default portfolio");
    enabled: run the detector at all."""

    enabled: bool = True
    expected_run_length: float | str = AUTO
    threshold: float = 0.99
    max_challengers: int = 3
    adapt: bool = True
    surprise: float = 3.0
    cusum: float = 5.0
    level_shift: float = 3.0
    step_spike: float = 3.0
    train: int = 0
    retire_log_bf: float = -5.0
    max_age: int = 0
    warmup: int = 5
    smoothing: float = 0.1
    count_change_prior: bool = False

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:  # (with the value given: a new user's "0.9", a string, read as a bad probability)
                raise ConfigError(f"detector: {msg}, got {getattr(self, msg.split()[0])!r}")

        need(isinstance(self.enabled, bool), "enabled must be true or false")
        need(isinstance(self.adapt, bool), "adapt must be true or false")
        need(isinstance(self.count_change_prior, bool), "count_change_prior must be true or false")
        if self.expected_run_length == AUTO:
            pass
        elif isinstance(self.expected_run_length, str):
            try:
                parse_duration(self.expected_run_length, "expected_run_length")
            except TimeError as exc:
                raise ConfigError(f"detector: {exc}") from None
        else:
            need(_num(self.expected_run_length) and self.expected_run_length > 1,
                 "expected_run_length must be a number > 1 (observations), a duration such as '30d' or 'PT12H', "
                 "or 'auto'")
        need(_num(self.threshold) and 0.5 <= self.threshold < 1.0, "threshold must be a probability in [0.5, 1)")
        need(_int(self.max_challengers) and 1 <= self.max_challengers <= 16, "max_challengers must be an integer in [1, 16]")
        need(_num(self.surprise) and self.surprise > 0, "surprise must be a positive number")
        need(_num(self.cusum) and self.cusum > 0, "cusum must be a positive number")
        need(_num(self.level_shift) and self.level_shift >= 0, "level_shift must be a number >= 0")
        need(_num(self.step_spike) and self.step_spike > 0, "step_spike must be a positive number")
        need(_int(self.train) and 0 <= self.train <= 1_000_000, "train must be an integer in [0, 1000000]")
        need(_num(self.retire_log_bf) and self.retire_log_bf < 0, "retire_log_bf must be a negative number")
        need(_int(self.max_age) and 0 <= self.max_age <= 10_000_000, "max_age must be an integer in [0, 10000000]")
        need(_int(self.warmup) and 2 <= self.warmup <= 10_000, "warmup must be an integer in [2, 10000]")
        need(_num(self.smoothing) and 0 < self.smoothing < 1, "smoothing must be in (0, 1)")

    @property
    def run_length_seconds(self) -> float | None:
        """expected_run_length in seconds when it is a duration, else None (observations)."""
        if isinstance(self.expected_run_length, str) and self.expected_run_length != AUTO:
            return parse_duration(self.expected_run_length, "expected_run_length")
        return None

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> "DetectorConfig":
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        bad = sorted(set(values) - known)
        if bad:
            raise ConfigError(f"unknown detector setting(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
        try:
            return cls(**values)
        except TypeError as exc:  # pragma: no cover - defensive
            raise ConfigError(f"detector: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)

"""Model registry and spec parsing: ``gmm:components=5``, ``gaussian:mu0=0,kappa0=0.1``."""

from __future__ import annotations

import dataclasses
import math
import re

from models.base import Model, ModelError
from models.linear import LinearRegression, LogisticRegression
from models.mixture import Gaussian, GaussianMixture
from models.timeseries import Autoregressive, Level, Poisson, Seasonal, Trend

REGISTRY: dict[str, type[Model]] = {
    cls.name: cls for cls in (LinearRegression, LogisticRegression, GaussianMixture, Gaussian, Level, Autoregressive,
                              Trend, Seasonal, Poisson)
}
#: What a stream gets when it is created without a model list: for one column (a metric series)
#: a constant level, an autoregression and a linear trend, each in the series' own frame
#: (models/timeseries.py), so the model average can tell a trend or a persistent wander from a
#: change; for several columns, independent Gaussians per column with the same frame idea is not
#: there yet, so the fixed-prior ``gaussian``.
DEFAULT_PORTFOLIO = {1: ("level", "ar", "trend")}


def default_portfolio(n_columns: int) -> tuple[str, ...]:
    """The model specs of a stream with ``n_columns`` columns created without a model list."""
    return DEFAULT_PORTFOLIO.get(n_columns, ("gaussian",))


#: models whose data split into features and a target column
SUPERVISED = {"linear-regression", "logistic-regression"}

_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


def settings_of(cls: type[Model]) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.name not in ("n_columns", "target")}


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``'gmm:components=5'`` -> ``('gmm', {'components': '5'})``; raises ModelError naming what is wrong."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelError("model spec must be a non-empty string like 'gmm:components=5'")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if name not in REGISTRY:
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(sorted(REGISTRY))}")
    params: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ModelError(f"model {name!r}: setting {item!r} is not key=value")
        if key in params:
            raise ModelError(f"model {name!r}: setting {key!r} given twice")
        params[key] = value.strip()
    return name, params


def _coerce(model: str, key: str, field: dataclasses.Field, raw: str) -> object:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    try:
        if kind == "int":
            value: object = int(raw)
        elif kind == "float":
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError
        else:
            value = raw
    except ValueError:
        raise ModelError(f"model {model!r}: setting {key}={raw!r} is not a valid {kind}") from None
    return value


def build_model(spec: str, n_columns: int, target: int | None = None) -> Model:
    """Build a model from its spec for data with ``n_columns`` columns (``target``: the target
    column's index for regression models, default the last column)."""
    name, raw = parse_spec(spec)
    cls = REGISTRY[name]
    known = settings_of(cls)
    kwargs: dict[str, object] = {}
    for key, value in raw.items():
        if key not in known:
            valid = ", ".join(sorted(known)) or "none"
            raise ModelError(f"model {name!r} has no setting {key!r}; its settings: {valid}")
        kwargs[key] = _coerce(name, key, known[key], value)
    if name in SUPERVISED:
        if n_columns < 2:
            raise ModelError(f"model {name!r} needs at least 2 columns (features and a target), got {n_columns}")
        if target is not None:
            kwargs["target"] = target
    elif n_columns < 1:
        raise ModelError(f"model {name!r} needs at least 1 column")
    model = cls(n_columns=n_columns, **kwargs)
    model.check_sampler()
    return model

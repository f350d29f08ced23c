"""Model registry and spec parsing: ``gmm:components=5``, ``gaussian:mu0=0,kappa0=0.1``.

Plug-ins: an installed distribution adds models through the entry-point group ``cusp.models``
(``name = "package.module:ModelClass"``; README, "Your own models"). They are loaded once, on
the first lookup, and merged with the built-in ``REGISTRY`` by ``models()``; ``build_model`` and
``parse_spec`` (so ``cusp replay``, the API's validation at create, the workers and
``cusp.Detector``) all look names up there. A plug-in that cannot be used (its import fails, it
is not a ``Model`` subclass, its ``name`` differs from its entry point's, or the name is a
built-in's or another plug-in's) is not merged: a spec naming it raises a ModelError that says
why, and other models are unaffected.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import math
import re
import threading

from models.base import Model, ModelError
from models.linear import LinearRegression, LogisticRegression
from models.mixture import Gaussian, GaussianMixture
from models.counts import NegativeBinomial, NegativeBinomialAlias
from models.heavy import StudentT
from models.timeseries import Autoregressive, Level, LocalSeasonal, LocalTrend, Poisson, Seasonal, Trend

REGISTRY: dict[str, type[Model]] = {
    cls.name: cls for cls in (LinearRegression, LogisticRegression, GaussianMixture, Gaussian, Level, Autoregressive,
                              Trend, LocalTrend, LocalSeasonal, Seasonal, Poisson, NegativeBinomial, NegativeBinomialAlias, StudentT)
}
#: What a stream gets when it is created without a model list: for one column (a metric series)
#: a constant level, an autoregression, a linear trend, Student-t tails and a season of unknown
#: calendar period, each in the series' own frame (models/timeseries.py, models/heavy.py), so
#: the model average can tell a trend, a persistent wander, a season or an outlier from a
#: change (student-t added after `cusp bench detect --metrics`: mean F1 / covering 0.841 /
#: 0.829 -> 0.889 / 0.869 on the metric set; seasonal on 2026-11-26: README, "The default
#: portfolio"); for several columns, independent Gaussians per column in the same kind of frame
#: (``gaussian:warmup=5``: the paper's prior on each column's (y - centre) / scale from its first 5
#: rows; in the data's units a column of 1,000 +- 5 hid a 4-sd shift for 300 rows and more).
DEFAULT_PORTFOLIO = {1: ("level", "ar", "trend", "student-t", "seasonal")}
#: the default for streams of several columns
DEFAULT_MULTI_COLUMN = ("gaussian:warmup=5",)


def default_model_name(spec: str) -> str:
    """A model's name where none was given: its spec with ':' as '_', '=' left out and any other
    character outside a name's ('_', '.', '-', letters, digits) as '_', at most 64 characters
    (``gmm:components=5`` -> ``gmm_components5``). The API, ``cusp.Detector`` and ``cusp replay``
    name models so; the result may still fail ``service.store.keys.MODEL_NAME`` (a spec starting
    with '_')."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", spec.replace(":", "_").replace("=", ""))[:64]


def same_name(spec: str, others) -> str | None:
    """The first of ``others`` that ``default_model_name`` names as it names ``spec`` (two models
    that would share a name: ``cusp replay`` and ``cusp.Detector`` refuse such a list, as the API
    does), else None."""
    name = default_model_name(spec)
    return next((s for s in others if default_model_name(s) == name), None)


def default_portfolio(n_columns: int) -> tuple[str, ...]:
    """The model specs of a stream with ``n_columns`` columns created without a model list."""
    return DEFAULT_PORTFOLIO.get(n_columns, DEFAULT_MULTI_COLUMN)


#: models whose data split into features and a target column
SUPERVISED = {"linear-regression", "logistic-regression"}

_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


#: the entry-point group of model plug-ins
PLUGIN_GROUP = "cusp.models"

log = logging.getLogger("cusp.models")
_plugins: dict[str, type[Model]] | None = None
_broken: dict[str, str] = {}  # name -> why its plug-in is not used
_lock = threading.Lock()


def _check_plugin(ep: importlib.metadata.EntryPoint, seen: dict[str, type[Model]]) -> type[Model]:
    """The entry point's Model class, or ModelError saying why it cannot be used."""
    where = f"plug-in {ep.name!r} ({ep.value}" + (f", from {ep.dist.name} {ep.dist.version})" if ep.dist else ")")
    if not _NAME.fullmatch(ep.name):
        raise ModelError(f"{where}: a model name must be lower-case letters, digits and '-', starting with a letter")
    if ep.name in REGISTRY:
        raise ModelError(f"{where}: {ep.name!r} is a built-in model's name; give the plug-in another name")
    if ep.name in seen:
        raise ModelError(f"{where}: another plug-in ({seen[ep.name].__module__}.{seen[ep.name].__qualname__}) "
                         f"registers {ep.name!r} too; uninstall one")
    try:
        cls = ep.load()
    except Exception as exc:  # noqa: BLE001 - any failure to import a plug-in is reported, never fatal
        raise ModelError(f"{where}: cannot be imported: {type(exc).__name__}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Model)):
        raise ModelError(f"{where}: {cls!r} is not a subclass of models.base.Model")
    if not dataclasses.is_dataclass(cls):
        raise ModelError(f"{where}: {cls.__qualname__} must be a dataclass (@dataclass(frozen=True)), like models.base.Model")
    if cls.name != ep.name:
        raise ModelError(f"{where}: {cls.__qualname__}.name is {cls.name!r}; it must be the entry point's name {ep.name!r}")
    return cls


def load_plugins(refresh: bool = False) -> dict[str, type[Model]]:
    """The usable model plug-ins of the ``cusp.models`` entry-point group: name -> Model class,
    loaded once per process (``refresh``: look again, after installing or removing one)."""
    global _plugins
    with _lock:
        if _plugins is not None and not refresh:
            return _plugins
        found: dict[str, type[Model]] = {}
        broken: dict[str, str] = {}
        for ep in sorted(importlib.metadata.entry_points(group=PLUGIN_GROUP), key=lambda e: (e.name, e.value)):
            try:
                found[ep.name] = _check_plugin(ep, found)
            except ModelError as exc:
                broken[ep.name] = str(exc)
                log.error("%s", exc)
        for name in broken:  # a name two plug-ins claim is used by neither
            found.pop(name, None)
        if found:
            log.info("model plug-ins: %s", ", ".join(f"{n} ({c.__module__}.{c.__qualname__})" for n, c in sorted(found.items())))
        _broken.clear()
        _broken.update(broken)
        _plugins = found
        return _plugins


def models() -> dict[str, type[Model]]:
    """Every model a spec may name: the built-ins (``REGISTRY``) and the usable plug-ins."""
    return {**REGISTRY, **load_plugins()}


def broken_plugins() -> dict[str, str]:
    """Plug-ins that are installed but not used: name -> why (after ``load_plugins``)."""
    load_plugins()
    return dict(_broken)


def settings_of(cls: type[Model]) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.name not in ("n_columns", "target")}


def spec_problem(spec: str) -> str | None:
    """What is wrong with how ``spec`` is written that ``parse_spec`` lets pass (None: nothing): an
    empty setting ('level:', 'gmm:components=5,'). Checked where a spec comes in (a stream, ``POST
    /v1/detect``); ``parse_spec`` stays lenient for the specs of streams stored before."""
    name, colon, rest = spec.strip().partition(":")
    if colon and not rest.strip():
        return f"nothing after ':' (write {name.strip()!r}, or its settings: '{name.strip()}:key=value')"
    if colon and any(not p.strip() for p in rest.split(",")):
        return "an empty setting (a comma too many)"
    return None


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``'gmm:components=5'`` -> ``('gmm', {'components': '5'})``; raises ModelError naming what is wrong."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelError("model spec must be a non-empty string like 'gmm:components=5'")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    known = models()
    if name not in known:
        if name in _broken:
            raise ModelError(_broken[name])
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(sorted(known))}")
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
    cls = models()[name]
    known = settings_of(cls)
    kwargs: dict[str, object] = {}
    for key, value in raw.items():
        if key not in known:
            # (a family's settings this model does not take, ``not_taken``, are refused by the model
            # naming the one that has them: not listed as its own)
            valid = ", ".join(sorted(set(known) - set(getattr(cls, "not_taken", {})))) or "none"
            raise ModelError(f"model {name!r} has no setting {key!r}; its settings: {valid}")
        kwargs[key] = _coerce(name, key, known[key], value)
    if name in SUPERVISED:
        if n_columns < 2:
            raise ModelError(f"model {name!r} needs at least 2 columns (features and a target), got {n_columns}")
        if target is not None:
            kwargs["target"] = target
    elif n_columns < 1:
        raise ModelError(f"model {name!r} needs at least 1 column")
    try:
        model = cls(n_columns=n_columns, **kwargs)
    except ModelError:
        raise
    except (TypeError, ValueError) as exc:  # a plug-in's own checks may raise plain errors
        raise ModelError(f"model {name!r}: {exc}") from None
    model.check_sampler()
    return model

"""cusp's Bayesian models and the registry that builds them from ``name:key=value,...`` specs."""

from models.base import Model, ModelError
from models.registry import REGISTRY, build_model, parse_spec

__all__ = ["Model", "ModelError", "REGISTRY", "build_model", "parse_spec"]

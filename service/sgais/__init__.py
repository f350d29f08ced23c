"""The SGAIS engine: pure torch, no IO. See engine.py for the algorithm and weights.py for
the weight conventions."""

from service.sgais.config import PRESETS, ConfigError, SGAISConfig
from service.sgais.engine import WARNINGS, ChunkResult, EngineError, Sampler, TooLarge, build_sampler, full_data_ais
from service.sgais.exact import ExactSampler, ExactState
from service.sgais.reservoir import Reservoir, ReservoirWrites, algorithm_r
from service.sgais.state import SGAISState, load_state

__all__ = [
    "PRESETS", "WARNINGS", "ChunkResult", "ConfigError", "EngineError", "ExactSampler", "ExactState", "Reservoir",
    "ReservoirWrites", "SGAISConfig", "SGAISState", "Sampler", "TooLarge", "algorithm_r", "build_sampler", "full_data_ais",
    "load_state",
]

"""The SGAIS engine: pure torch, no IO. See engine.py for the algorithm and weights.py for
the weight conventions."""

from service.sgais.config import PRESETS, ConfigError, SGAISConfig
from service.sgais.engine import ChunkResult, EngineError, Sampler, build_sampler, full_data_ais
from service.sgais.reservoir import Reservoir, ReservoirWrites, algorithm_r
from service.sgais.state import SGAISState

__all__ = [
    "PRESETS", "ChunkResult", "ConfigError", "EngineError", "Reservoir", "ReservoirWrites", "SGAISConfig",
    "SGAISState", "Sampler", "algorithm_r", "build_sampler", "full_data_ais",
]

"""The exact method never returns a non-finite evidence: a chunk whose statistics overflow
float64 is refused with EngineError and the state is left as it was (the worker retries, then
dead-letters the chunk). Before, `level` took 1e160 and returned log-evidence -inf, then NaN for
every later chunk, with no warning."""

from __future__ import annotations

import pytest
import torch

from models import build_model
from service.sgais import EngineError, SGAISConfig, build_sampler


@pytest.mark.parametrize("spec", ["level", "ar", "trend", "linear-regression"])
def test_an_overflowing_chunk_is_refused_and_changes_nothing(spec):
    width = 2 if spec == "linear-regression" else 1
    model = build_model(spec, width, 1 if width == 2 else None)
    sampler = build_sampler(model, SGAISConfig())
    g = torch.Generator().manual_seed(0)
    state, reservoir = sampler.init(0), sampler.new_reservoir()
    for _ in range(3):
        state, result, writes = sampler.update(state, torch.randn(10, width, generator=g, dtype=torch.float64), reservoir)
        reservoir.apply(writes)
    before = state.to_bytes()
    bad = torch.randn(10, width, generator=g, dtype=torch.float64)
    bad[4, -1] = 1e160
    with pytest.raises(EngineError, match="left float64"):
        sampler.update(state, bad, reservoir)
    assert state.to_bytes() == before
    # the next ordinary chunk goes on from the unchanged state
    _, result, _ = sampler.update(state, torch.randn(10, width, generator=g, dtype=torch.float64), reservoir)
    assert torch.isfinite(torch.tensor(result.log_evidence))

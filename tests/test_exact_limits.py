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
    # (a framed model: refused as the API refuses it, past its value_limit in the frame, before its
    # statistics could overflow; linear-regression: past the API's +-1e150, its statistics overflow)
    with pytest.raises(EngineError, match="row 4 column .: 1e\\+160 is too large for this model|left float64"):
        sampler.update(state, bad, reservoir)
    assert state.to_bytes() == before
    # the next ordinary chunk goes on from the unchanged state
    _, result, _ = sampler.update(state, torch.randn(10, width, generator=g, dtype=torch.float64), reservoir)
    assert torch.isfinite(torch.tensor(result.log_evidence))


@pytest.mark.parametrize("spec", ["student-t", "level"])
def test_a_value_past_the_frames_limit_is_refused_by_the_sampler_as_by_the_api(spec):
    """A warm-up with an sd of about 1e-5, then 1e148 (1e153 of the frame's scales, past the models'
    1e150): the exact update took it where its statistics held it, and `student-t` was left at its
    grid's edge, refusing every later ordinary chunk (a new user's trial: the API refuses it only
    once it knows the frame, so a chunk sent at once reached the worker). The sampler refuses it as
    the API does (``beyond_limit``), the state unchanged, and goes on."""
    sampler = build_sampler(build_model(spec, 1), SGAISConfig())
    warm = torch.tensor([[1 + 1e-5 * (i % 3)] for i in range(10)], dtype=torch.float64)
    state, reservoir = sampler.init(0), sampler.new_reservoir()
    state, _, writes = sampler.update(state, warm, reservoir)
    reservoir.apply(writes)
    before = state.to_bytes()
    with pytest.raises(EngineError, match="row 0 column 0: 1e\\+148 is too large for this model's frame"):
        sampler.update(state, torch.cat([torch.tensor([[1e148]], dtype=torch.float64), warm[:9]]), reservoir)
    assert state.to_bytes() == before
    for _ in range(3):
        state, result, writes = sampler.update(state, warm, reservoir)
        reservoir.apply(writes)
        assert result.warnings == () and result.log_predictive > 90, result


@pytest.mark.parametrize("spec", ["student-t", "level", "gaussian:warmup=5"])
def test_a_value_past_the_limit_in_the_chunk_that_ends_the_warm_up_is_refused(spec):
    """The same value in a stream's first chunk, after the warm-up's rows: the frame those rows fix
    is made by this very update, and the rows after them are checked against it (a review: the
    check read the frame before the chunk, found none, and the chunk was taken)."""
    sampler = build_sampler(build_model(spec, 1), SGAISConfig())
    state, reservoir = sampler.init(0), sampler.new_reservoir()
    chunk = torch.tensor([[1 + 1e-5 * (i % 3)] for i in range(9)] + [[1e148]], dtype=torch.float64)
    before = state.to_bytes()
    with pytest.raises(EngineError, match="row 9 column 0: 1e\\+148 is too large for this model's frame"):
        sampler.update(state, chunk, reservoir)
    assert state.to_bytes() == before
    _, result, _ = sampler.update(state, chunk[:9], reservoir)  # (without it: taken)
    assert result.n == 9

"""The demo stream's data lives in the service (``cusp serve --demo`` must not need the
benchmarks package); the benchmarks import it from there. Its numbers are pinned: the recorded
benchmarks (docs/benchmarks.md) and the evidence references were computed on them."""

import pytest
import torch

from bench.data import distribution_shift_data as bench_data
from service.demo import distribution_shift_data


@pytest.mark.parametrize("n,seed,changes,total,first,last,found", [
    (20_001, 3, (1_000, 10_000), 10662.261075009661, [-4.753880259147835, -3.2348411296272035],
     [-5.612976176545072, 2.216402409401797], [1000, 10000]),
    (5_600, 0, (4_000, 10**9), -2052.670523559558, None, None, [4000]),
])
def test_demo_data_keeps_its_numbers(n, seed, changes, total, first, last, found):
    x, got = distribution_shift_data(n, seed, changes)
    assert x.shape == (n, 2) and x.dtype == torch.float64 and got == found
    assert float(x.sum()) == total
    if first is not None:
        assert x[0].tolist() == first and x[-1].tolist() == last
    assert bench_data is distribution_shift_data  # one definition


def test_no_rows():
    x, found = distribution_shift_data(0, 0)
    assert x.shape == (0, 2) and found == []


def test_demo_data_is_prefix_consistent():
    assert torch.equal(distribution_shift_data(9_000, 1)[0][:3_000], distribution_shift_data(3_000, 1)[0])

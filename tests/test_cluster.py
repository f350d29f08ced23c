"""cusp on a real 3-master Redis Cluster (tests/redis_cluster.py; CUSP_REDIS_URL=redis+cluster://...).

The service tests that matter run here again, unchanged, with the Redis URL swapped for the
cluster's: create, delete, ingest over HTTP and WebSocket, results, SSE and WebSocket feeds, the
wake-up channel, leases and fencing with in-process workers (tests/test_service.py), and worker
processes applying every chunk exactly once through SIGKILLs, a pause past the lease and a poison
chunk (tests/test_reliability.py). The tests below add what only a cluster shows: a stream's keys
and the global keys on different shards, the stream limit and the orphan sweep of a create cut in
two, the cluster URL's validation, and change points.
"""

import asyncio
import concurrent.futures
import uuid

import pytest

from service.settings import load_settings
from service.store import connect, keys
from service.store.api import ApiStore
from service.worker import Worker
from tests import test_reliability as rel
from tests import test_service as svc
from tests.service_fixtures import LiveServer, drain

# the service tests, on the cluster (their `redis_url` fixture is overridden below)
from tests.test_service import (  # noqa: F401 - collected here, with this module's fixtures
    live,
    test_create_ingest_process_and_read,
    test_idempotent_repeat_conflict_and_gap,
    test_input_kept_while_a_model_or_the_detector_needs_it,
    test_input_trimmed_once_applied_and_resends_still_recognised,
    test_live_evidence_websocket_and_sse_resume_without_gaps,
    test_an_idle_worker_wakes_on_ingest_not_on_its_timeout,
    test_late_write_after_lost_lease_is_fenced,
    test_metrics_health_docs_and_delete,
    test_poison_chunk_is_dead_lettered_and_others_go_on,
    test_stream_deleted_while_a_chunk_is_processed_is_not_a_fenced_write,
    test_two_workers_share_streams_without_double_applying,
    test_websocket_ingest_acks_and_errors,
    test_worker_killed_between_processing_and_applying,
)


@pytest.fixture(scope="module")
def redis_url(redis_cluster):
    return redis_cluster.url


@pytest.fixture(scope="module")
def cluster(redis_cluster, tmp_path_factory):
    """test_reliability's processes (an API-only `cusp serve`, a fork server for `cusp worker`
    processes) on the Redis Cluster."""
    procs = rel.Procs(tmp_path_factory.mktemp("procs"))
    try:
        workers = rel.ForkServer(procs, rel.cusp_env(redis_cluster.url))
        client = rel.start_api(procs, redis_cluster.url)
        yield procs, redis_cluster, client, workers
        client.close()
    finally:
        procs.close()


def node_of(r, key: str) -> str:
    return r.get_node_from_key(key).name


def name_on_another_shard(r, *global_keys: str) -> str:
    """A fresh stream name whose keys live on a master that holds none of ``global_keys``."""
    taken = {node_of(r, k) for k in global_keys}
    for _ in range(1000):
        s = "c" + uuid.uuid4().hex[:10]
        if node_of(r, keys.config(s)) not in taken:
            return s
    raise AssertionError("no stream name hashes to another master")


def test_a_streams_keys_share_one_slot_apart_from_the_global_keys(live, redis_url):
    """A stream on a master that holds neither the stream set nor the worker registry: created,
    fed, processed, listed and deleted; all of its keys on that one master."""
    r = connect(redis_url)
    s = name_on_another_shard(r, keys.STREAMS, keys.WORKERS)
    body = {"name": s, "columns": ["a", "b"], "models": ["gaussian", "gmm:components=2"], "seed": 3}
    assert live.client.post("/v1/streams", json=body).status_code == 201
    assert svc.post(live, s, 0, svc.gauss_rows(100)).status_code == 202
    assert drain(redis_url) == 2
    slots = {r.keyslot(k) for k in keys.stream_keys(s, ["gaussian", "gmm_components2"])}
    assert len(slots) == 1 and {r.keyslot(keys.STREAMS), r.keyslot(keys.WORKERS)}.isdisjoint(slots)
    assert r.exists(keys.state(s, "gmm_components2"), keys.out(s), keys.inbox(s)) >= 2
    assert s in live.client.get("/v1/streams").json()["streams"]
    assert live.client.delete(f"/v1/streams/{s}").status_code == 204
    assert s not in live.client.get("/v1/streams").json()["streams"] and not r.sismember(keys.STREAMS, s)


def test_change_points_on_the_cluster(live, redis_url):
    from tests.test_detect import shifts

    s = "cp" + uuid.uuid4().hex[:8]
    r = live.client.post("/v1/streams", json={"name": s, "columns": ["v"], "models": ["gaussian"], "seed": 9,
                                              "detector": {"threshold": 0.995}})
    assert r.status_code == 201, r.text
    x = shifts(4)[:600]
    for seq in range(60):
        assert svc.post(live, s, seq, x[10 * seq: 10 * seq + 10].tolist()).status_code == 202
        if seq == 30:
            drain(redis_url)  # a second worker restores the detector from Redis
    drain(redis_url)
    cps = live.client.get(f"/v1/streams/{s}/changepoints").json()["changepoints"]
    assert len(cps) == 1 and abs(cps[0]["location"] - 300) <= 10, cps


@pytest.mark.parametrize("backend", ["single", "cluster"])
def test_stream_limit_holds_under_concurrent_creates(backend, redis_cluster, tmp_path):
    """16 creates at once with room for 5 more streams: exactly 5 are created, the others are
    told the limit is reached (a check before the create, as it was, lets several through)."""
    from service.store import EmbeddedRedis

    embedded = EmbeddedRedis(tmp_path / "redis") if backend == "single" else None
    url = embedded.url if embedded else redis_cluster.url
    existing = len(connect(url).smembers(keys.STREAMS))
    server = LiveServer(url, max_streams=existing + 5)
    try:
        bodies = [{"name": "lim" + uuid.uuid4().hex[:8], "columns": ["a"], "models": ["gaussian"]} for _ in range(16)]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda b: server.client.post("/v1/streams", json=b), bodies))
        codes = sorted(a.status_code for a in answers)
        assert codes == [201] * 5 + [409] * 11, [a.text for a in answers]
        assert all("CUSP_MAX_STREAMS" in a.json()["detail"] for a in answers if a.status_code == 409)
        assert server.client.post("/v1/streams", json=bodies[0]).status_code == 409
        made = [b["name"] for b, a in zip(bodies, answers) if a.status_code == 201]
        for s in made:
            assert server.client.delete(f"/v1/streams/{s}").status_code == 204
        assert connect(url).scard(keys.STREAMS) == existing
    finally:
        server.stop()
        if embedded:
            embedded.close()


@pytest.mark.parametrize("backend", ["single", "cluster"])
def test_create_cut_in_two_leaves_an_orphan_name_that_is_hidden_reused_and_swept(backend, redis_cluster, tmp_path, monkeypatch):
    """An API process killed between its two create steps leaves a name in the stream set without
    a config: not listed, not processed, created normally if the client retries, and otherwise
    taken out of the set by a worker after a grace period."""
    from service import worker as worker_module
    from service.store import EmbeddedRedis

    embedded = EmbeddedRedis(tmp_path / "redis") if backend == "single" else None
    url = embedded.url if embedded else redis_cluster.url
    r = connect(url)
    server = LiveServer(url)
    try:
        retried, abandoned = "orA" + uuid.uuid4().hex[:8], "orB" + uuid.uuid4().hex[:8]
        store = ApiStore(url)

        async def reserve_only():  # the first step of ApiStore.create, as a killed API left it
            for s in (retried, abandoned):
                await store.reserve(s, 1000)
            await store.close()

        asyncio.run(reserve_only())
        assert r.sismember(keys.STREAMS, abandoned)
        listed = server.client.get("/v1/streams").json()["streams"]
        assert retried not in listed and abandoned not in listed
        assert server.client.get(f"/v1/streams/{abandoned}").status_code == 404
        body = {"name": retried, "columns": ["a"], "models": ["gaussian"]}
        assert server.client.post("/v1/streams", json=body).status_code == 201
        assert retried in server.client.get("/v1/streams").json()["streams"]
        monkeypatch.setattr(worker_module, "ORPHAN_GRACE_SECONDS", 0.0)
        w = Worker(url, worker_id="sweeper")
        try:
            w.poll_once()  # first sight of the orphan
            w.poll_once()  # past the grace period
        finally:
            w.release_all()
        assert not r.sismember(keys.STREAMS, abandoned) and r.sismember(keys.STREAMS, retried)
        assert server.client.delete(f"/v1/streams/{retried}").status_code == 204
    finally:
        server.stop()
        if embedded:
            embedded.close()


@pytest.mark.parametrize("url, message", [
    ("redis+cluster://", "bad seed node"),
    ("redis+cluster://127.0.0.1:7000/2", "only database 0"),
    ("redis+cluster://127.0.0.1:x", "bad seed node"),
    ("cluster://127.0.0.1:7000", "redis+cluster://"),
])
def test_bad_cluster_url_stops_start_up_naming_the_variable(url, message, monkeypatch):
    monkeypatch.setenv("CUSP_REDIS_URL", url)
    with pytest.raises(SystemExit) as info:
        load_settings()
    assert "CUSP_REDIS_URL" in str(info.value) and message in str(info.value)


def test_cluster_url_with_several_seed_nodes_reaches_the_cluster(redis_cluster):
    """Only the first seed may be down: the client finds the cluster through the others."""
    dead = rel.free_port()
    url = redis_cluster.url.replace("redis+cluster://", f"redis+cluster://127.0.0.1:{dead},")
    r = connect(url)
    assert r.ping() and len(r.get_primaries()) == 3


def test_metrics_say_redis_is_down_when_no_cluster_node_answers(tmp_path):
    """A cluster of its own, every node stopped after the API started: /metrics answers 200 with
    cusp_redis_up 0 within Prometheus's scrape timeout, as on a standalone Redis (it answered 503
    redis_unavailable, so CuspRedisDown could not fire: an operator's trial)."""
    import time

    from tests.redis_cluster import RedisClusterProcs

    own = RedisClusterProcs(tmp_path / "cluster")
    server = None
    try:
        server = LiveServer(own.url)
        assert server.client.post("/v1/streams", json={"name": "m", "columns": ["x"], "models": ["level"]}).status_code == 201
        assert "cusp_redis_up 1.0" in server.client.get("/metrics").text
        for p in own.procs:
            p.kill()
            p.wait()
        t0 = time.monotonic()
        r = server.client.get("/metrics")
        assert r.status_code == 200 and "cusp_redis_up 0.0" in r.text, r.text[:300]
        assert time.monotonic() - t0 < 4.0
    finally:
        if server is not None:
            server.stop()
        own.close()


# last, worker processes, SIGKILLed ones included: they stay in the worker registry for a few
# leases, and a burst worker takes only its share of the pairs meanwhile
from tests.test_reliability import (  # noqa: E402, F401
    test_paused_worker_is_fenced_off_after_takeover,
    test_poison_chunk_dead_lettered_by_a_worker_process_counting_earlier_attempts,
    test_worker_sigkilled_repeatedly_gives_bit_identical_results,
)

"""Issue 19 item 2: a create runs its models' first draws off the event loop (the API keeps
answering meanwhile), and a stream whose models would need more Redis than
CUSP_MAX_STREAM_BYTES (particles plus full reservoirs) is refused with 413 before anything is
drawn or stored. Over real HTTP with the embedded Redis."""

import threading
import time
import uuid

import pytest

from service.store import connect, keys
from tests.service_fixtures import LiveServer

LIMIT = 48 * 2**20
#: 64 columns, 64 components, 300 particles: 2,476,800 values (19 MiB) per model, drawn in about 0.5 s
BIG = {"spec": "gmm:components=64"}


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url, max_stream_bytes=LIMIT)
    yield server
    server.stop()


def body(name, models):
    return {"name": name, "columns": [f"c{i}" for i in range(64)],
            "models": [{**BIG, "name": f"g{i}"} for i in range(models)],
            "sampler": {"overrides": {"particles": 300, "reservoir_capacity": 1000}}}


def test_a_stream_too_large_for_redis_is_refused_and_nothing_is_stored(live, redis_url):
    s = "big" + uuid.uuid4().hex[:8]
    t0 = time.monotonic()
    r = live.client.post("/v1/streams", json=body(s, 3))  # 3 x (19 MiB + 0.5 MiB) > 48 MiB
    assert r.status_code == 413 and "CUSP_MAX_STREAM_BYTES=48 MiB" in r.text and "60 MiB" in r.text, r.text
    assert time.monotonic() - t0 < 5  # refused before drawing 7.4 million values (generous: measured 0.1 s)
    red = connect(redis_url)
    assert not list(red.scan_iter(match=f"cusp:{{{s}}}:*")) and not red.sismember(keys.STREAMS, s)
    assert live.client.get(f"/v1/streams/{s}").status_code == 404


def test_the_api_answers_while_a_large_stream_is_created(live):
    s = "big" + uuid.uuid4().hex[:8]
    latencies, done = [], threading.Event()

    def probe():
        while not done.is_set():
            t = time.monotonic()
            assert live.client.get("/healthz").status_code == 200
            latencies.append(time.monotonic() - t)
            time.sleep(0.01)

    th = threading.Thread(target=probe)
    th.start()
    t0 = time.monotonic()
    r = live.client.post("/v1/streams", json=body(s, 2))  # 39 MiB: allowed
    took = time.monotonic() - t0
    done.set()
    th.join()
    assert r.status_code == 201, r.text
    # the draws took about a second; on the event loop every probe during them would wait as long
    assert len(latencies) >= 5 and max(latencies) < took / 2, (took, max(latencies), len(latencies))
    assert live.client.delete(f"/v1/streams/{s}").status_code == 204


def test_the_deployment_cap_counts_every_stream_and_frees_on_delete(tmp_path):
    """CUSP_MAX_TOTAL_STREAM_BYTES: the streams' models together. With the cap at 2.5 streams'
    worth, two creates pass, the third answers 413 deployment_full and stores nothing (no key,
    not in the stream set, no bytes counted); after a delete it passes. Its own Redis: the count
    is per deployment."""
    from service.api.crud import config_from_request, initial_states
    from service.api.schemas import StreamIn
    from service.store import EmbeddedRedis

    one = {"columns": ["a", "b"], "models": ["gaussian", "gmm:components=2"]}
    _, need = initial_states(config_from_request(StreamIn(name="probe", **one)))
    redis = EmbeddedRedis(tmp_path / "redis")
    live = LiveServer(redis.url, max_total_stream_bytes=int(2.5 * need))
    try:
        red = connect(redis.url)
        for s in ("s1", "s2"):
            assert live.client.post("/v1/streams", json={"name": s, **one}).status_code == 201
        r = live.client.post("/v1/streams", json={"name": "s3", **one})
        assert r.status_code == 413 and r.json()["code"] == "deployment_full", r.text
        assert "CUSP_MAX_TOTAL_STREAM_BYTES" in r.json()["detail"]
        assert not list(red.scan_iter(match="cusp:{s3}:*")) and not red.sismember(keys.STREAMS, "s3")
        assert sorted(red.hkeys(keys.STREAM_BYTES)) == [b"s1", b"s2"] and int(red.hget(keys.STREAM_BYTES, "s1")) == need
        assert live.client.delete("/v1/streams/s1").status_code == 204
        assert red.hkeys(keys.STREAM_BYTES) == [b"s2"]
        assert live.client.post("/v1/streams", json={"name": "s3", **one}).status_code == 201
    finally:
        live.stop()
        redis.close()


def test_a_framed_mixtures_warm_up_rows_count_where_they_outweigh_its_reservoir():
    """``initial_states``' estimate: particles plus the full reservoir, or a ``gmm:warmup``'s raw
    warm-up rows (kept until they are all in, while the reservoir is empty) where those are more:
    4,000 rows of 8 columns against a reservoir of 16 rows of 16 features (a row and its squares)."""
    from service.api.crud import initial_states
    from service.store import ModelEntry, StreamConfig

    def need(spec, capacity):
        cfg = StreamConfig(name="s", columns=[f"c{i}" for i in range(8)], models=[ModelEntry(name="m", spec=spec)],
                           sampler={"preset": "paper", "overrides": {"reservoir_capacity": capacity}})
        return initial_states(cfg)[1]

    plain, framed = need("gmm", 16), need("gmm:warmup=4000", 16)
    assert framed - plain == 8 * (4000 * 8 - 16 * 16)
    assert need("gmm:warmup=4000", 100_000) == need("gmm", 100_000)  # the reservoir is the larger

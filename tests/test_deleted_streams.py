"""Issue 19 item 1: data sent to a deleted stream goes nowhere. An ingest names the stream's
incarnation (``cusp:{s}:uid``, set at create) and the ingest script writes nothing when the
stream is gone or is another incarnation; workers take no lease on a deleted pair and count no
attempts for one. Over real HTTP and WebSockets with the embedded Redis."""

import concurrent.futures
import json
import uuid

import numpy as np
import pytest
from websockets.sync.client import connect as ws_connect

from service.store import connect, keys
from service.worker import Worker
from tests.service_fixtures import LiveServer


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url)
    yield server
    server.stop()


def rows(n, seed=0):
    return np.random.default_rng(seed).normal(size=(n, 1)).round(6).tolist()


def stream_keys_left(redis_url, s):
    return sorted(k.decode() for k in connect(redis_url).scan_iter(match=f"cusp:{{{s}}}:*", count=1000))


def create(live, s):
    r = live.client.post("/v1/streams", json={"name": s, "columns": ["x"], "models": ["gaussian"]})
    assert r.status_code == 201, r.text


def test_an_open_websocket_cannot_write_into_the_next_stream_of_that_name(live, redis_url):
    s = "del" + uuid.uuid4().hex[:8]
    create(live, s)
    with ws_connect(f"{live.ws_url}/v1/streams/{s}/ingest") as ws:
        ws.send(json.dumps({"seq": 0, "rows": rows(5)}))
        assert json.loads(ws.recv())["status"] == "accepted"
        assert live.client.delete(f"/v1/streams/{s}").status_code == 204
        ws.send(json.dumps({"seq": 1, "rows": rows(5, 1)}))  # after the delete
        err = json.loads(ws.recv())
        assert err["status"] == "error" and err["code"] == 404 and "deleted" in err["detail"], err
        assert stream_keys_left(redis_url, s) == []  # no orphan keys
        create(live, s)  # the name again: a new stream
        ws.send(json.dumps({"seq": 0, "rows": rows(5, 2)}))  # the old connection's chunk is not the new seq 0
        err = json.loads(ws.recv())
        assert err["code"] == 404, err
    info = live.client.get(f"/v1/streams/{s}").json()
    assert info["next_seq"] == 0 and info["last_seq"] == -1
    assert connect(redis_url).xlen(keys.inbox(s)) == 0


def test_posts_racing_a_delete_leave_nothing_behind(live, redis_url):
    """30 rounds: 8 posts of seq 0..7 in parallel with the delete. Whatever each post answers, once
    all are done no key of the stream is left, and the name starts clean at seq 0."""
    for round_ in range(30):
        s = f"race{round_}" + uuid.uuid4().hex[:6]
        create(live, s)
        with concurrent.futures.ThreadPoolExecutor(9) as pool:
            posts = [pool.submit(live.client.post, f"/v1/streams/{s}/chunks", json={"seq": q, "rows": rows(3, q)})
                     for q in range(8)]
            gone = pool.submit(live.client.delete, f"/v1/streams/{s}")
            codes = [p.result().status_code for p in posts]
            assert gone.result().status_code == 204
        assert set(codes) <= {202, 404, 409}, codes  # accepted before the delete, or refused
        assert stream_keys_left(redis_url, s) == [], (round_, codes)
        create(live, s)
        assert live.client.get(f"/v1/streams/{s}").json()["next_seq"] == 0
        assert live.client.delete(f"/v1/streams/{s}").status_code == 204


def test_workers_take_no_lease_on_a_deleted_stream(live, redis_url):
    s = "lease" + uuid.uuid4().hex[:8]
    create(live, s)
    assert live.client.post(f"/v1/streams/{s}/chunks", json={"seq": 0, "rows": rows(5)}).status_code == 202
    assert live.client.delete(f"/v1/streams/{s}").status_code == 204
    w = Worker(redis_url)
    try:
        assert w.store.acquire(s, "gaussian", "w-test", 10_000) is None
        assert w.store.count_failure(s, "gaussian", 0) == 0
        w.run_until_idle()
    finally:
        w.release_all()
    assert stream_keys_left(redis_url, s) == []

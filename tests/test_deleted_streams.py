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
    """A chunk after the delete is refused (404) and the socket closes (1000): it was opened to a
    stream that is no more; a socket opened before a delete and a re-create with other columns
    says so for a chunk right for the new stream (it said "has 2 values, the stream has 1
    columns" and stayed open), and writes nothing into it."""
    from websockets.exceptions import ConnectionClosedOK

    s = "del" + uuid.uuid4().hex[:8]
    create(live, s)
    with ws_connect(f"{live.ws_url}/v1/streams/{s}/ingest") as ws:
        ws.send(json.dumps({"seq": 0, "rows": rows(5)}))
        assert json.loads(ws.recv())["status"] == "accepted"
        assert live.client.delete(f"/v1/streams/{s}").status_code == 204
        ws.send(json.dumps({"seq": 1, "rows": rows(5, 1)}))  # after the delete
        err = json.loads(ws.recv())
        assert err["status"] == "error" and err["code"] == 404 and "deleted" in err["detail"], err
        with pytest.raises(ConnectionClosedOK):
            ws.recv()
        assert ws.close_code == 1000 and "reconnect" in ws.close_reason
        assert stream_keys_left(redis_url, s) == []  # no orphan keys
    create(live, s)
    with ws_connect(f"{live.ws_url}/v1/streams/{s}/ingest") as ws:
        assert live.client.delete(f"/v1/streams/{s}").status_code == 204
        r = live.client.post("/v1/streams", json={"name": s, "columns": ["a", "b"], "models": ["gaussian"]})
        assert r.status_code == 201, r.text
        ws.send(json.dumps({"seq": 0, "rows": [[1.0, 2.0]]}))  # right for the new stream, not for the socket's
        err = json.loads(ws.recv())
        assert err["code"] == 404 and "deleted (or deleted and created again)" in err["detail"], err
        with pytest.raises(ConnectionClosedOK):
            ws.recv()
    info = live.client.get(f"/v1/streams/{s}").json()
    assert info["next_seq"] == 0 and info["last_seq"] == -1
    assert connect(redis_url).xlen(keys.inbox(s)) == 0


def test_a_delete_of_a_stream_created_again_meanwhile_leaves_the_new_one_whole(live, redis_url):
    """DELETE reads the config, then deletes. Where the stream was deleted and created again in
    between (other models), it deleted the new stream's config, uid and input by name and left its
    new models' keys, listed nowhere (a new user's trial: 1 race in 20, every call 2xx). Now it
    deletes only the incarnation it read: 404, and the new stream stays whole."""
    import asyncio

    from service.api import crud
    from service.api.errors import ApiError
    from service.store.api import ApiStore

    s = "del" + uuid.uuid4().hex[:8]
    create(live, s)

    async def race():
        store = ApiStore(redis_url)
        try:
            old = await store.config(s)  # (the DELETE's read)
            assert live.client.delete(f"/v1/streams/{s}").status_code == 204  # another DELETE wins
            r = live.client.post("/v1/streams", json={"name": s, "columns": ["x"], "models": ["trend"]})
            assert r.status_code == 201, r.text
            with pytest.raises(ApiError) as exc:
                await crud.delete_stream(store, old)
            return exc.value
        finally:
            await store.close()

    err = asyncio.run(race())
    assert err.status_code == 404 and "deleted meanwhile" in str(err.detail)
    info = live.client.get(f"/v1/streams/{s}")
    assert info.status_code == 200 and [m["spec"] for m in info.json()["models"]] == ["trend"]
    assert s in live.client.get("/v1/streams").json()["streams"]
    assert keys.state(s, "trend") in stream_keys_left(redis_url, s)
    assert live.client.delete(f"/v1/streams/{s}").status_code == 204 and stream_keys_left(redis_url, s) == []


def test_a_live_feed_ends_at_the_delete_even_when_the_name_comes_back_at_once(live, redis_url):
    """SSE and WebSocket feeds of a stream deleted and created again at once (other models) end;
    they went on with the new stream's results as the old one's (a new user's trial)."""
    import threading
    import time

    import httpx
    from websockets.exceptions import ConnectionClosedOK

    from tests.service_fixtures import drain

    s = "del" + uuid.uuid4().hex[:8]
    create(live, s)
    got: list[str] = []

    def sse():
        with httpx.stream("GET", f"{live.url}/v1/streams/{s}/evidence/sse", params={"since": "0"}, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got.append(json.loads(line[6:])["model"])

    t = threading.Thread(target=sse)
    t.start()
    with ws_connect(f"{live.ws_url}/v1/streams/{s}/evidence/ws?since=0") as ws:
        assert live.client.post(f"/v1/streams/{s}/chunks", json={"seq": 0, "rows": rows(5)}).status_code == 202
        drain(redis_url)
        assert json.loads(ws.recv())["model"] == "gaussian"
        deadline = time.monotonic() + 20  # (both feeds have the old stream's result before the delete)
        while got != ["gaussian"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got == ["gaussian"], got
        assert live.client.delete(f"/v1/streams/{s}").status_code == 204
        r = live.client.post("/v1/streams", json={"name": s, "columns": ["x"], "models": ["level"]})
        assert r.status_code == 201, r.text
        assert live.client.post(f"/v1/streams/{s}/chunks", json={"seq": 0, "rows": rows(5, 1)}).status_code == 202
        drain(redis_url)
        with pytest.raises(ConnectionClosedOK):
            while True:
                assert json.loads(ws.recv())["model"] == "gaussian"
    t.join(timeout=20)
    assert not t.is_alive() and got == ["gaussian"], got


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

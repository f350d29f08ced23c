"""The service over real HTTP and WebSocket clients, an embedded redis-server and workers in
burst mode."""

import json
import threading
import time
import uuid

import numpy as np
import pytest
import torch
from websockets.sync.client import connect as ws_connect

from service import metrics as M
from service.store import connect, keys
from service.worker import Worker
from tests.service_fixtures import LiveServer, drain, stream_keys_in_redis


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url, max_chunk_rows=2000, max_body_bytes=200_000)
    yield server
    server.stop()


def name():
    return "t" + uuid.uuid4().hex[:10]


def gauss_rows(n, seed=0, shift=0.0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 2)) + shift).round(6).tolist()


def make_stream(live, models=("gaussian", "gmm:components=2"), columns=("a", "b"), **extra):
    s = name()
    r = live.client.post("/v1/streams", json={"name": s, "columns": list(columns), "models": list(models), "seed": 3, **extra})
    assert r.status_code == 201, r.text
    return s, r.json()


def post(live, s, seq, rows, **kw):
    return live.client.post(f"/v1/streams/{s}/chunks", json={"seq": seq, "rows": rows}, **kw)


def results(live, s):
    out, since = [], None
    while True:
        page = live.client.get(f"/v1/streams/{s}/evidence", params={"since": since} if since else {}).json()
        out += page["results"]
        if not page["results"]:
            return out
        since = page["next"]


def test_create_ingest_process_and_read(live, redis_url):
    s, info = make_stream(live)
    assert [m["name"] for m in info["models"]] == ["gaussian", "gmm_components2"]
    assert info["next_seq"] == 0
    for seq in range(3):
        r = post(live, s, seq, gauss_rows(200, seq))
        assert r.status_code == 202 and r.json()["status"] == "accepted", r.text
    drain(redis_url)
    res = results(live, s)
    assert sorted((r["model"], r["seq"]) for r in res) == sorted((m, q) for m in ("gaussian", "gmm_components2") for q in range(3))
    st = live.client.get(f"/v1/streams/{s}").json()
    assert all(m["observations"] == 600 and m["lag_chunks"] == 0 for m in st["models"])
    probs = [m["posterior_probability"] for m in st["models"]]
    assert sum(probs) == pytest.approx(1.0)
    # the results equal the offline engine's numbers on the same data and seed
    from service.runtime import build, model_seed
    from service.store import StreamConfig

    cfg = StreamConfig.from_json(connect(redis_url).get(keys.config(s)))
    sampler = build(cfg, cfg.models[0])
    data = torch.tensor(sum((gauss_rows(200, q) for q in range(3)), []), dtype=torch.float64)
    offline = [r.log_evidence for _, r, _ in sampler.run(data, 200, model_seed(cfg, cfg.models[0]))]
    assert [r["log_evidence"] for r in res if r["model"] == "gaussian"] == offline
    assert s in live.client.get("/v1/streams").json()["streams"]


def test_idempotent_repeat_conflict_and_gap(live, redis_url):
    s, _ = make_stream(live)
    rows = gauss_rows(50)
    assert post(live, s, 0, rows).status_code == 202
    again = post(live, s, 0, rows)
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    conflict = post(live, s, 0, gauss_rows(50, 9))
    assert conflict.status_code == 409 and "different data" in conflict.json()["detail"]
    gap = post(live, s, 5, rows)
    assert gap.status_code == 409 and "expected seq 1" in gap.json()["detail"]
    assert drain(redis_url) == 2
    assert len(results(live, s)) == 2


def test_input_trimmed_once_applied_and_resends_still_recognised(live, redis_url):
    """Once every model applied a chunk (and no detector needs it to restore) its input entry is
    trimmed; a resend of it is still answered from the kept digest: duplicate or conflict."""
    s, _ = make_stream(live, detector={"enabled": False})
    chunks = [gauss_rows(30, q) for q in range(6)]
    for q, rows in enumerate(chunks):
        assert post(live, s, q, rows).status_code == 202
    r = connect(redis_url)
    assert r.xlen(keys.inbox(s)) == 6
    assert drain(redis_url) == 12
    assert r.xlen(keys.inbox(s)) == 0
    again = post(live, s, 2, chunks[2])
    assert again.status_code == 200 and again.json()["status"] == "duplicate", again.text
    conflict = post(live, s, 2, chunks[3])
    assert conflict.status_code == 409 and "different data" in conflict.json()["detail"]
    assert post(live, s, 6, chunks[0]).status_code == 202 and r.xlen(keys.inbox(s)) == 1
    assert drain(redis_url) == 2 and r.xlen(keys.inbox(s)) == 0
    assert sorted(x["seq"] for x in results(live, s)) == [q for q in range(7) for _ in range(2)]


def test_input_kept_while_a_model_or_the_detector_needs_it(live, redis_url):
    """The slowest model bounds the trim, and the detector's recent chunks stay readable: a fresh
    worker restores the detector from them and goes on to the same numbers as an unbroken run."""
    s, _ = make_stream(live, models=("gaussian",), detector={"max_age": 100})
    for q in range(12):
        assert post(live, s, q, gauss_rows(20, q)).status_code == 202
    r = connect(redis_url)
    assert drain(redis_url) == 12
    kept = [keys.seq_of(e) for e, _ in r.xrange(keys.inbox(s))]
    h = r.hgetall(keys.state(s, "gaussian"))
    keep_from = int(h[b"keep_from"])
    assert kept == list(range(keep_from, 12)) and 0 < keep_from < 12 - 1  # the detector's window (max_age 100, 20 rows each)
    assert drain(redis_url) == 0
    for q in range(12, 16):
        assert post(live, s, q, gauss_rows(20, q)).status_code == 202
    assert drain(redis_url) == 4  # a new worker: restores the detector from the kept input
    unbroken, _ = make_stream(live, models=("gaussian",), detector={"max_age": 100})
    for q in range(16):
        assert post(live, unbroken, q, gauss_rows(20, q)).status_code == 202
    assert drain(redis_url) == 16
    # the same numbers; the times differ (two streams, stamped with their own arrival times)
    strip = lambda rows: [{k: v for k, v in x.items() if k not in ("id", "seconds", "time_start", "time_end")} for x in rows]  # noqa: E731
    assert strip(results(live, s)) == strip(results(live, unbroken))


def test_resend_older_than_the_dedup_window_is_a_clear_409(redis_url):
    server = LiveServer(redis_url, dedup_window=1)
    try:
        s, _ = make_stream(server, models=("gaussian",))
        for q in range(250):  # the digest stream is capped with MAXLEN ~: whole 100-entry nodes go
            assert post(server, s, q, [[float(q), 1.0]]).status_code == 202
        old = post(server, s, 0, [[0.0, 1.0]])
        assert old.status_code == 409 and "CUSP_DEDUP_WINDOW=1" in old.json()["detail"] and "expected seq 250" in old.json()["detail"]
        assert post(server, s, 249, [[249.0, 1.0]]).json()["status"] == "duplicate"
    finally:
        server.stop()


BAD = [
    ({"seq": 0, "rows": [[1.0, float("nan")]]}, 422, "NaN is not accepted"),
    ('{"seq": 0, "rows": [[1.0, Infinity]]}', 422, "Infinity is not accepted"),
    ({"seq": 0, "rows": [[1.0, 2.0, 3.0]]}, 422, "has 3 values"),
    ({"seq": 0, "rows": [[1.0], [2.0, 3.0]]}, 422, "row 0: has 1 values"),
    ({"seq": 0, "rows": [[1.0, "x"]]}, 422, "is not a number"),
    ({"seq": 0, "rows": [[1.0, True]]}, 422, "is not a number"),
    ({"seq": 0, "rows": []}, 422, "empty chunk"),
    ({"seq": 0, "rows": [[1.0, 2.0]] * 2001}, 413, "limit is CUSP_MAX_CHUNK_ROWS"),
    ({"seq": 0, "rows": [[1e200, 2.0]]}, 422, "too large"),
    ({"seq": -1, "rows": [[1.0, 2.0]]}, 422, "seq must be"),
    ({"seq": "x", "rows": [[1.0, 2.0]]}, 422, "seq must be"),
    ({"seq": 0}, 422, "exactly one of"),
    ({"seq": 0, "rows": [[1, 2]], "extra": 1}, 422, "unknown field"),
    ({"seq": 0, "columns": {"a": [1.0], "c": [2.0]}}, 422, "columns must be exactly"),
    ({"seq": 0, "columns": {"a": [1.0], "b": [2.0, 3.0]}}, 422, "different lengths"),
    ("[" * 110_000 + "]" * 110_000, 413, "exceeds the limit"),
    ("[" * 5000 + "]" * 5000, 400, "nested too deeply"),
    ("not json", 400, "not valid JSON"),
    ("", 400, "empty body"),
    ([1, 2], 400, "must be a JSON object"),
]


@pytest.mark.parametrize("body,status,message", BAD)
def test_bad_chunks_get_a_clear_4xx_and_change_nothing(live, redis_url, body, status, message):
    s, _ = make_stream(live)
    assert post(live, s, 0, gauss_rows(10)).status_code == 202
    r0 = connect(redis_url)
    before = (r0.get(keys.seq(s)), r0.xlen(keys.inbox(s)))
    content = body if isinstance(body, str) else json.dumps(body)
    if isinstance(body, dict) and body.get("seq") == 0:
        content = content.replace('"seq": 0', '"seq": 1')
    r = live.client.post(f"/v1/streams/{s}/chunks", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert message in r.json()["detail"]
    assert (r0.get(keys.seq(s)), r0.xlen(keys.inbox(s))) == before


def test_a_model_is_asked_for_by_its_name_or_by_its_spec(live, redis_url):
    """A model's name is derived from its spec ('gmm:components=2' is 'gmm_components2'); a new user
    asked for the spec ``cusp replay`` prints and got a 404. Both select the same entries."""
    s, _ = make_stream(live)
    assert post(live, s, 0, [[1.0, 2.0], [1.5, 2.5], [0.5, 1.0]]).status_code == 202
    drain(redis_url)
    by_name = live.client.get(f"/v1/streams/{s}/evidence", params={"model": "gmm_components2"}).json()["results"]
    by_spec = live.client.get(f"/v1/streams/{s}/evidence", params={"model": "gmm:components=2"}).json()["results"]
    assert by_name and by_spec == by_name and {e["model"] for e in by_name} == {"gmm_components2"}
    # a name first; a spec several models share is refused, naming them
    t, _ = make_stream(live, models=({"spec": "gaussian", "name": "g1"}, {"spec": "gaussian", "name": "g2"},
                                     {"spec": "gmm:components=2", "name": "gaussian"}))
    assert live.client.get(f"/v1/streams/{t}/evidence", params={"model": "gaussian"}).status_code == 200
    r = live.client.get(f"/v1/streams/{t}/evidence", params={"model": "gmm:components=2"})
    assert r.status_code == 200
    s2, _ = make_stream(live, models=({"spec": "gaussian", "name": "g1"}, {"spec": "gaussian", "name": "g2"}))
    r = live.client.get(f"/v1/streams/{s2}/evidence", params={"model": "gaussian"})
    assert r.status_code == 422 and "spec of several" in r.json()["detail"] and "'g1', 'g2'" in r.json()["detail"]
    # the kind alone, where one model is of it (a stream of columns runs 'gaussian:warmup=5': a new user's 404)
    k, _ = make_stream(live, models=("gaussian:warmup=5", "gmm:components=2"))
    assert post(live, k, 0, [[1.0, 2.0], [1.5, 2.5], [0.5, 1.0]]).status_code == 202
    drain(redis_url)
    by_kind = live.client.get(f"/v1/streams/{k}/evidence", params={"model": "gaussian"}).json()["results"]
    assert by_kind and {e["model"] for e in by_kind} == {"gaussian_warmup5"}
    k2, _ = make_stream(live, models=("gmm:components=2", "gmm:components=3"))
    r = live.client.get(f"/v1/streams/{k2}/evidence", params={"model": "gmm"})
    assert r.status_code == 422 and "kind of several" in r.json()["detail"], r.text


def test_unknown_stream_model_and_bad_settings(live):
    assert live.client.post("/v1/streams/nope/chunks", json={"seq": 0, "rows": [[1, 2]]}).status_code == 404
    assert live.client.get("/v1/streams/nope").status_code == 404
    assert live.client.get("/v1/streams/nope/evidence").status_code == 404
    s, _ = make_stream(live)
    r = live.client.get(f"/v1/streams/{s}/evidence", params={"model": "zzz"})
    assert r.status_code == 404 and "no model 'zzz' (its models: 'gaussian', 'gmm_components2')" in r.json()["detail"]
    cases = [
        ({"name": "bad name!", "columns": ["a"], "models": ["gaussian"]}, "stream name"),
        ({"name": name(), "columns": ["a", "a"], "models": ["gaussian"]}, "distinct"),
        ({"name": name(), "columns": ["a"], "models": ["nope"]}, "unknown model 'nope'"),
        ({"name": name(), "columns": ["a"], "models": ["gmm:components=0"]}, "components"),
        ({"name": name(), "columns": ["a"], "models": ["linear-regression"]}, "at least 2 columns"),
        ({"name": name(), "columns": ["a", "b"], "models": [{"spec": "linear-regression", "target": "c"}]}, "target column 'c'"),
        ({"name": name(), "columns": ["a"], "models": ["gaussian", "gaussian"]}, "used twice"),
        ({"name": name(), "columns": ["a"], "models": ["gaussian"], "sampler": {"overrides": {"particles": 1}}}, "particles"),
        ({"name": name(), "columns": ["a"], "models": ["gaussian"], "sampler": {"overrides": {"nope": 1}}}, "unknown sampler setting"),
        ({"name": name(), "columns": ["a"], "models": ["gmm:components=2"], "sampler": {"overrides": {"sghmc_steps": 0}}},
         "sghmc_steps must be at least 1"),
    ]
    for body, message in cases:
        r = live.client.post("/v1/streams", json=body)
        assert r.status_code == 422, (body, r.text)
        assert message in json.dumps(r.json()), (message, r.text)
    dup = live.client.post("/v1/streams", json={"name": s, "columns": ["a"], "models": ["gaussian"]})
    assert dup.status_code == 409


def test_an_empty_body_is_empty_body_everywhere(live):
    """No body on a JSON endpoint is what no body on a chunk is: 400 'empty_body' (creating a
    stream answered 422 'body: Field required', the trial of 2026-12-06)."""
    s, _ = make_stream(live, models=("gaussian",))
    for path in ("/v1/streams", "/v1/detect", f"/v1/streams/{s}/chunks"):
        r = live.client.post(path, content=b"", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["code"] == "empty_body", (path, r.text)
    assert live.client.get(f"/v1/streams/{s}").json()["next_seq"] == 0


def test_ndjson_and_csv_bodies(live, redis_url):
    s, _ = make_stream(live, models=("gaussian",))
    nd = "\n".join(json.dumps(r) for r in gauss_rows(20))
    r = live.client.post(f"/v1/streams/{s}/chunks", params={"seq": 0}, content=nd, headers={"Content-Type": "application/x-ndjson"})
    assert r.status_code == 202, r.text
    csv_body = "a,b\n" + "\n".join(f"{x},{y}" for x, y in gauss_rows(20, 1))
    r = live.client.post(f"/v1/streams/{s}/chunks", params={"seq": 1}, content=csv_body, headers={"Content-Type": "text/csv"})
    assert r.status_code == 202, r.text
    r = live.client.post(f"/v1/streams/{s}/chunks", params={"seq": 2}, content="a,b\n1,zz\n", headers={"Content-Type": "text/csv"})
    assert r.status_code == 422 and "'zz' is not a number" in r.json()["detail"]
    r = live.client.post(f"/v1/streams/{s}/chunks", content="1,2\n", headers={"Content-Type": "text/csv"})
    assert r.status_code == 422 and "?seq=N" in r.json()["detail"]
    drain(redis_url)
    assert [x["n"] for x in results(live, s)] == [20, 40]


def test_raw_float64_bodies(live, redis_url):
    """application/octet-stream: rows as little-endian float64. The same numbers as JSON are the
    same chunk (a resend in either form is a duplicate); bad bodies get a 4xx and store nothing."""
    s, _ = make_stream(live, models=("gaussian",))
    r0 = connect(redis_url)
    rows = np.array(gauss_rows(30, 4))
    raw = {"Content-Type": "application/octet-stream"}
    r = live.client.post(f"/v1/streams/{s}/chunks", params={"seq": 0}, content=rows.astype("<f8").tobytes(), headers=raw)
    assert r.status_code == 202 and r.json()["rows"] == 30, r.text
    assert post(live, s, 0, rows.tolist()).json()["status"] == "duplicate"  # the same chunk, sent as JSON
    assert post(live, s, 1, gauss_rows(10, 5)).status_code == 202
    again = live.client.post(f"/v1/streams/{s}/chunks", params={"seq": 1}, content=np.array(gauss_rows(10, 5)).tobytes(), headers=raw)
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    before = (r0.get(keys.seq(s)), r0.xlen(keys.inbox(s)))
    nan = rows.copy()
    nan[7, 1] = np.nan
    for body, params, status, message in [
        (rows.tobytes()[:-8], {"seq": 2}, 422, "not a whole number of rows of 2 float64 values"),
        (nan.tobytes(), {"seq": 2}, 422, "row 7 column 'b': nan is not finite"),
        (np.full((2, 2), np.inf).tobytes(), {"seq": 2}, 422, "row 0 column 'a': inf is not finite"),
        (rows.tobytes(), {}, 422, "need ?seq=N"),
        (b"", {"seq": 2}, 400, "empty body"),
        (rows.tobytes(), {"seq": 9}, 409, "expected seq 2"),
    ]:
        r = live.client.post(f"/v1/streams/{s}/chunks", params=params, content=body, headers=raw)
        assert r.status_code == status and message in r.json()["detail"], (message, r.status_code, r.text)
    assert (r0.get(keys.seq(s)), r0.xlen(keys.inbox(s))) == before
    drain(redis_url)
    assert [x["n"] for x in results(live, s)] == [30, 40]


def test_websocket_ingest_acks_and_errors(live, redis_url):
    s, _ = make_stream(live, models=("gaussian",))
    with ws_connect(f"{live.ws_url}/v1/streams/{s}/ingest") as ws:
        ws.send(json.dumps({"seq": 0, "rows": gauss_rows(30)}))
        assert json.loads(ws.recv()) == {"seq": 0, "status": "accepted", "id": "chunk-0", "rows": 30}
        ws.send("{broken")
        err = json.loads(ws.recv())
        assert err["status"] == "error" and err["code"] == 400
        ws.send(json.dumps({"seq": 1, "rows": [[1.0, float("nan")]]}))
        err = json.loads(ws.recv())
        assert err["seq"] == 1 and "NaN" in err["detail"]
        ws.send(json.dumps({"seq": 3, "rows": gauss_rows(3)}))
        assert "expected seq 1" in json.loads(ws.recv())["detail"]
        ws.send(json.dumps({"seq": 1, "rows": gauss_rows(30, 1)}))  # the connection was kept
        assert json.loads(ws.recv())["status"] == "accepted"
    drain(redis_url)
    assert [x["seq"] for x in results(live, s)] == [0, 1]


def test_live_evidence_websocket_and_sse_resume_without_gaps(live, redis_url):
    s, _ = make_stream(live)
    for seq in range(2):
        post(live, s, seq, gauss_rows(100, seq))
    drain(redis_url)
    first = results(live, s)
    with ws_connect(f"{live.ws_url}/v1/streams/{s}/evidence/ws?since={first[1]['id']}") as ws:
        got = [json.loads(ws.recv(timeout=10)) for _ in range(2)]  # the two after the resume point
        assert [g["id"] for g in got] == [r["id"] for r in first[2:4]]
        post(live, s, 2, gauss_rows(100, 2))
        drain(redis_url)
        live_items = [json.loads(ws.recv(timeout=10)) for _ in range(2)]
    assert {i["seq"] for i in live_items} == {2}
    ids = [g["id"] for g in got + live_items]
    assert len(ids) == len(set(ids)) and ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    # SSE from the same point, with Last-Event-ID
    with live.client.stream("GET", f"/v1/streams/{s}/evidence/sse", headers={"Last-Event-ID": first[1]["id"]}) as resp:
        seen = []
        for line in resp.iter_lines():
            if line.startswith("id: "):
                seen.append(line[4:])
            if len(seen) == 4:
                break
    assert seen == [r["id"] for r in results(live, s)[2:6]]
    bad = live.client.get(f"/v1/streams/{s}/evidence", params={"since": "abc"})
    assert bad.status_code == 422


def test_an_idle_worker_wakes_on_ingest_not_on_its_timeout(live, redis_url):
    """The ingest script publishes on ``keys.WAKE``; a worker waiting for work (subscribed on its
    first idle wait) returns as soon as a chunk arrives, not after its idle timeout. With no
    chunk the same wait runs to its timeout, so the check below can fail."""
    s, _ = make_stream(live, models=("gaussian",))
    w = Worker(redis_url)
    try:
        w._wait_for_work(0.0)  # subscribes
        for _ in range(3):  # the first wait may return on the subscription's confirmation
            t0 = time.monotonic()
            w._wait_for_work(0.3)
            if time.monotonic() - t0 >= 0.25:
                break
        else:
            pytest.fail("an idle wait with nothing published did not run to its timeout")
        timer = threading.Timer(0.2, lambda: post(live, s, 0, gauss_rows(10)))
        timer.start()
        t0 = time.monotonic()
        w._wait_for_work(60.0)
        waited = time.monotonic() - t0
        timer.join()
        assert waited < 30.0, waited  # woken by the chunk's publication
        assert w.run_until_idle() == 1
    finally:
        w._close_wake()
        w.release_all()


def test_two_workers_share_streams_without_double_applying(live, redis_url):
    streams = [make_stream(live, models=("gaussian",))[0] for _ in range(4)]
    for s in streams:
        for seq in range(6):
            post(live, s, seq, gauss_rows(100, seq))
    workers = [Worker(redis_url, lease_seconds=5, worker_id=f"w{i}") for i in range(2)]
    threads = [threading.Thread(target=w.run_until_idle) for w in workers]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    [w.release_all() for w in workers]
    for s in streams:
        seqs = [r["seq"] for r in results(live, s)]
        assert seqs == list(range(6)), (s, seqs)


class CrashBeforeApply(Exception):
    pass


def test_worker_killed_between_processing_and_applying(live, redis_url):
    s, _ = make_stream(live, models=("gaussian",))
    for seq in range(4):
        post(live, s, seq, gauss_rows(100, seq))
    w1 = Worker(redis_url, lease_seconds=1, worker_id="doomed")
    real_apply, calls = w1.store.apply, []

    def dying_apply(*a, **kw):
        calls.append(1)
        if len(calls) == 3:  # processed seq 2, dies before its apply
            raise CrashBeforeApply()
        return real_apply(*a, **kw)

    w1.store.apply = dying_apply
    with pytest.raises(CrashBeforeApply):
        w1.run_until_idle()
    # w1 is gone without releasing its lease; the next owner takes over after expiry and counts
    # the one chunk w1 had computed and not applied as a redelivery (it stayed 0 after 36 kills)
    redelivered = M.REDELIVERIES.labels(s, "gaussian")._value.get()
    time.sleep(1.2)
    drain(redis_url, lease_seconds=1, worker_id="heir")
    assert M.REDELIVERIES.labels(s, "gaussian")._value.get() == redelivered + 1
    res = [r for r in results(live, s) if r["kind"] == "result"]
    assert [r["seq"] for r in res] == [0, 1, 2, 3]
    # a clean stop leaves nothing to redeliver: the next owner counts none
    post(live, s, 4, gauss_rows(100, 4))
    drain(redis_url, worker_id="heir2")
    assert M.REDELIVERIES.labels(s, "gaussian")._value.get() == redelivered + 1
    # identical to an uninterrupted run of the same stream
    s2, _ = make_stream(live, models=("gaussian",))
    for seq in range(4):
        post(live, s2, seq, gauss_rows(100, seq))
    drain(redis_url)
    assert [r["log_evidence"] for r in res] == [r["log_evidence"] for r in results(live, s2)]


def test_late_write_after_lost_lease_is_fenced(live, redis_url):
    s, _ = make_stream(live, models=("gaussian",))
    post(live, s, 0, gauss_rows(100))
    w1 = Worker(redis_url, lease_seconds=1, worker_id="slow")
    assert w1._take(s, "gaussian")
    time.sleep(1.2)  # lease expires while w1 "pauses"
    w2 = Worker(redis_url, lease_seconds=5, worker_id="fast")
    assert w2._take(s, "gaussian")
    before = M.FENCED_WRITES.labels(s, "gaussian")._value.get()
    w1._life_at = time.monotonic()  # it believes it is alive and its pairs are its own
    assert w1._process(w1.hot[(s, "gaussian")]) == 0
    assert M.FENCED_WRITES.labels(s, "gaussian")._value.get() == before + 1
    assert w2._process(w2.hot[(s, "gaussian")]) == 1
    w2.release_all()
    assert [r["seq"] for r in results(live, s)] == [0]


def test_stream_deleted_while_a_chunk_is_processed_is_not_a_fenced_write(live, redis_url):
    """A delete wipes the lease and fence keys, so the worker's apply is refused like a fenced one;
    it is dropped quietly, not counted as split brain in cusp_fenced_writes_total."""
    s, _ = make_stream(live, models=("gaussian",))
    post(live, s, 0, gauss_rows(50))
    w = Worker(redis_url, worker_id="deleted-under-me")
    assert w._take(s, "gaussian")
    hot = w.hot[(s, "gaussian")]
    update = hot.sampler.update

    def update_then_delete(*a, **kw):
        out = update(*a, **kw)
        assert live.client.delete(f"/v1/streams/{s}").status_code == 204
        return out

    hot.sampler.update = update_then_delete
    before = M.FENCED_WRITES.labels(s, "gaussian")._value.get()
    assert w._process(hot) == 0
    assert M.FENCED_WRITES.labels(s, "gaussian")._value.get() == before
    assert (s, "gaussian") not in w.hot
    assert not connect(redis_url).exists(keys.out(s), keys.state(s, "gaussian"))  # nothing written after the delete


def test_poison_chunk_is_dead_lettered_and_others_go_on(live, redis_url):
    s, _ = make_stream(live, models=("gaussian", "gmm:components=2"))
    post(live, s, 0, gauss_rows(50))
    # bypass the API's validation to plant a chunk the engine cannot take
    r = connect(redis_url)
    r.xadd(keys.inbox(s), {"rows": np.array([[1e160, 0.0]]).astype("<f8").tobytes(), "n": 1}, id=keys.entry_id(1))
    r.set(keys.seq(s), 1)
    post(live, s, 2, gauss_rows(50, 2))
    drain(redis_url, max_attempts=2)
    info = live.client.get(f"/v1/streams/{s}").json()
    assert info["dead_letters"] == 2 and all(m["last_seq"] == 2 for m in info["models"])
    dead = live.client.get(f"/v1/streams/{s}/dead-letters").json()["dead_letters"]
    assert {d["seq"] for d in dead} == {1}
    # gaussian: its square overflows; the mixture's value limit (1e30, float32 kernels) names the value
    errors = {d["model"]: d["error"] for d in dead}
    assert "NaN or infinite" in errors["gaussian"], errors
    assert "row 0 column 0: 1e+160 is too large for this model: it takes values within +-1e+30" in errors["gmm_components2"], errors
    kinds = [(x["model"], x["seq"], x["kind"]) for x in results(live, s)]
    assert ("gaussian", 2, "result") in kinds and ("gaussian", 1, "dead_letter") in kinds


def test_metrics_health_docs_and_delete(live, redis_url):
    s, _ = make_stream(live)
    post(live, s, 0, gauss_rows(100))
    drain(redis_url)
    text = live.client.get("/metrics").text
    for metric in ("cusp_log_evidence_nats", "cusp_chunk_log_predictive_nats_per_observation", "cusp_annealing_steps_bucket",
                   "cusp_annealing_steps_last", "cusp_effective_sample_size", "cusp_resamples_total", "cusp_chunks_processed_total",
                   "cusp_observations_processed_total", "cusp_model_posterior_probability", "cusp_chunk_processing_seconds_bucket",
                   "cusp_ingest_lag_chunks", "cusp_workers"):
        assert f"\n{metric}" in text, metric
    assert f'cusp_log_evidence_nats{{model="gaussian",stream="{s}"}}' in text
    assert f'cusp_ingested_chunks_total{{stream="{s}"}} 1.0' in text
    assert live.client.get("/healthz").json() == {"status": "ok"}
    assert live.client.get("/readyz").json()["status"] == "ready"
    assert live.client.get("/openapi.json").status_code == 200 and live.client.get("/docs").status_code == 200
    page = live.client.get("/").text  # the live page charts with uPlot, served by the service itself
    assert "uPlot.iife.min.js" in page and live.client.get("/assets/uPlot.iife.min.js").status_code == 200
    assert live.client.delete(f"/v1/streams/{s}").status_code == 204
    assert live.client.get(f"/v1/streams/{s}").status_code == 404
    assert stream_keys_in_redis(redis_url, s) == []
    # the API's series of the stream go with it (a new user saw them stay: label churn; a worker's
    # go when it lets the stream go, after its grace)
    text = live.client.get("/metrics").text
    assert f'cusp_ingested_chunks_total{{stream="{s}"}}' not in text and f'cusp_ingested_observations_total{{stream="{s}"}}' not in text


def test_auth_scopes(redis_url):
    server = LiveServer(redis_url, api_keys="writer-key-123,reader-key-123:read")
    try:
        c = server.client
        assert c.get("/healthz").status_code == 200
        assert c.get("/v1/streams").status_code == 401
        assert c.get("/v1/streams", headers={"Authorization": "Bearer wrong-key-000"}).status_code == 401
        assert c.get("/v1/streams", headers={"Authorization": "Bearer reader-key-123"}).status_code == 200
        body = {"name": name(), "columns": ["a"], "models": ["gaussian"]}
        assert c.post("/v1/streams", json=body, headers={"Authorization": "Bearer reader-key-123"}).status_code == 403
        assert c.post("/v1/streams", json=body, headers={"X-API-Key": "writer-key-123"}).status_code == 201
        assert c.get("/metrics").status_code == 401
        from websockets.exceptions import ConnectionClosed

        with ws_connect(f"{server.ws_url}/v1/streams/{body['name']}/ingest?token=reader-key-123") as ws:
            with pytest.raises(ConnectionClosed) as info:
                ws.recv(timeout=5)
            assert info.value.rcvd.code == 1008
    finally:
        server.stop()

"""The stream's answer and the change-point store (issue 16 item 4, issue 19 item 6).

Every chunk every model applied is taken, once, into the stream's answer
(``service.detect.StreamAnswer``) by whichever worker applies it last; its change points and each
model's events go to ``cusp:{s}:changes``, apart from the result stream, so trimming the results
does not lose them. Real Redis, real HTTP, real workers (in threads)."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from service.detect import detect_stream
from service.store import EmbeddedRedis, connect, keys
from service.store.worker import WorkerStore
from service.worker import Worker
from tests.service_fixtures import LiveServer, drain, stream_keys_in_redis


def shifted(n: int, at: int, size: float, seed: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    return g.normal(0.0, 1.0, n) + np.where(np.arange(n) >= at, size, 0.0)


@pytest.fixture()
def redis(tmp_path):
    r = EmbeddedRedis(tmp_path / "redis")
    yield r
    r.close()


def post_all(live: LiveServer, s: str, x: np.ndarray, size: int) -> None:
    for seq, lo in enumerate(range(0, len(x), size)):
        r = live.client.post(f"/v1/streams/{s}/chunks", json={"seq": seq, "rows": x[lo : lo + size, None].tolist()})
        assert r.status_code == 202, r.text


def stripped(entries: list[dict]) -> list[dict]:
    # the offline answer has no times (tests/test_times.py checks the service's)
    times = ("location_time", "detected_time", "delay_seconds")
    return [{k: v for k, v in e.items() if k not in ("id", "model", "kind", "seq", *times)} for e in entries]


def test_change_points_outlive_result_trimming(redis):
    """CUSP_RESULT_MAXLEN=100 (its minimum): 3,000 observations in chunks of 10 with a jump at
    300 leave about 100 result entries, the change long trimmed from them; /changepoints still
    lists the model's event and the stream's, read from their own store."""
    live = LiveServer(redis.url, result_maxlen=100)
    try:
        r = live.client.post("/v1/streams", json={"name": "trim", "columns": ["v"], "models": ["gaussian"], "seed": 1})
        assert r.status_code == 201, r.text
        post_all(live, "trim", shifted(3000, 300, 5.0, seed=4), 10)
        drain(redis.url, result_maxlen=100)
        rc = connect(redis.url)
        oldest = json.loads(rc.xrange(keys.out("trim"), count=1)[0][1][b"data"])
        assert rc.xlen(keys.out("trim")) < 300 and oldest["seq"] > 100, "the result stream was not trimmed"
        got = live.client.get("/v1/streams/trim/changepoints").json()
        assert [abs(c["location"] - 300) <= 10 for c in got["changepoints"]] == [True], got
        assert [c["location"] for c in got["stream"]] == [got["changepoints"][0]["location"]], got
        # everything taken: no record waits in the tally, the answer's cursor is at the last chunk
        assert rc.hlen(keys.tally("trim")) == 0
        assert int(rc.hget(keys.answer("trim"), "cursor")) == 299
    finally:
        live.stop()


def test_two_workers_take_each_chunk_into_the_answer_once(redis):
    """Two workers in threads share a stream's three models (leases split the pairs); the chunk
    a model applies last is taken by whichever worker applied it, the other's compare-and-set
    fails. The stored answer equals the offline one (``detect_stream``, seeded as the service
    seeds the models) entry for entry: nothing duplicated, nothing lost."""
    live = LiveServer(redis.url)
    specs = ["gaussian", "gaussian:kappa0=0.1", "level"]
    try:
        named = [{"name": f"m{i}", "spec": spec} for i, spec in enumerate(specs)]
        r = live.client.post("/v1/streams", json={"name": "pair", "columns": ["v"], "models": named, "seed": 5})
        assert r.status_code == 201, r.text
        x = np.concatenate([shifted(400, 200, 4.0, seed=1), shifted(400, 200, -4.0, seed=2) + 4.0])
        post_all(live, "pair", x, 10)
        threads = [threading.Thread(target=drain, args=(redis.url,), kwargs={"worker_id": f"w{i}"}) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        got = live.client.get("/v1/streams/pair/changepoints").json()
        _, want = detect_stream(x, specs, chunk_size=10, seed=5)
        assert [c.location for c in want] and all(abs(a - b) <= 10 for a, b in zip([c.location for c in want], (200, 600)))
        names = {m["spec"]: m["name"] for m in named}
        want = [{**c.to_dict(), "support": {names[k]: v for k, v in c.support.items()}} for c in want]
        assert stripped(got["stream"]) == stripped(json.loads(json.dumps(want)))
        assert connect(redis.url).hlen(keys.tally("pair")) == 0
        # ?model= keeps one model's events (was ignored: every model's listed); by name, spec or kind
        assert {c["model"] for c in got["changepoints"]} == {"m0", "m1", "m2"}, got["changepoints"]
        for ask, name in (("m1", "m1"), ("level", "m2"), ("gaussian:kappa0=0.1", "m1")):
            one = live.client.get("/v1/streams/pair/changepoints", params={"model": ask}).json()
            assert one["changepoints"] == [c for c in got["changepoints"] if c["model"] == name] != [], (ask, one)
            assert one["stream"] == got["stream"]
        r = live.client.get("/v1/streams/pair/changepoints", params={"model": "nope"})
        assert r.status_code == 404 and r.json()["code"] == "model_not_found", r.text
    finally:
        live.stop()


def test_the_service_counts_a_reported_change_with_its_probability_now(redis):
    """25 yearly values, +3 sd at 12, point by point, the default portfolio: ``level`` and
    ``student-t`` report the jump (0.9955 and 0.9910) and hold 99.4 % of the posterior; only with
    their probabilities now (``Step.standing``, carried in the tally from the worker that applied the
    chunk to the one that takes it into the answer) is it a stream change (0.9928 at 24; with the
    confidences they reported, 0.9883). The service's answer equals ``detect_stream``'s."""
    live = LiveServer(redis.url)
    try:
        r = live.client.post("/v1/streams", json={"name": "yearly", "columns": ["v"], "seed": 0})
        assert r.status_code == 201, r.text
        y = 100 + 5 * np.random.default_rng(0).standard_normal(25)
        y[12:] += 15
        post_all(live, "yearly", y, 1)
        drain(redis.url)
        got = live.client.get("/v1/streams/yearly/changepoints").json()
        specs = [m["spec"] for m in live.client.get("/v1/streams/yearly").json()["models"]]
        _, want = detect_stream(y, specs, chunk_size=1, seed=0)
        assert [(c.location, c.detected_at) for c in want] == [(13, 24)] and want[0].confidence > 0.99
        names = {m["spec"]: m["name"] for m in live.client.get("/v1/streams/yearly").json()["models"]}
        want = [{**c.to_dict(), "support": {names[k]: v for k, v in c.support.items()}} for c in want]
        assert stripped(got["stream"]) == stripped(json.loads(json.dumps(want)))
        # the last change's gauges are the API's, read from Redis at each scrape: there in a process
        # that never saw the change (after a restart of cusp serve they were missing until the next one)
        from service import metrics as M

        for _ in range(2):
            text = live.client.get("/metrics").text
            assert 'cusp_stream_changepoint_last_observation{stream="yearly"} 13.0' in text
            assert f'cusp_stream_changepoint_last_confidence{{stream="yearly"}} {want[0]["confidence"]!r}' in text
            assert M.forget("yearly") > 0  # as a new process has it
    finally:
        live.stop()


def test_a_change_the_evidence_rejects_later_is_withdrawn_in_the_service_as_offline(redis):
    """Per-minute latency in ms with a daily cycle (250 + 30 sin, +- 20), no change, 1,800 rows in
    chunks of 60, the default portfolio: a change is found at 121 at 480 (the cycle's rise, read by
    the models that restarted there) and withdrawn at 1,740, a horizon later, its probability then
    far below the 0.5 that withdraws it (measured 2.1e-18; below 1e-20 before the level shifts that
    models keep within max_age rows in chunks; bound 1e-12). The service lists it under ``withdrawn`` and not under ``stream``, as
    ``cusp.Detector`` does; the result feed has the withdrawal (its own kind), POST /v1/detect lists
    it, and cusp_stream_changepoints_withdrawn_total counts it."""
    import cusp
    from service import metrics as M

    g = np.random.default_rng(3)
    y = 250 + 30 * np.sin(2 * np.pi * np.arange(1800) / 1440) + g.normal(0, 20, 1800)
    det = cusp.Detector(chunk_size=60, seed=0).update(y).flush()
    want = [(w.location, w.detected_at, w.withdrawn_at) for w in det.withdrawn]
    assert want == [(121, 480, 1740)] and det.changepoints == [] and det.withdrawn[0].confidence < 1e-12
    live = LiveServer(redis.url)
    try:
        before = M.STREAM_CHANGEPOINTS_WITHDRAWN.labels("cycle")._value.get()
        r = live.client.post("/v1/streams", json={"name": "cycle", "columns": ["ms"], "seed": 0})
        assert r.status_code == 201, r.text
        post_all(live, "cycle", y, 60)
        drain(redis.url)
        got = live.client.get("/v1/streams/cycle/changepoints").json()
        assert got["stream"] == []
        assert [(w["location"], w["detected_at"], w["withdrawn_at"]) for w in got["withdrawn"]] == want
        w = got["withdrawn"][0]
        assert (w["kind"], w["model"], w["seq"]) == ("stream_changepoint_withdrawn", "*", 28)
        assert w["confidence"] == pytest.approx(det.withdrawn[0].confidence, rel=1e-9, abs=1e-300)
        # the change itself was found, stored and pushed when it was; the withdrawal after it, in its own kind
        feed = live.client.get("/v1/streams/cycle/evidence",
                               params={"kind": ["stream_changepoint", "stream_changepoint_withdrawn"]}).json()["results"]
        assert [(e["kind"], e["location"]) for e in feed] == [("stream_changepoint", 121), ("stream_changepoint_withdrawn", 121)]
        # (rows without times: their chunk's arrival)
        assert w["location_time"] == feed[0]["location_time"] is not None and w["withdrawn_time"] >= w["location_time"]
        assert M.STREAM_CHANGEPOINTS_WITHDRAWN.labels("cycle")._value.get() == before + 1
        text = live.client.get("/metrics").text
        assert 'cusp_stream_changepoints_withdrawn_total{stream="cycle"}' in text
        # no change stands: no last-change gauges (they showed 121 while it stood)
        assert 'cusp_stream_changepoint_last_observation{stream="cycle"}' not in text
        # POST /v1/detect: the same series, the same answer
        r = live.client.post("/v1/detect", json={"values": y.tolist(), "chunk_size": 60})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["changepoints"] == []
        assert [(w["index"], w["detected_at"], w["withdrawn_at"]) for w in body["withdrawn"]] == want
    finally:
        live.stop()


def test_answer_commit_is_compare_and_set_and_fenced_by_incarnation(redis):
    """ANSWER writes only from the cursor it read and into the incarnation it read: a stale
    cursor gets 'stale', a stream deleted (or deleted and created again) gets 'gone'; neither
    writes anything."""
    live = LiveServer(redis.url)
    try:
        body = {"name": "cas", "columns": ["v"], "models": ["gaussian"], "seed": 0}
        assert live.client.post("/v1/streams", json=body).status_code == 201
        post_all(live, "cas", shifted(100, 1000, 0.0, seed=0), 10)
        drain(redis.url)
        store = WorkerStore(redis.url)
        cursor, state, uid = store.answer_head("cas")
        assert cursor == 9 and uid
        before = connect(redis.url).xlen(keys.changes("cas"))
        assert store.commit_answer("cas", uid, 3, 10, state.decode(), [], [("stream_changepoint", "{}")], 100, 100) == "stale"
        assert store.commit_answer("cas", b"another", 9, 10, state.decode(), [], [("stream_changepoint", "{}")], 100, 100) == "gone"
        assert connect(redis.url).xlen(keys.changes("cas")) == before
        assert live.client.delete("/v1/streams/cas").status_code == 204
        assert store.commit_answer("cas", uid, 9, 10, state.decode(), [], [("stream_changepoint", "{}")], 100, 100) == "gone"
        assert stream_keys_in_redis(redis.url, "cas") == []  # the answer's keys went with the stream
    finally:
        live.stop()


def test_a_dead_lettered_chunk_does_not_stall_the_answer(redis):
    """A chunk neither model can take (a value whose square overflows float64, planted past the
    API's validation) is dead-lettered by both; the answer takes it as a chunk where nothing is
    compared and goes on: the jump after it is found, supported by both models."""
    live = LiveServer(redis.url)
    try:
        body = {"name": "poison", "columns": ["v"], "models": ["gaussian", "level"], "seed": 2}
        assert live.client.post("/v1/streams", json=body).status_code == 201
        x = shifted(400, 200, 5.0, seed=3)
        post_all(live, "poison", x[:100], 10)
        rc = connect(redis.url)
        rc.xadd(keys.inbox("poison"), {"rows": np.array([[1e160]]).astype("<f8").tobytes(), "n": 1}, id=keys.entry_id(10))
        rc.set(keys.seq("poison"), 10)
        for seq, lo in enumerate(range(100, 400, 10), start=11):
            assert live.client.post("/v1/streams/poison/chunks", json={"seq": seq, "rows": x[lo : lo + 10, None].tolist()}).status_code == 202
        drain(redis.url, max_attempts=1)
        assert live.client.get("/v1/streams/poison").json()["dead_letters"] == 2
        assert int(rc.hget(keys.answer("poison"), "cursor")) == 40 and rc.hlen(keys.tally("poison")) == 0
        stream = live.client.get("/v1/streams/poison/changepoints").json()["stream"]
        # the planted row is no row of the stream's (the API did not count it): the change is at 200
        assert len(stream) == 1 and abs(stream[0]["location"] - 200) <= 10, stream
        assert set(stream[0]["support"]) == {"gaussian", "level"}, stream
    finally:
        live.stop()



def test_a_model_that_missed_a_chunk_leaves_the_comparison():
    """StreamAnswer.chunk: a model that has seen fewer observations than the others (it
    dead-lettered a chunk they took) gets probability 0 from then on, so its events no longer
    count and the others' are weighed among themselves; no model applied: nothing compared."""
    from service.detect import Event, StreamAnswer

    def ev(loc: int, at: int, conf: float) -> Event:
        return Event(location=loc, chunk=0, seq=0, detected_at=at, delay=at - loc, confidence=conf,
                     log_bayes_factor=0.0, log_prior_odds=0.0, adapted=True)

    a = StreamAnswer(["a", "b"], window=10)
    assert a.chunk(10, {"a": (10, -10.0), "b": (10, -10.0)}) == []
    assert a.chunk(10, {"a": None, "b": (20, -20.0)}) == []  # a dead-lettered the chunk
    # b's event alone: equal evidence would give it half; a is out, so b's confidence is the bound
    got = a.chunk(10, {"a": (20, -1.0), "b": (30, -30.0)}, {"b": [ev(25, 30, 0.995)]})
    assert [(c.location, c.detected_at, c.support["b"][0]) for c in got] == [(25, 30, 1.0)]
    assert got[0].confidence == 0.995 and got[0].support == {"b": (1.0, 0.995)}
    # a's event is worth nothing now
    assert a.chunk(10, {"a": (30, -1.0), "b": (40, -40.0)}, {"a": [ev(60, 40, 0.9999)]}) == []
    # nobody applied the chunk: n moves on, nothing is compared
    b = StreamAnswer(["a"], window=10)
    assert b.chunk(7, {"a": None}) == [] and b.n == 7


def test_model_probabilities_while_a_model_is_behind(redis):
    """GET /v1/streams/{s} gave no posterior model probabilities while the models had seen
    different numbers of observations, which on a busy stream is nearly always (the live demo's
    P(model) column stayed empty). They now come from the stream's answer at the last chunk every
    model applied: the probabilities computed when all were level."""
    live = LiveServer(redis.url)
    try:
        r = live.client.post("/v1/streams", json={"name": "behind", "columns": ["v"], "seed": 2,
                                                   "models": [{"name": "a", "spec": "gaussian"}, {"name": "b", "spec": "level"}]})
        assert r.status_code == 201, r.text
        x = shifted(300, 150, 3.0, seed=8) * 20 + 1000
        post_all(live, "behind", x[:200], 20)
        drain(redis.url)
        level = {m["name"]: (m["posterior_probability"], m["probability_observations"])
                 for m in live.client.get("/v1/streams/behind").json()["models"]}
        assert {n for _, n in level.values()} == {200} and sum(p for p, _ in level.values()) == pytest.approx(1.0)
        for seq, lo in enumerate(range(200, 300, 20), start=10):
            r = live.client.post("/v1/streams/behind/chunks", json={"seq": seq, "rows": x[lo:lo + 20, None].tolist()})
            assert r.status_code == 202, r.text
        w = Worker(redis.url)
        try:
            assert w._take("behind", "a")
            assert w._process(w.hot[("behind", "a")]) == 5  # model a only: b stays at 200 observations
        finally:
            w.release_all()
        models = {m["name"]: m for m in live.client.get("/v1/streams/behind").json()["models"]}
        assert (models["a"]["observations"], models["b"]["observations"]) == (300, 200)
        assert {k: (m["posterior_probability"], m["probability_observations"]) for k, m in models.items()} == level
    finally:
        live.stop()


def test_the_embedded_redis_saves_and_stops_on_close(tmp_path):
    """``EmbeddedRedis.close`` saves and stops its server (the socket refuses afterwards) and a new
    one on the same directory has the data: what ``cusp serve`` relies on between runs."""
    import redis as redis_py
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    r = EmbeddedRedis(tmp_path / "redis")
    redis_py.Redis.from_url(r.url).set("kept", "yes")
    r.close()
    with pytest.raises(redis_py.ConnectionError):
        redis_py.Redis.from_url(r.url, retry=Retry(NoBackoff(), 0)).ping()
    again = EmbeddedRedis(tmp_path / "redis")
    try:
        assert redis_py.Redis.from_url(again.url).get("kept") == b"yes"
    finally:
        again.close()

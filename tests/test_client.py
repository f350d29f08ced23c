"""cusp.Client against a running API (real HTTP, embedded redis-server, a worker in burst mode),
issue 17 item 3: automatic seq, idempotent resends through real network faults, results paged
and live over SSE with resume, errors carrying the server's message, and cusp.Detector giving
the service's numbers for the same data, seed and chunking."""

import http.server
import json
import threading
import time
import uuid
import warnings
from datetime import datetime, timedelta, timezone

import httpx
import numpy as np
import pytest

import cusp
from service import times as T
from service.worker import Worker
from tests.service_fixtures import LiveServer


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url)
    yield server
    server.stop()


@pytest.fixture
def client(live):
    with cusp.Client(live.url, backoff=0.01) as c:
        yield c


def name():
    return "c" + uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def worker(redis_url):
    """One worker for the module: a new one per burst would count the last one's heartbeat as a
    live worker for its lease time and take only its share of the work."""
    w = Worker(redis_url)
    yield w
    w.release_all()


def burst(w):
    try:
        return w.run_until_idle()
    finally:
        w.release_all()


def shifted(n=300, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(0, 1, n), rng.normal(3, 1, n)]).round(4)


class FaultyProxy:
    """A real HTTP proxy in front of the API that breaks the way networks do: ``drop`` requests
    whose path ends so are forwarded and processed, then the connection is closed with no answer
    (the client cannot know the request landed); ``busy`` requests are answered 503 with
    Retry-After: 0 without forwarding; an SSE feed is cut after ``cut_sse`` events."""

    def __init__(self, upstream: str):
        self.drop: dict[str, int] = {}
        self.busy: dict[str, int] = {}
        self.cut_sse = 0
        self.seen: list[tuple[str, str, str | None]] = []  # method, path, Last-Event-ID
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _take(self, faults: dict) -> bool:
                for suffix, left in faults.items():
                    if self.path.split("?")[0].endswith(suffix) and left > 0:
                        faults[suffix] = left - 1
                        return True
                return False

            def _forward(self):
                proxy.seen.append((self.command, self.path, self.headers.get("Last-Event-ID")))
                if self._take(proxy.busy):
                    self.send_response(503)
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Type", "application/json")
                    body = b'{"detail": "busy"}'
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")}
                if self.path.split("?")[0].endswith("/sse"):
                    return self._sse(headers)
                r = httpx.request(self.command, upstream + self.path, content=body, headers=headers, timeout=30)
                if self._take(proxy.drop):
                    self.close_connection = True  # processed upstream; the answer is lost
                    return
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def _sse(self, headers):
                cut, proxy.cut_sse = proxy.cut_sse, 0
                with httpx.stream("GET", upstream + self.path, headers=headers, timeout=httpx.Timeout(30, read=None)) as r:
                    self.send_response(r.status_code)
                    self.send_header("Content-Type", r.headers.get("content-type", "text/event-stream"))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    events = 0
                    try:
                        for line in r.iter_lines():
                            self.wfile.write((line + "\n").encode())
                            self.wfile.flush()
                            if not line and cut:
                                events += 1
                                if events >= cut:
                                    return  # the connection drops mid-feed
                    except (BrokenPipeError, ConnectionResetError):
                        return  # the client left

            do_GET = do_POST = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(live):
    p = FaultyProxy(live.url)
    yield p
    p.close()


def test_create_post_read_and_delete(client, live, worker):
    s = name()
    info = client.create_stream(s, ["ms"])  # no models: the default portfolio
    assert [m["name"] for m in info["models"]] == ["level", "ar", "trend", "student-t", "seasonal"] and info["next_seq"] == 0
    x = shifted()
    acks = [client.post(s, x[lo : lo + 20]) for lo in range(0, 600, 20)]
    assert [a["seq"] for a in acks] == list(range(30)) and {a["status"] for a in acks} == {"accepted"}
    assert client.post(s, x[:20], seq=0)["status"] == "duplicate"
    assert client.next_seq(s) == 30
    assert burst(worker) == 150  # 5 models x 30 chunks
    results = list(client.results(s))
    assert len([r for r in results if r["kind"] == "result"]) == 150
    assert [r["seq"] for r in client.results(s, model="ar") if r["kind"] == "result"] == list(range(30))
    since = results[40]["id"]
    assert [r["id"] for r in client.results(s, since=since)] == [r["id"] for r in results[41:]]
    cps = client.changepoints(s)
    assert [c["location"] for c in cps["stream"]] == [300]
    level = client.changepoints(s, model="level")
    assert level["changepoints"] == [c for c in cps["changepoints"] if c["model"] == "level"] and level["stream"] == cps["stream"]
    assert client.wait(s)["models"][0]["observations"] == 600
    # a second client (another process, say) continues the sequence from the server's next_seq
    with cusp.Client(live.url) as other:
        assert other.post(s, x[:5])["seq"] == 30
    burst(worker)
    client.delete_stream(s)
    assert s not in client.streams()
    with pytest.raises(cusp.NotFoundError, match=f"no stream named '{s}'") as err:
        client.stream(s)
    assert err.value.status == 404


def test_detector_gives_the_service_numbers(client, live, worker):
    """Same data, times, seed and chunks: the worker's per-chunk evidence and change points, the
    API's model-averaged change points and POST /v1/detect's answer equal cusp.Detector's, bit for
    bit, and the change points carry the same times; expected_run_length is a duration, which
    both turn into observations by the rows' mean interval (250 minutes of a row every 30 s: 500)."""
    s, x = name(), shifted(seed=4)
    stamps = [datetime(2026, 3, 1, tzinfo=timezone.utc) + timedelta(seconds=30 * i) for i in range(600)]
    settings = {"threshold": 0.995, "expected_run_length": "250m"}
    client.create_stream(s, ["ms"], models=["level", "ar", "trend"], seed=7, detector=settings)
    for lo in range(0, 600, 20):
        client.post(s, x[lo : lo + 20], times=stamps[lo : lo + 20])
    burst(worker)
    det = cusp.Detector(models=["level", "ar", "trend"], chunk_size=20, seed=7, **settings).update(x, times=stamps)
    entries = list(client.results(s))
    for m in det.names:
        assert [e["log_evidence"] for e in entries if e["model"] == m and e["kind"] == "result"] == \
               [r.log_evidence for r in det.results[m]]
        assert [(e["location"], e["confidence"], e["location_time"]) for e in entries if e["model"] == m and e["kind"] == "changepoint"] == \
               [(e.location, e.confidence, T.format(e.location_time)) for e in det.events[m]]
    assert [{k: v for k, v in c.items() if k not in ("id", "model", "kind", "seq", "detected_time", "delay_seconds")}
            for c in client.changepoints(s)["stream"]] == [
        {**c.to_dict(), "support": {m: list(v) for m, v in c.support.items()}, "location_time": T.format(c.location_time)}
        for c in det.changepoints]
    assert [c.location_time for c in det.changepoints] == [stamps[300].timestamp()]
    in_rows = cusp.Detector(models=["level", "ar", "trend"], chunk_size=20, seed=7, threshold=0.995, expected_run_length=500)
    assert [(e.location, e.confidence) for e in in_rows.update(x).events["level"]] == \
           [(e.location, e.confidence) for e in det.events["level"]]
    one = client.detect(x, models=["level", "ar", "trend"], chunk_size=20, seed=7,
                        detector={"threshold": 0.995, "expected_run_length": 500})
    assert [c["index"] for c in one["changepoints"]] == [c.location for c in det.changepoints] == [300]
    assert [m["log_evidence"] for m in one["models"]] == list(det.evidence.values())
    client.delete_stream(s)


def test_detector_times_are_checked_before_anything_is_processed():
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    det = cusp.Detector(models=["level"]).update([1.0, 2.0], times=[t0, t0 + timedelta(days=1)])
    for call, message in [
        (lambda: det.update([3.0]), "earlier rows came with times; give times with every update"),
        (lambda: det.update([3.0], times=[t0 + timedelta(days=1)]), "times\\[0\\] .* is not after the last update's last time"),
        (lambda: det.update([3.0], times=[datetime(2027, 1, 1)]), "times\\[0\\]: .* is a naive datetime"),
        (lambda: det.update([3.0, 4.0], times=["2027-01-01"]), "times has 1 entries for 2 rows"),
    ]:
        with pytest.raises(cusp.InputError, match=message):
            call()
    assert det.n == 2 and det.update([3.0], times=["2026-01-03"]).n == 3
    untimed = cusp.Detector(models=["level"]).update([1.0])
    with pytest.raises(cusp.InputError, match="came without times"):
        untimed.update([2.0], times=[t0])


def test_detector_takes_what_the_service_takes():
    """Values the service refuses at ingest are refused in-process too, before anything is processed
    (found by a new user: text was read as numbers, and 1e200 raised an EngineError from inside a
    model, or a ModelError, depending on the model list); a whole series in one update without
    chunk_size, one chunk in which nothing can be found, is warned about."""
    det = cusp.Detector(models=["level", "student-t"]).update([1.0, 2.0, 1.5])
    for x, message in [(["1", "2"], "numbers, not text"), ("3", "numbers, not text"), ([True, False], "numbers, not booleans"),
                       ([[1.0], ["a"]], "numbers, not text"), ([1e200], r"row 0, column 0 is 1e\+200; values must be within"),
                       ([[1.0, 2.0], [3.0]], "rows of numbers of one width")]:
        with pytest.raises(cusp.InputError, match=message):
            det.update(x)
    assert det.n == 3 and det.update(np.array([2.0])).n == 4
    with pytest.raises(cusp.InputError, match="nothing after ':'"):
        cusp.Detector(models=["level:"])
    y = np.random.default_rng(0).standard_normal(600)
    with pytest.warns(UserWarning, match="600 rows and no chunk_size is one chunk"):
        cusp.Detector(models=["level"]).update(y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cusp.Detector(models=["level"], chunk_size=50).update(y)  # chunked: no warning
        cusp.Detector(models=["level"]).update(y[:100]).update(y[100:])  # a first chunk of 100, then 500: as the service takes them
        ro = y.copy()
        ro.flags.writeable = False  # a read-only view (a pandas Series' values): no torch warning
        cusp.Detector(models=["level"], chunk_size=50).update(ro)


def test_lost_answers_and_busy_server_are_retried_with_the_same_seq(live, proxy, worker):
    s = name()
    with cusp.Client(proxy.url, backoff=0.01) as c:
        proxy.drop["/v1/streams"] = 1  # the stream is created but the answer is lost
        assert c.create_stream(s, ["a"], models=["level"])["name"] == s
        proxy.drop["/chunks"] = 2  # stored twice over, answers lost: the resend is a duplicate
        proxy.busy["/chunks"] = 1
        ack = c.post(s, [1.0, 2.0, 3.0])
        assert ack == {"seq": 0, "status": "duplicate", "id": "chunk-0"}
        assert c.post(s, [4.0, 5.0])["seq"] == 1
        posts = [p for m, p, _ in proxy.seen if m == "POST" and p.endswith("/chunks")]
        assert len(posts) == 5  # dropped, dropped, 503, duplicate, then seq 1
        proxy.drop[f"/{s}"] = 1  # deleted, answer lost: the resend's 404 means done
        burst(worker)
        c.delete_stream(s)
    assert s not in live.client.get("/v1/streams").json()["streams"]


def test_retries_run_out_with_a_clear_error(live, proxy):
    s = name()
    live.client.post("/v1/streams", json={"name": s, "columns": ["a"], "models": ["level"]})
    with cusp.Client(proxy.url, retries=2, backoff=0.0) as c:
        proxy.busy["/chunks"] = 5
        with pytest.raises(cusp.ServerUnavailable, match="POST /v1/streams/.*/chunks: 503: busy \\(after 3 attempts\\)"):
            c.post(s, [1.0])
        proxy.busy.clear()
        assert c.post(s, [1.0])["status"] == "accepted"  # the same seq 0: nothing was stored
    with cusp.Client("http://127.0.0.1:9", retries=1, backoff=0.0) as dead:
        with pytest.raises(cusp.ServerUnavailable, match="ConnectError"):
            dead.streams()


def test_live_results_resume_after_a_dropped_feed(live, proxy, worker):
    s = name()
    with cusp.Client(proxy.url, backoff=0.01) as c:
        c.create_stream(s, ["a"], models=["level", "ar"])
        for q in range(4):
            c.post(s, np.arange(q * 10, q * 10 + 10, dtype=float) % 7)
        burst(worker)
        stored = list(c.results(s))
        proxy.cut_sse = 3
        feed = c.results(s, follow=True)
        got = [next(feed) for _ in stored]
        feed.close()
    assert [e["id"] for e in got] == [e["id"] for e in stored]  # nothing lost, nothing twice
    feeds = [last for m, p, last in proxy.seen if p.endswith("/evidence/sse")]
    assert feeds == [None, stored[2]["id"]]  # the second connection resumed with Last-Event-ID


def test_a_model_is_named_by_its_name_or_its_spec_live_and_paged(client, live, worker):
    """``results(model=...)`` takes a model's spec as well as its name (``gmm:components=2`` is
    ``gmm_components2``), paged and live alike (a review found it returned nothing live for a
    spec): the pages and both feeds take ``?model=`` and ``?kind=`` and resolve a spec on the
    server, in one place (the client resolved it for the feeds itself before, a twin of the
    server's rule); a model the stream does not have is a NotFoundError either way."""
    s = name()
    client.create_stream(s, ["a", "b"], models=["gaussian", "gmm:components=2"])
    client.post(s, np.random.default_rng(0).normal(size=(30, 2)))
    burst(worker)
    paged = list(client.results(s, model="gmm:components=2", kind="result"))
    assert paged and {e["model"] for e in paged} == {"gmm_components2"}
    assert paged == list(client.results(s, model="gmm_components2", kind="result"))
    for transport in ("sse", "ws"):
        feed = client.results(s, model="gmm:components=2", kind="result", follow=True, transport=transport)
        assert [next(feed) for _ in paged] == paged
        feed.close()
    # '*': the stream's own change points, as their entries name it (a 404 before; none here)
    assert list(client.results(s, model="*")) == [] and list(client.results(s, model="*", kind="stream_changepoint")) == []
    for follow, transport in ((False, "sse"), (True, "sse"), (True, "ws")):
        with pytest.raises(cusp.NotFoundError, match="no model 'zzz'"):
            next(iter(client.results(s, model="zzz", follow=follow, transport=transport)))
    # the feed itself, over HTTP: filtered on the server, and refused before it opens
    query = {"model": "gmm:components=2", "kind": "result"}
    with httpx.stream("GET", f"{live.url}/v1/streams/{s}/evidence/sse", params=query, timeout=30) as r:
        events = (json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:"))
        assert [next(events) for _ in paged] == paged
    for params, status in (({"model": "zzz"}, 404), ({"kind": "nope"}, 422)):
        assert httpx.get(f"{live.url}/v1/streams/{s}/evidence/sse", params=params).status_code == status
    client.delete_stream(s)


def test_a_filtered_feed_of_a_busy_stream_keeps_sending_keep_alives(client, live, redis_url):
    """A keep-alive is the feed's sign of life (a proxy's idle timeout, a client's dead-connection
    check), and the store sends one after a second without news. A feed whose filter drops every
    entry of a busy stream sent nothing at all (a review: 0 bytes in 4 s while entries came every
    0.3 s); it now sends one at least every ``KEEPALIVE_SECONDS`` while it drops them."""
    from service.api.routes.results import KEEPALIVE_SECONDS
    from service.store import connect, keys

    s = name()
    client.create_stream(s, ["a"], models=["gaussian"])
    r, stop = connect(redis_url), threading.Event()

    def busy():  # result entries every 0.1 s, as a worker writes them (a model's, kind 'result')
        while not stop.wait(0.1):
            r.xadd(keys.out(s), {"model": "gaussian", "kind": "result", "data": json.dumps({"seq": 0})})

    writer = threading.Thread(target=busy)
    writer.start()
    try:
        lines, t0 = [], time.monotonic()
        with httpx.stream("GET", f"{live.url}/v1/streams/{s}/evidence/sse", params={"kind": "dead_letter"}, timeout=30) as resp:
            for line in resp.iter_lines():
                lines.append((time.monotonic() - t0, line))
                if time.monotonic() - t0 > 3.5 * KEEPALIVE_SECONDS:
                    break
    finally:
        stop.set()
        writer.join()
    alive = [t for t, line in lines if line.startswith(": keep-alive")]
    assert len(alive) >= 2 and not [line for _, line in lines if line.startswith("data:")], lines
    client.delete_stream(s)


def test_bad_arguments_and_refusals_raise_exceptions_naming_the_problem(client, live):
    s = name()
    client.create_stream(s, ["a", "b"], models=["gaussian"])
    for call, kind, message in [
        (lambda: client.post(s, [[1.0, float("inf")]]), cusp.InputError, "rows\\[0\\]\\[1\\] is inf"),
        (lambda: client.post(s, [[1.0, 2.0], [3.0]]), cusp.InputError, "rows\\[1\\] has 1 values, rows\\[0\\] has 2"),
        (lambda: client.post(s, []), cusp.InputError, "non-empty list"),
        (lambda: client.post(s, [["x", 1.0]]), cusp.InputError, "rows\\[0\\]\\[0\\] must be a number"),
        (lambda: client.post(s, [[1.0, 2.0]], seq=-1), cusp.InputError, "seq must be an integer"),
        (lambda: client.post("a/b", [[1.0, 2.0]]), cusp.InputError, "stream name"),
        (lambda: client.create_stream(name(), "ab"), cusp.InputError, "columns must be a non-empty list"),
        (lambda: client.create_stream(name(), ["a"], models=["nope"]), cusp.InvalidRequestError, "422: model 'nope': unknown model"),
        (lambda: client.post(s, [[1.0, 2.0, 3.0]]), cusp.InvalidRequestError, "has 3 values, the stream has 2 columns"),
        (lambda: client.post(s, [[1.0, 2.0]], seq=4), cusp.ConflictError, "out of order: expected seq 0"),
        (lambda: cusp.Client("localhost:8000"), cusp.InputError, "url must be an http"),
        (lambda: cusp.Client(live.url, retries=-1), cusp.InputError, "retries must be an integer >= 0"),
        (lambda: client.detect([1.0, 2.0], times=["2024-01-01T00:00:00Z", "2023-01-01T00:00:00Z"]), cusp.InputError,
         "times\\[1\\] is before times\\[0\\]"),
        (lambda: client.detect([1.0, 2.0], times=[0, 60, 120]), cusp.InputError, "times has 3 entries for 2 rows"),
    ]:
        with pytest.raises(kind, match=message):
            call()
    assert client.stream(s)["next_seq"] == 0  # nothing stored
    assert client.post(s, [[1.0, 2.0]])["seq"] == 0


def test_api_keys(redis_url):
    server = LiveServer(redis_url, api_keys="writer-key-1,reader-key-1:read")
    try:
        s = name()
        with cusp.Client(server.url, api_key="writer-key-1") as w, cusp.Client(server.url, api_key="reader-key-1") as r, \
                cusp.Client(server.url) as anon:
            w.create_stream(s, ["a"], models=["level"])
            with pytest.raises(cusp.AuthenticationError, match="403: this API key is read-only"):
                r.post(s, [1.0])
            with pytest.raises(cusp.AuthenticationError, match="401: missing or unknown API key"):
                anon.stream(s)
            assert r.stream(s)["name"] == s
            w.delete_stream(s)
    finally:
        server.stop()

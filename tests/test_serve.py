"""`cusp serve` as a user runs it: one process tree with the embedded Redis and CUSP_WORKERS
worker processes. The workers are supervised (a killed one comes back), their metrics appear in
the API's one /metrics exposition, and SIGTERM stops the workers and the embedded Redis too."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.service import children_of as children
from tests.service_fixtures import free_port

CUSP = str(Path(sys.executable).parent / "cusp")


def worker_pids(proc) -> list[int]:
    out = []
    for c in children(proc.pid):
        try:
            # the argument itself: a substring also matched the redis-server, whose config path holds the
            # test's tmp directory (a test with "worker" in its name)
            if b"worker" in Path(f"/proc/{c}/cmdline").read_bytes().split(b"\0"):
                out.append(c)
        except OSError:
            continue
    return out


def redis_in(data_dir: Path) -> list[int]:
    """redis-server processes whose working directory is ``data_dir`` (the embedded server chdirs there)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.readlink(p / "cwd") == str(data_dir) and b"redis-server" in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                continue
    return out


def alive(pid: int) -> bool:
    """Running, not a zombie (an orphan waits for whoever adopted it to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def metric(text: str, name: str, **labels) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def start_serve(tmp_path: Path, name: str = "serve", workers: int = 2, port_option: bool = False, **env_extra: str):
    """`cusp serve` on ``tmp_path/data``, logging to ``tmp_path/NAME.log``, once it answers /readyz;
    ``port_option``: the port given as ``--port`` rather than CUSP_PORT; ``env_extra``: more variables."""
    port = free_port()
    env = {**os.environ, "CUSP_DATA_DIR": str(tmp_path / "data"), "CUSP_PORT": str(port), "CUSP_HOST": "127.0.0.1",
           "CUSP_WORKERS": str(workers), "CUSP_LEASE_SECONDS": "2", **env_extra}
    env.pop("CUSP_REDIS_URL", None)
    with open(tmp_path / f"{name}.log", "ab") as log:
        proc = subprocess.Popen([CUSP, "serve", *(["--port", str(port)] if port_option else [])], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20)
    try:
        wait_for(lambda: ready(client), 60, "cusp serve to answer /readyz")
    except BaseException:
        stop_serve(proc, client)
        raise
    return proc, client


def ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def stop_serve(proc, client) -> None:
    client.close()
    if proc.poll() is None:  # a failed test: SIGTERM, so serve still stops its Redis and workers
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def served(tmp_path):
    proc, client = start_serve(tmp_path)
    try:
        yield proc, client, tmp_path
    finally:
        stop_serve(proc, client)


def test_serve_runs_supervised_worker_processes_with_one_metrics_exposition(served):
    proc, client, tmp = served
    workers = wait_for(lambda: (w := worker_pids(proc)) and len(w) == 2 and w, 30, "two worker processes")
    # both loops running (a child still importing torch serves no metrics yet)
    wait_for(lambda: metric(client.get("/metrics").text, "cusp_workers") == 2, 60, "both worker loops to report")
    assert client.post("/v1/streams", json={"name": "s", "columns": ["x"], "models": ["gaussian", "gmm:components=2"]}).status_code == 201
    for q in range(4):
        assert client.post("/v1/streams/s/chunks", json={"seq": q, "rows": [[0.1 * q], [1.0], [-0.5]]}).status_code == 202
    wait_for(lambda: all(m["last_seq"] == 3 for m in client.get("/v1/streams/s").json()["models"]), 60, "both models to apply 4 chunks")

    text = client.get("/metrics").text
    names = [f.name for f in text_string_to_metric_families(text)]
    assert len(names) == len(set(names)), "one family per name"
    assert metric(text, "cusp_workers") == 2  # one loop per worker process, summed
    assert metric(text, "cusp_worker_leases") == 2
    for m in ("gaussian", "gmm_components2"):  # the workers' series, through the API's /metrics
        assert metric(text, "cusp_chunks_processed_total", stream="s", model=m) == 4
        assert metric(text, "cusp_observations_seen", stream="s", model=m) == 12
    assert metric(text, "cusp_ingested_chunks_total", stream="s") == 4  # and the API's own

    os.kill(workers[0], signal.SIGKILL)  # the supervisor starts a new one; the pair's lease lapses and moves
    wait_for(lambda: (w := worker_pids(proc)) and len(w) == 2 and workers[0] not in w, 30, "the killed worker to be replaced")
    for q in range(4, 6):
        assert client.post("/v1/streams/s/chunks", json={"seq": q, "rows": [[0.2], [0.3]]}).status_code == 202
    wait_for(lambda: all(m["last_seq"] == 5 for m in client.get("/v1/streams/s").json()["models"]), 60,
             "both models to go on after the worker was replaced")
    seqs = sorted(r["seq"] for r in client.get("/v1/streams/s/evidence").json()["results"] if r["kind"] == "result")
    assert seqs == [q for q in range(6) for _ in range(2)]  # exactly once, whichever process applied it

    redis = redis_in((tmp / "data").resolve())
    assert len(redis) == 1
    # a live SSE follower: its feed never ends on its own, and SIGTERM waited on it for ever (an operator's trial)
    lines: list[str] = []

    def follow() -> None:
        with contextlib.suppress(httpx.HTTPError), httpx.Client(base_url=client.base_url, timeout=None) as sse, \
                sse.stream("GET", "/v1/streams/s/evidence/sse") as r:
            for line in r.iter_lines():
                lines.append(line)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    wait_for(lambda: any(line.startswith("id:") for line in lines), 30, "the SSE feed's first result")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    follower.join(10)
    assert not follower.is_alive(), "the SSE feed ended with the server"
    wait_for(lambda: not redis_in((tmp / "data").resolve()) and not any(Path(f"/proc/{w}").exists() for w in workers[1:]), 15,
             "the embedded Redis and the workers to stop with cusp serve")
    # the supervisor said why it restarted one, once: the replacement lived on (a child started from
    # a short-lived thread would be killed by PR_SET_PDEATHSIG as soon as that thread ended)
    assert (tmp / "serve.log").read_bytes().count(b"exited with") == 1


def post_until_stored(client: httpx.Client, stream: str, seq: int, rows: list, timeout: float = 60) -> int:
    """Post one chunk, resending the same seq and data on 503 or a connection error (as a client
    should while Redis is away); the final status (202 stored, or 200 duplicate)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            resp = client.post(f"/v1/streams/{stream}/chunks", json={"seq": seq, "rows": rows})
            if resp.status_code in (200, 202):
                return resp.status_code
            assert resp.status_code == 503, resp.text
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"seq {seq} not stored within {timeout} s"
        time.sleep(0.1)


def applied(client: httpx.Client, stream: str, last: int) -> bool:
    try:
        resp = client.get(f"/v1/streams/{stream}")
    except httpx.TransportError:
        return False
    return resp.status_code == 200 and all(m["last_seq"] == last for m in resp.json()["models"])


def test_serve_restarts_its_embedded_redis_after_a_sigkill_and_loses_nothing(served):
    """The embedded redis-server is SIGKILLed under a running `cusp serve`: serve starts a new one
    on the same data directory (append-only file), answers again, and its worker processes
    reconnect; every chunk acknowledged before or after the kill is applied exactly once."""
    proc, client, tmp = served
    data = (tmp / "data").resolve()
    models = ["gaussian", "gmm:components=2"]
    assert client.post("/v1/streams", json={"name": "s", "columns": ["x"], "models": models}).status_code == 201
    rows = [[[0.1 * q + 0.01 * i] for i in range(5)] for q in range(10)]
    for q in range(5):
        assert client.post("/v1/streams/s/chunks", json={"seq": q, "rows": rows[q]}).status_code == 202
    wait_for(lambda: applied(client, "s", 4), 60, "both models to apply 5 chunks")

    [old] = redis_in(data)
    os.kill(old, signal.SIGKILL)
    assert post_until_stored(client, "s", 5, rows[5]) == 202  # accepted once Redis is back
    [new] = wait_for(lambda: redis_in(data), 30, "a new redis-server in the same data directory")
    assert new != old and new in children(proc.pid)  # serve's own child, not a daemon
    for q in range(6, 10):
        assert post_until_stored(client, "s", q, rows[q]) == 202
    assert ready(client)
    wait_for(lambda: applied(client, "s", 9), 60, "the worker processes to reconnect and apply every chunk",)
    results = [r for r in client.get("/v1/streams/s/evidence").json()["results"] if r["kind"] == "result"]
    for m in ("gaussian", "gmm_components2"):
        mine = [r for r in results if r["model"] == m]
        assert [r["seq"] for r in mine] == list(range(10)), m  # nothing lost, nothing doubled, in order
        assert mine[-1]["n"] == 50
    info = client.get("/v1/streams/s").json()
    assert info["next_seq"] == 10 and all(m["observations"] == 50 for m in info["models"]), info
    log = (tmp / "serve.log").read_bytes()
    assert log.count(b"embedded redis-server (pid %d) exited with" % old) == 1, log[-3000:]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    wait_for(lambda: not redis_in(data), 15, "the restarted Redis to stop with cusp serve")


def test_sigkilled_serve_leaves_no_redis_server_or_worker_behind(served):
    """`cusp serve` SIGKILLed: its redis-server and worker processes stop by themselves
    (PR_SET_PDEATHSIG), Redis flushing its append-only file; a new `cusp serve` on the same
    data directory finds every acknowledged chunk."""
    proc, client, tmp = served
    data = (tmp / "data").resolve()
    workers = wait_for(lambda: (w := worker_pids(proc)) and len(w) == 2 and w, 30, "two worker processes")
    assert client.post("/v1/streams", json={"name": "s", "columns": ["x"], "models": ["gaussian"]}).status_code == 201
    for q in range(3):
        assert client.post("/v1/streams/s/chunks", json={"seq": q, "rows": [[0.5 * q], [1.0]]}).status_code == 202
    [redis] = redis_in(data)

    proc.kill()
    proc.wait()
    wait_for(lambda: not any(alive(p) for p in (redis, *workers)), 15,
             "the redis-server and the workers of the SIGKILLed cusp serve to exit")

    proc2, client2 = start_serve(tmp, "serve2", workers=0)
    try:
        assert client2.get("/v1/streams/s").json()["next_seq"] == 3
    finally:
        stop_serve(proc2, client2)
    wait_for(lambda: not redis_in(data), 15, "the second serve's Redis to stop with it")


def test_merged_exposition_sums_counters_combines_process_gauges_and_skips_garbage():
    """The API's /metrics under `cusp serve`: its own registry plus each worker's text, merged."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    from service import metrics as M

    def worker(chunks: float, leases: float, redis_up: float, log_z: float) -> str:
        reg = CollectorRegistry()
        child = Counter("cusp_chunks_processed", "c", ("stream", "model"), registry=reg).labels("m1", "g")
        child.inc(chunks)
        made.append(child._created)
        Gauge("cusp_worker_leases", "l", registry=reg).set(leases)
        Gauge("cusp_redis_up", "r", registry=reg).set(redis_up)
        Gauge("cusp_log_evidence_nats", "z", ("stream", "model"), registry=reg).labels("m1", "g").set(log_z)
        Histogram("cusp_annealing_steps", "h", ("stream", "model"), buckets=(1, 5), registry=reg).labels("m1", "g").observe(3)
        return generate_latest(reg).decode()

    made: list[float] = []
    texts = [worker(3, 1, 1, -10.0), worker(4, 2, 0, -11.0)]
    text = M.merged_exposition([*texts, "cusp_broken{ 1\n"]).decode()
    fams = list(text_string_to_metric_families(text))
    assert len({f.name for f in fams}) == len(fams)
    assert metric(text, "cusp_chunks_processed_total", stream="m1", model="g") == 7  # counters add up
    assert metric(text, "cusp_annealing_steps_count", stream="m1", model="g") == 2  # histograms too
    assert metric(text, "cusp_annealing_steps_bucket", stream="m1", model="g", le="5.0") == 2
    assert metric(text, "cusp_worker_leases") == 3 + M.WORKER_LEASES._value.get()  # per-process gauges: summed
    assert metric(text, "cusp_redis_up") == 0  # the worst of the processes
    assert metric(text, "cusp_log_evidence_nats", stream="m1", model="g") == -10.0  # one series, first seen
    assert "cusp_broken" not in text
    # each counter's _created: once, as a gauge beside its family, the earliest of the processes'
    created = [f for f in fams if f.name == "cusp_chunks_processed_created"]
    assert len(created) == 1 and created[0].type == "gauge"
    assert metric(text, "cusp_chunks_processed_created", stream="m1", model="g") == min(made)


def test_merged_exposition_keeps_what_the_change_point_alert_needs():
    """A worker's counter born at 1 (a change counted before Prometheus's first scrape) comes
    through the merge with its _created sample, so the alert's `_created` branch can see it; a
    sample of a `_created` family that is not one of cusp's counters is dropped."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    from service import metrics as M

    reg = CollectorRegistry()
    c = Counter("cusp_stream_changepoints", "c", ("stream",), registry=reg)
    c.labels("late").inc()
    born = c.labels("late")._created
    text = M.merged_exposition([generate_latest(reg).decode() + "# TYPE foo_created gauge\nfoo_created 5.0\n"]).decode()
    assert metric(text, "cusp_stream_changepoints_total", stream="late") == 1
    assert metric(text, "cusp_stream_changepoints_created", stream="late") == born
    assert "foo_created" not in text


def test_a_busy_port_is_refused_before_anything_starts(tmp_path):
    """A port another process listens on: `cusp serve` says so and exits before it starts Redis or
    workers, and never prints "serving on" (a new user saw that message, then Errno 98)."""
    import socket

    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "CUSP_DATA_DIR": str(tmp_path / "data"), "CUSP_PORT": str(port), "CUSP_HOST": "127.0.0.1",
               "CUSP_WORKERS": "1"}
        env.pop("CUSP_REDIS_URL", None)
        out = subprocess.run([CUSP, "serve"], env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in text and "--port" in text, text
    assert "serving on" not in text and redis_in(tmp_path / "data") == [], text



def test_a_signal_during_the_stop_events_own_lock_does_not_deadlock_the_loop():
    """The worker's SIGTERM/SIGINT set its stop event from a thread that reads the signal wake-up
    descriptor (``service.commands._stop_on_signals``). With ``stop.set()`` in the Python handler
    itself, a signal arriving while the main thread held the Event's lock (a first handler inside
    ``Event.set``) ran the handler on that thread, which then waited for the lock for ever: a
    worker of a SIGKILLed ``cusp serve`` hung so in 1 of 3 runs of this file (2026-11-28). Here a
    process holds the lock while it signals itself: it must stop. With the old handler it hangs
    (the test can fail: measured, killed by the 20 s timeout)."""
    code = """
import os, signal, threading, time
from service.commands import _stop_on_signals
stop = threading.Event()
_stop_on_signals(stop)
with stop._cond:  # as a first handler inside Event.set holds it
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)  # the Python-level handler runs here, on this thread
print("stopped" if stop.wait(10) else "not stopped", flush=True)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert out.stdout.strip() == "stopped", (out.stdout, out.stderr)


def test_the_port_option_wins_over_an_invalid_cusp_port_for_the_workers_too(tmp_path):
    """`cusp serve --port P` with CUSP_PORT=70000 in the environment: the API served on P and every
    worker exited at start on the invalid variable, restarted for ever (/readyz 503; a new user's
    trial). The workers get the option's value: ready, and no worker restarted."""
    proc, client = start_serve(tmp_path, workers=1, port_option=True, CUSP_PORT="70000", CUSP_FROBNICATE="1")
    try:
        assert ready(client)
        time.sleep(2)  # (a worker that fails at start exits within about a second)
        log = (tmp_path / "serve.log").read_text()
        assert "less than or equal to 65535" not in log and "restart" not in log.lower(), log
        # a variable that is no setting: warned of once, by serve, not again by each of its workers
        assert log.count("ignored: CUSP_FROBNICATE is no cusp setting") == 1, log
    finally:
        stop_serve(proc, client)


def test_the_workers_expositions_are_read_at_once_so_stopped_workers_cost_one_timeout():
    """Two worker endpoints that accept and never answer (SIGSTOPped processes): the API's /metrics
    read them one after another, 2 s each, and with 2 such workers hit Prometheus's 4 s scrape
    timeout (an operator's trial). Read at once, they cost one timeout between them."""
    import socket

    from service.supervise import scrape

    listeners = []
    try:
        for _ in range(3):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen(8)  # connections complete in the backlog; nothing is ever read or written
            listeners.append(s)
        urls = [f"http://127.0.0.1:{s.getsockname()[1]}/metrics" for s in listeners]
        t0 = time.monotonic()
        assert scrape(urls, 1.0) == []
        assert time.monotonic() - t0 < 2.0  # one after another: 3.0
    finally:
        for s in listeners:
            s.close()

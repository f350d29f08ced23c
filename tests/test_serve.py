"""`cusp serve` as a user runs it: one process tree with the embedded Redis and CUSP_WORKERS
worker processes. The workers are supervised (a killed one comes back), their metrics appear in
the API's one /metrics exposition, and SIGTERM stops the workers and the embedded Redis too."""

import os
import signal
import subprocess
import sys
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
            if b"worker" in Path(f"/proc/{c}/cmdline").read_bytes():
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


@pytest.fixture
def served(tmp_path):
    port = free_port()
    env = {**os.environ, "CUSP_DATA_DIR": str(tmp_path / "data"), "CUSP_PORT": str(port), "CUSP_HOST": "127.0.0.1",
           "CUSP_WORKERS": "2", "CUSP_LEASE_SECONDS": "2"}
    env.pop("CUSP_REDIS_URL", None)
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([CUSP, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20)

    def up():
        try:
            return client.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(up, 60, "cusp serve to answer /readyz")
        yield proc, client, tmp_path
    finally:
        client.close()
        if proc.poll() is None:  # a failed test: SIGTERM, so serve still stops its Redis and workers
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


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
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    wait_for(lambda: not redis_in((tmp / "data").resolve()) and not any(Path(f"/proc/{w}").exists() for w in workers[1:]), 15,
             "the embedded Redis and the workers to stop with cusp serve")
    # the supervisor said why it restarted one, once: the replacement lived on (a child started from
    # a short-lived thread would be killed by PR_SET_PDEATHSIG as soon as that thread ended)
    assert (tmp / "serve.log").read_bytes().count(b"exited with") == 1


def test_merged_exposition_sums_counters_combines_process_gauges_and_skips_garbage():
    """The API's /metrics under `cusp serve`: its own registry plus each worker's text, merged."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    from service import metrics as M

    def worker(chunks: float, leases: float, redis_up: float, log_z: float) -> str:
        reg = CollectorRegistry()
        Counter("cusp_chunks_processed", "c", ("stream", "model"), registry=reg).labels("m1", "g").inc(chunks)
        Gauge("cusp_worker_leases", "l", registry=reg).set(leases)
        Gauge("cusp_redis_up", "r", registry=reg).set(redis_up)
        Gauge("cusp_log_evidence_nats", "z", ("stream", "model"), registry=reg).labels("m1", "g").set(log_z)
        Histogram("cusp_annealing_steps", "h", ("stream", "model"), buckets=(1, 5), registry=reg).labels("m1", "g").observe(3)
        return generate_latest(reg).decode()

    text = M.merged_exposition([worker(3, 1, 1, -10.0), worker(4, 2, 0, -11.0), "cusp_broken{ 1\n"]).decode()
    fams = list(text_string_to_metric_families(text))
    assert len({f.name for f in fams}) == len(fams)
    assert metric(text, "cusp_chunks_processed_total", stream="m1", model="g") == 7  # counters add up
    assert metric(text, "cusp_annealing_steps_count", stream="m1", model="g") == 2  # histograms too
    assert metric(text, "cusp_annealing_steps_bucket", stream="m1", model="g", le="5.0") == 2
    assert metric(text, "cusp_worker_leases") == 3 + M.WORKER_LEASES._value.get()  # per-process gauges: summed
    assert metric(text, "cusp_redis_up") == 0  # the worst of the processes
    assert metric(text, "cusp_log_evidence_nats", stream="m1", model="g") == -10.0  # one series, first seen
    assert "cusp_broken" not in text and "_created" not in text

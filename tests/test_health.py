"""Health that tells the truth, with real processes: a `cusp worker`'s /healthz (on its metrics
port) fails while its loop is stuck or every poll errors; the API's /readyz (with workers
required: CUSP_READY_NEEDS_WORKERS, or under `cusp serve`) fails while no worker makes progress
within a lease. On one Redis server and on a Redis Cluster."""

import os
import signal

import httpx
import pytest

from service.store import EmbeddedRedis, connect, keys
from tests import test_reliability as rel
from tests.service_fixtures import LiveServer, free_port

procs = rel.procs  # the fixture: subprocesses killed by pid at the end


def healthz(port: int) -> tuple[int, dict] | None:
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=3)
        return r.status_code, r.json()
    except httpx.TransportError:
        return None


def status_is(port: int, code: int, reason: str = ""):
    got = healthz(port)
    return got is not None and got[0] == code and reason in got[1].get("reason", "") and got


def ready(live: LiveServer) -> httpx.Response:
    return live.client.get("/readyz")


@pytest.fixture(params=["single", "cluster"])
def backend(request, tmp_path):
    """A Redis URL: an embedded redis-server, or the session's Redis Cluster."""
    if request.param == "cluster":
        yield request.getfixturevalue("redis_cluster").url
        return
    r = EmbeddedRedis(tmp_path / "redis")
    yield r.url
    r.close()


@pytest.mark.parametrize("kind", ["single", "cluster"])
def test_worker_healthz_fails_while_every_poll_errors_and_recovers(procs, tmp_path, kind):
    """A worker whose Redis is not there (nothing listens on the port) starts, keeps retrying, and
    its /healthz answers 503 naming the error; once a redis-server comes up there, 200 again."""
    dead = free_port()
    url = f"redis://127.0.0.1:{dead}/0" if kind == "single" else f"redis+cluster://127.0.0.1:{dead}"
    port = free_port()
    worker = rel.start_worker(procs, url, "worker", port)
    got = rel.wait_for(lambda: status_is(port, 503, "polls failed"), 60, "the worker's /healthz to report failing polls",
                       procs.tail("worker"), interval=0.2)
    assert got[1]["status"] == "unhealthy" and ("Connection" in got[1]["reason"] or "connect" in got[1]["reason"]), got
    assert worker.poll() is None, procs.tail("worker")
    if kind == "single":
        redis = rel.RedisServer(procs, tmp_path / "redis-data")
        redis.port, redis.url = dead, url
        redis.start()
        rel.wait_for(lambda: status_is(port, 200), 30, "the worker's /healthz to recover", procs.tail("worker"), interval=0.2)
        assert healthz(port)[1] == {"status": "ok"}
    rel.stop_worker(worker)


def test_worker_healthz_fails_while_its_loop_is_stuck(procs, tmp_path):
    """The worker's redis-server is SIGSTOPped: the loop blocks in a read (up to the 10 s socket
    timeout) and /healthz, answered by another thread, says the loop has not moved for
    CUSP_WORKER_STALL_SECONDS; after SIGCONT it is healthy again."""
    redis = rel.RedisServer(procs, tmp_path / "redis-data")
    redis.start()
    port = free_port()
    worker = rel.start_worker(procs, redis.url, "worker", port, worker_stall_seconds=2)
    rel.wait_for(lambda: status_is(port, 200), 60, "the worker's /healthz", procs.tail("worker"), interval=0.2)
    redis.proc.send_signal(signal.SIGSTOP)
    try:
        got = rel.wait_for(lambda: status_is(port, 503, "has not completed a step"), 30, "/healthz to report the stuck loop",
                           procs.tail("worker"), interval=0.2)
        assert "CUSP_WORKER_STALL_SECONDS=2" in got[1]["reason"]
    finally:
        redis.proc.send_signal(signal.SIGCONT)
    rel.wait_for(lambda: status_is(port, 200), 60, "the worker's /healthz to recover", procs.tail("worker"), interval=0.2)
    rel.stop_worker(worker)


def test_readyz_needs_a_worker_that_makes_progress(procs, backend):
    """/readyz with CUSP_READY_NEEDS_WORKERS=true: 503 before any worker, 200 while a worker
    process moves, 503 within a lease or so of its SIGSTOP (its heartbeat is older than a
    lease), 200 after SIGCONT; 503 again once it stopped (a clean stop leaves the registry)."""
    live = LiveServer(backend, ready_needs_workers=True, lease_seconds=rel.LEASE)
    try:
        assert ready(live).status_code == 503 and "progress" in ready(live).json()["workers"]
        worker = rel.start_worker(procs, backend, "worker")
        rel.wait_for(lambda: ready(live).status_code == 200, 60, "/readyz once the worker runs", procs.tail("worker"), interval=0.1)
        assert ready(live).json() == {"status": "ready", "redis": "ok"}
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            got = rel.wait_for(lambda: (r := ready(live)).status_code == 503 and r, 20, "/readyz to see the paused worker")
            assert got.json()["redis"] == "ok" and "no worker has made progress" in got.json()["workers"]
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        rel.wait_for(lambda: ready(live).status_code == 200, 30, "/readyz once the worker moves again", procs.tail("worker"), interval=0.1)
        rel.stop_worker(worker)
        rel.wait_for(lambda: ready(live).status_code == 503, 20, "/readyz once the worker stopped")
    finally:
        live.stop()


def test_worker_on_a_cluster_node_as_a_plain_url_is_neither_healthy_nor_counted(procs, redis_cluster):
    """Issue 18's outage: CUSP_REDIS_URL names one node of a cluster as a plain redis:// URL. Every
    poll fails (MOVED); the worker's /healthz says so and the API's /readyz does not count it."""
    r = connect(redis_cluster.url)
    other = next(n for n in r.get_primaries() if n.name != r.get_node_from_key(keys.WORKERS).name)
    live = LiveServer(redis_cluster.url, ready_needs_workers=True, lease_seconds=rel.LEASE)
    port = free_port()
    try:
        worker = rel.start_worker(procs, f"redis://{other.host}:{other.port}/0", "worker", port)
        got = rel.wait_for(lambda: status_is(port, 503, "polls failed"), 60, "the worker's /healthz to report failing polls",
                           procs.tail("worker"), interval=0.2)
        assert "MOVED" in got[1]["reason"] or "Moved" in got[1]["reason"], got
        assert ready(live).status_code == 503
        rel.stop_worker(worker)
    finally:
        live.stop()

"""Redis with a replica watched by Sentinel (issue 18 item 5: "a replica with Sentinel"), for real:
a master, a replica and a sentinel (redis-server processes on loopback). cusp reaches the master
through ``redis+sentinel://host:port/NAME``; when the master is SIGKILLed the sentinel promotes
the replica, and the API and a worker go on against it with nothing lost that the replica had."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import redis

from service.settings import load_settings
from service.store import sentinel_spec
from service.worker import Worker
from tests.service_fixtures import LiveServer, free_port


def server(binary: str, args: list[str], d: Path) -> subprocess.Popen:
    d.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([binary, *args, "--dir", str(d), "--logfile", str(d / "redis.log")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def wait(cond, what: str, timeout: float = 30.0) -> None:
    t0 = time.monotonic()
    while True:
        try:
            if cond():
                return
        except (redis.RedisError, OSError):
            pass
        assert time.monotonic() - t0 < timeout, f"{what} within {timeout:.0f} s"
        time.sleep(0.1)


@pytest.fixture()
def sentinel_setup(tmp_path):
    from tests.redis_cluster import redis_server_binary

    binary = redis_server_binary()
    if binary is None:
        pytest.skip("no redis-server binary")
    master, replica, sent = free_port(), free_port(), free_port()
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"]
    procs = {"master": server(binary, ["--port", str(master), *common], tmp_path / "master"),
             "replica": server(binary, ["--port", str(replica), *common, "--replicaof", "127.0.0.1", str(master)], tmp_path / "replica")}
    conf = tmp_path / "sentinel" / "sentinel.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(f"port {sent}\nbind 127.0.0.1\nsentinel monitor cuspm 127.0.0.1 {master} 1\n"
                    "sentinel down-after-milliseconds cuspm 1000\nsentinel failover-timeout cuspm 5000\n")
    procs["sentinel"] = subprocess.Popen([binary, str(conf), "--sentinel", "--logfile", str(conf.parent / "sentinel.log")],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        r = redis.Redis(port=replica)
        wait(lambda: r.info("replication")["master_link_status"] == "up", "the replica to sync")
        s = redis.Redis(port=sent)
        wait(lambda: len(s.sentinel_slaves("cuspm")) == 1, "the sentinel to see the replica")
        yield {"url": f"redis+sentinel://127.0.0.1:{sent}/cuspm", "master": master, "replica": replica, "procs": procs}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def rows(seed: int) -> list[list[float]]:
    return np.random.default_rng(seed).normal(size=(20, 1)).round(6).tolist()


def test_cusp_follows_a_sentinel_failover(sentinel_setup):
    url = sentinel_setup["url"]
    live = LiveServer(url)
    try:
        assert live.client.post("/v1/streams", json={"name": "ha", "columns": ["v"], "models": ["gaussian"]}).status_code == 201
        for q in range(3):
            assert live.client.post("/v1/streams/ha/chunks", json={"seq": q, "rows": rows(q)}).status_code == 202
        w = Worker(url, worker_id="ha-w")
        assert w.run_until_idle() == 3
        w.release_all()
        # everything written so far is on the replica before the master dies (replication is
        # asynchronous: Redis itself does not promise more)
        assert redis.Redis(port=sentinel_setup["master"]).wait(1, 5000) == 1
        sentinel_setup["procs"]["master"].send_signal(signal.SIGKILL)
        sentinel_setup["procs"]["master"].wait(10)
        codes: set[int] = set()

        def answered() -> bool:
            r = live.client.get("/v1/streams/ha")
            codes.add(r.status_code)
            assert r.status_code in (200, 503), r.text  # an outage while the sentinel fails over, never a 500
            return r.status_code == 200

        wait(answered, "the API to answer from the promoted replica", timeout=60)
        info = live.client.get("/v1/streams/ha").json()
        assert info["next_seq"] == 3 and info["models"][0]["last_seq"] == 2
        assert redis.Redis(port=sentinel_setup["replica"]).info("replication")["role"] == "master"
        r = live.client.post("/v1/streams/ha/chunks", json={"seq": 3, "rows": rows(3)})
        assert r.status_code == 202, r.text
        w = Worker(url, worker_id="ha-w2")
        assert w.run_until_idle() == 1
        w.release_all()
        assert live.client.get("/v1/streams/ha").json()["models"][0]["last_seq"] == 3
    finally:
        live.stop()


@pytest.mark.parametrize("url, message", [
    ("redis+sentinel://127.0.0.1:26379", "name the master"),
    ("redis+sentinel:///cuspm", "bad sentinel"),
    ("redis+sentinel://127.0.0.1:26379/cuspm/x", "must be a number"),
])
def test_bad_sentinel_urls_stop_start_up_naming_the_variable(url, message, monkeypatch):
    monkeypatch.setenv("CUSP_REDIS_URL", url)
    with pytest.raises(SystemExit, match=message):
        load_settings()


def test_sentinel_url_parts():
    sp = sentinel_spec("rediss+sentinel://u:p%40ss@s1:26379,s2:26380/cuspm/2")
    assert (sp.nodes, sp.service, sp.db, sp.username, sp.password, sp.ssl) == \
        ([("s1", 26379), ("s2", 26380)], "cuspm", 2, "u", "p@ss", True)

"""A worker's metrics port lists every stream it holds: with API keys configured its /metrics
needs one, as the API's does (issue 19 item 5), while /healthz stays open for probes; `cusp
serve` scrapes its own workers with a key, so its merged /metrics keeps their series."""

from __future__ import annotations

import time

import httpx

from service.store import EmbeddedRedis
from tests.service_fixtures import free_port
from tests.test_observability import CUSP, cusp_env, start, stop, wait_http

KEYS = "w-secret,r-secret:read"


def test_worker_metrics_need_a_key_when_keys_are_set(tmp_path):
    redis = EmbeddedRedis(tmp_path / "redis")
    port = free_port()
    log = tmp_path / "worker.log"
    proc = start([CUSP, "worker", "--metrics-port", str(port)], cusp_env(redis.url, tmp_path, CUSP_API_KEYS=KEYS), log)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", proc, log)  # open: probes carry no key
        bare = httpx.get(f"{base}/metrics")
        assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer" and "API key" in bare.text
        assert httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
        ok = httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer r-secret"})
        assert ok.status_code == 200 and "cusp_workers" in ok.text
    finally:
        stop(proc)
        redis.close()


def test_serve_scrapes_its_workers_with_a_key(tmp_path):
    redis = EmbeddedRedis(tmp_path / "redis")
    port = free_port()
    log = tmp_path / "serve.log"
    proc = start([CUSP, "serve", "--host", "127.0.0.1", "--port", str(port)],
                 cusp_env(redis.url, tmp_path, CUSP_API_KEYS=KEYS, CUSP_WORKERS="1"), log)
    try:
        api = f"http://127.0.0.1:{port}"
        wait_http(f"{api}/healthz", proc, log)
        headers = {"Authorization": "Bearer r-secret"}
        for _ in range(100):  # the worker process starts after the API
            text = httpx.get(f"{api}/metrics", headers=headers).text
            if "cusp_workers 1.0" in text:
                break
            time.sleep(0.2)
        assert "cusp_workers 1.0" in text, text[-2000:]  # the worker's series came through its keyed port
        assert httpx.get(f"{api}/metrics").status_code == 401
    finally:
        stop(proc)
        redis.close()

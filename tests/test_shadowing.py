"""Issue 17, item 4: cusp's top-level packages are ``service``, ``models`` and ``bench``, names a
user's project directory may well have too. `cusp serve` started from such a directory must
import its own packages, in the API process and in every worker process it starts; and when
its workers cannot run at all (they crash at start, again and again), /readyz must say so."""

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.service_fixtures import free_port
from tests.test_serve import CUSP, metric, wait_for

BROKEN = 'raise ImportError("the current directory\'s own {pkg!r} package was imported by cusp")\n'


def serve(cwd: Path, data: Path, log: Path, **env) -> tuple[subprocess.Popen, httpx.Client]:
    port = free_port()
    full = {**os.environ, "CUSP_DATA_DIR": str(data), "CUSP_PORT": str(port), "CUSP_HOST": "127.0.0.1",
            "CUSP_WORKERS": "1", "CUSP_LEASE_SECONDS": "2", **env}
    for name in ("CUSP_REDIS_URL", "PYTHONSAFEPATH"):
        full.pop(name, None)
    with open(log, "wb") as out:
        proc = subprocess.Popen([CUSP, "serve"], cwd=cwd, env=full, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return proc, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20)


def stop(proc: subprocess.Popen, client: httpx.Client) -> None:
    client.close()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def answers(client: httpx.Client, path: str) -> httpx.Response | None:
    try:
        return client.get(path)
    except httpx.TransportError:
        return None


def test_serve_from_a_directory_with_its_own_models_and_service_packages(tmp_path):
    project = tmp_path / "project"
    for pkg in ("models", "service", "bench"):
        (project / pkg).mkdir(parents=True)
        (project / pkg / "__init__.py").write_text(BROKEN.format(pkg=pkg))
    log = tmp_path / "serve.log"
    proc, client = serve(project, tmp_path / "data", log)
    try:
        wait_for(lambda: (r := answers(client, "/healthz")) is not None and r.status_code == 200 or proc.poll() is not None, 60,
                 "cusp serve to answer /healthz")
        assert proc.poll() is None, log.read_text()[-3000:]
        r = client.post("/v1/streams", json={"name": "s", "columns": ["x"], "models": ["gaussian"]})
        assert r.status_code == 201, r.text
        for q in range(3):
            assert client.post("/v1/streams/s/chunks", json={"seq": q, "rows": [[0.5 * q], [1.0], [-0.5]]}).status_code == 202
        wait_for(lambda: client.get("/v1/streams/s").json()["models"][0]["last_seq"] == 2, 90,
                 "the worker process to apply 3 chunks (it crash-loops if it imports the directory's packages)")
        results = client.get("/v1/streams/s/evidence").json()["results"]
        assert [(e["kind"], e["seq"], e["n"]) for e in results] == [("result", 0, 3), ("result", 1, 6), ("result", 2, 9)]
        assert client.get("/readyz").json() == {"status": "ready", "redis": "ok"}
        assert metric(client.get("/metrics").text, "cusp_workers") == 1
    finally:
        stop(proc, client)
    text = log.read_text()
    assert "imported by cusp" not in text and "exited with" not in text, text[-3000:]


def test_readyz_is_not_ready_while_the_worker_processes_crash_loop(tmp_path):
    """The workers die at start (a sitecustomize on PYTHONPATH exits any `... worker` process; the
    API process runs `cusp serve`), as they did when they imported a user's `models`: the API
    still answers, but /readyz is 503 and names the workers."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text('import sys\nif "worker" in sys.argv:\n    sys.exit(3)\n')
    log = tmp_path / "serve.log"
    proc, client = serve(tmp_path, tmp_path / "data", log, PYTHONPATH=str(hooks))
    try:
        wait_for(lambda: log.read_bytes().count(b"exited with") >= 2 or proc.poll() is not None, 90,
                 "the worker process to be restarted twice")
        assert proc.poll() is None, log.read_text()[-3000:]
        r = client.get("/readyz")
        assert r.status_code == 503, r.text
        assert r.json()["status"] == "unavailable" and r.json()["redis"] == "ok" and "worker" in r.json()["workers"]
        assert client.get("/healthz").status_code == 200
        assert metric(client.get("/metrics").text, "cusp_workers") == 0
    finally:
        stop(proc, client)

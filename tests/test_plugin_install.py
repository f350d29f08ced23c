"""The example plug-in package (examples/cusp-plugin-example) installed with pip into this
environment, then used by name (``laplace``) where models are looked up: ``cusp replay`` (a
process), the API at stream creation with a ``cusp worker --burst`` process computing, and
``cusp.Detector``; uninstalled afterwards (issue 17, item 5)."""

import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import cusp
from models.registry import load_plugins
from tests.service_fixtures import LiveServer

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cusp-plugin-example"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


@pytest.fixture(scope="module")
def plugin():
    subprocess.run([*PIP, "install", "--no-deps", "--no-build-isolation", "--no-index", str(EXAMPLE)], check=True,
                   capture_output=True, timeout=300)
    try:
        assert "laplace" in load_plugins(refresh=True)
        yield "laplace"
    finally:
        subprocess.run([*PIP, "uninstall", "-y", "cusp-plugin-example"], check=True, capture_output=True, timeout=300)
        sys.modules.pop("cusp_plugin_example", None)
        assert "laplace" not in load_plugins(refresh=True)


def data(n=200, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.laplace(0, 1, n), rng.laplace(4, 1, n)]).round(4)


def test_replay(plugin, tmp_path):
    csv = tmp_path / "x.csv"
    csv.write_text("x\n" + "\n".join(map(str, data())) + "\n")
    r = subprocess.run([sys.executable, "-m", "service.cli", "replay", str(csv), "--model", "laplace:scale=5",
                        "--chunk-size", "25", "--detect", "--out", str(tmp_path / "t.jsonl")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "laplace_scale5: change point at observation 200" in r.stderr
    assert "laplace_scale5: log-evidence" in r.stderr and "(sgais)" in r.stderr


def test_api_and_worker_process(plugin, redis_url, tmp_path):
    server = LiveServer(redis_url)
    try:
        s = "p" + uuid.uuid4().hex[:8]
        with cusp.Client(server.url) as c:
            info = c.create_stream(s, ["x"], models=["laplace", "gaussian:sampler=sgais"])
            assert [m["name"] for m in info["models"]] == ["laplace", "gaussian_samplersgais"]
            with pytest.raises(cusp.InvalidRequestError, match="422: model 'laplace:scale=-1': model 'laplace': scale must be > 0"):
                c.create_stream(s + "b", ["x"], models=["laplace:scale=-1"])
            x = data()
            for lo in range(0, 400, 25):
                c.post(s, x[lo : lo + 25])
            w = subprocess.run([sys.executable, "-m", "service.cli", "worker", "--burst", "--metrics-port", "0"],
                               env={**__import__("os").environ, "CUSP_REDIS_URL": redis_url},
                               capture_output=True, text=True, timeout=300)
            assert w.returncode == 0, w.stderr[-3000:]
            results = [e for e in c.results(s, model="laplace")]
            assert [e["seq"] for e in results if e["kind"] == "result"] == list(range(16))
            assert [e["location"] for e in results if e["kind"] == "changepoint"] == [200]
            assert all(e.get("method") == "sgais" for e in results if e["kind"] == "result")
            c.delete_stream(s)
    finally:
        server.stop()


def test_detector(plugin):
    det = cusp.Detector(models=["laplace"], chunk_size=25).update(data())
    assert [c.location for c in det.changepoints] == [200]
    assert det.results["laplace"][-1].method == "sgais"

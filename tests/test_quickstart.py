"""examples/quickstart.py, the README's notebook-sized example, run as a process against a live
API with a worker running (issue 17, item 3)."""

import subprocess
import sys
import threading
from pathlib import Path

from service.worker import Worker
from tests.service_fixtures import LiveServer

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"


def test_quickstart_runs(redis_url):
    server = LiveServer(redis_url)
    stop = threading.Event()
    worker = Worker(redis_url)
    thread = threading.Thread(target=worker.run_forever, args=(stop, 0.05), daemon=True)
    thread.start()
    try:
        r = subprocess.run([sys.executable, str(EXAMPLE), server.url], capture_output=True, text=True, timeout=300)
    finally:
        stop.set()
        thread.join(30)
        worker.release_all()
        server.stop()
    assert r.returncode == 0, r.stderr[-3000:]
    assert "in-process change points: [300]" in r.stdout
    assert "service change points: [300]" in r.stdout
    assert "one-shot change points: [300]" in r.stdout
    assert "live change point: 300 at 2026-11-26 05:00:00+00:00 found" in r.stdout

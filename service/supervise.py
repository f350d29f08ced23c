"""Worker processes for ``cusp serve``: the API and the SGAIS workers must not share one Python
interpreter, because a CPU-bound worker thread holds the GIL the API needs to answer (measured in
docs/benchmarks.md, Service). ``cusp serve`` therefore starts ``CUSP_WORKERS`` ``cusp worker``
processes, restarts any that dies, and stops them (SIGTERM: they release their leases) when it
stops. Each child serves its metrics on a loopback port; the API's ``/metrics`` merges them into
one exposition (``service.metrics.merged_exposition``), so a single scrape sees everything.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

log = logging.getLogger("cusp.supervise")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when ``cusp serve`` dies, even by SIGKILL, so no worker
    outlives the process (and the embedded Redis) it belongs to."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class WorkerProcesses:
    def __init__(self, redis_url: str, count: int, restart_delay: float = 1.0):
        self.redis_url = redis_url
        self.restart_delay = restart_delay
        self.ports = [_free_port() for _ in range(count)]
        self.procs: list[subprocess.Popen | None] = [None] * count
        self._stop = threading.Event()
        self._lock = threading.Lock()
        for i in range(count):
            self._start(i)
        self._watch = threading.Thread(target=self._supervise, name="cusp-supervise", daemon=True)
        self._watch.start()

    @property
    def metrics_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}/metrics" for p in self.ports]

    def _start(self, i: int) -> None:
        env = {**os.environ, "CUSP_REDIS_URL": self.redis_url, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "service.cli", "worker", "--metrics-port", str(self.ports[i]), "--metrics-host", "127.0.0.1"]
        self.procs[i] = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        log.info("worker process %d started (pid %d)", i, self.procs[i].pid)

    def _supervise(self) -> None:
        """Restarts happen on this thread, which lives as long as ``cusp serve``: PR_SET_PDEATHSIG
        fires when the *thread* that started a child exits, so a child started from a short-lived
        thread (a Timer) would be killed at once."""
        due: dict[int, float] = {}
        while not self._stop.wait(0.2):
            with self._lock:
                for i, p in enumerate(self.procs):
                    if p is not None and p.poll() is not None and not self._stop.is_set():
                        log.error("worker process %d (pid %d) exited with %s; restarting in %.1f s", i, p.pid, p.returncode,
                                  self.restart_delay)
                        self.procs[i] = None
                        due[i] = time.monotonic() + self.restart_delay
                for i, at in list(due.items()):
                    if time.monotonic() >= at and not self._stop.is_set():
                        del due[i]
                        self._start(i)

    def stop(self, timeout: float = 15.0) -> None:
        self._stop.set()
        with self._lock:
            live = [p for p in self.procs if p is not None and p.poll() is None]
            for p in live:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in live:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker process pid %d did not stop in time; killing it", p.pid)
                p.kill()
                p.wait()


def scrape(urls: list[str], timeout: float = 2.0) -> list[str]:
    """The expositions of the worker processes that answer (a restarting one is skipped)."""
    out = []
    for u in urls:
        try:
            with urllib.request.urlopen(u, timeout=timeout) as resp:
                out.append(resp.read().decode())
        except OSError:
            continue
    return out

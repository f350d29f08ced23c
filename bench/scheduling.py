"""``cusp bench scheduling``: what scheduling costs and how fast leases move (issue 18 item 2),
measured with real processes on loopback: an embedded redis-server, the API (``cusp serve``,
no in-process workers) and ``cusp worker`` processes.

- **idle**: ``--pairs`` stream x model pairs (one ``gaussian`` model per stream), each fed one
  chunk so that one worker holds them all, then left idle for ``--idle-seconds``: the worker's
  CPU (utime + stime from /proc) and the Redis commands the server executed per second (its
  ``total_commands_processed``, which counts a script call once, and ``commandstats``, which
  also counts the calls inside scripts), less this benchmark's own INFO calls.
- **failover**: two workers share ``--streams`` streams; one is SIGKILLed; the time until the
  survivor holds every lease (target: one lease, ``CUSP_LEASE_SECONDS``).
- **join**: one worker holds every pair under light load (a chunk per stream every 2 s); a second
  starts; the time until it holds its share less one (target: two leases).
- **sigterm**: a worker with a backlog on every stream gets SIGTERM; the time until it exited
  (target: 5 s) and whether its leases were given back.
- **latency**: one worker holding every pair (a first chunk each, applied before the clock starts);
  chunks (10 rows) POSTed at a steady total rate (``--rate``) for
  ``--latency-seconds``, once to a single stream and once spread round-robin over ``--pairs``
  streams; the time from a POST's 202 to its result's apply (the result entry's id is Redis's
  clock at the apply, in ms; same host). Target: the p99 with many pairs at most 2x the p99 of one.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.load import _machine as machine
from bench.report import markdown_table, write_section

LEASE = 10.0  # CUSP_LEASE_SECONDS of every process here (the default)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pairs", type=int, default=1000, help="idle pairs on one worker (default %(default)s)")
    p.add_argument("--idle-seconds", type=float, default=20.0, help="idle measurement window (default %(default)s)")
    p.add_argument("--streams", type=int, default=40, help="streams for failover, join and SIGTERM (default %(default)s)")
    p.add_argument("--rate", type=float, default=20.0, help="total chunks/s of the latency runs (default %(default)s)")
    p.add_argument("--latency-seconds", type=float, default=30.0, help="length of each latency run (default %(default)s)")
    p.add_argument("--quick", action="store_true", help="100 idle pairs, 8 s idle, 10 streams, 10 s latency runs (about two minutes)")
    p.add_argument("--report", default=None, metavar="MD", help="write the figures as the 'scheduling' section of this markdown file")


def _log(msg: str) -> None:
    print(f"[bench scheduling {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Service:
    """Embedded Redis, the API and any number of worker processes, torn down on exit."""

    def __init__(self, tmp: Path):
        import httpx

        from service.store import EmbeddedRedis, connect

        self.redis = EmbeddedRedis(tmp / "redis")
        self.r = connect(self.redis.url)
        port = _free_port()
        self.env = {**os.environ, "CUSP_REDIS_URL": self.redis.url, "CUSP_WORKERS": "0", "CUSP_HOST": "127.0.0.1",
                    "CUSP_PORT": str(port), "CUSP_LOG_LEVEL": "WARNING", "CUSP_API_KEYS": "", "CUSP_MAX_STREAMS": "100000",
                    "CUSP_LEASE_SECONDS": str(LEASE), "OMP_NUM_THREADS": "1"}
        self.api = subprocess.Popen([sys.executable, "-m", "service.cli", "serve"], env=self.env, stdout=subprocess.DEVNULL)
        self.workers: dict[str, subprocess.Popen] = {}
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.http.get("/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.api.poll() is not None:
                raise RuntimeError("the API did not start")
            time.sleep(0.1)
        self.seqs: dict[str, int] = {}

    def worker(self, name: str) -> subprocess.Popen:
        env = {**self.env, "CUSP_WORKER_ID": name}
        p = subprocess.Popen([sys.executable, "-m", "service.cli", "worker", "--metrics-port", "0"], env=env,
                             stdout=subprocess.DEVNULL)
        self.workers[name] = p
        return p

    def streams(self, prefix: str, n: int) -> list[str]:
        names = [f"{prefix}{i:05d}" for i in range(n)]
        for s in names:
            r = self.http.post("/v1/streams", json={"name": s, "columns": ["v"], "models": ["gaussian"], "seed": 0})
            if r.status_code != 201:
                raise RuntimeError(r.text)
            self.seqs[s] = 0
        return names

    def post(self, s: str, rows: int = 10) -> None:
        x = np.random.default_rng(self.seqs[s]).normal(size=(rows, 1)).round(6).tolist()
        r = self.http.post(f"/v1/streams/{s}/chunks", json={"seq": self.seqs[s], "rows": x})
        if r.status_code != 202:
            raise RuntimeError(r.text)
        self.seqs[s] += 1

    def holders(self, streams: list[str]) -> list[str | None]:
        from service.store import keys

        pipe = self.r.pipeline(transaction=False)
        for s in streams:
            pipe.get(keys.lease(s, "gaussian"))
        return [v.decode() if v else None for v in pipe.execute()]

    def applied(self, streams: list[str]) -> bool:
        from service.store import keys

        pipe = self.r.pipeline(transaction=False)
        for s in streams:
            pipe.hget(keys.state(s, "gaussian"), "last_seq")
        return all(int(v) == self.seqs[s] - 1 for s, v in zip(streams, pipe.execute()))

    def wait(self, cond, timeout: float, what: str) -> float:
        t0 = time.monotonic()
        while not cond():
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"{what}: not within {timeout:.0f} s")
            time.sleep(0.05)
        return time.monotonic() - t0

    def close(self) -> None:
        for p in [*self.workers.values(), self.api]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [*self.workers.values(), self.api]:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        self.http.close()
        self.redis.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def idle(tmp: Path, pairs: int, seconds: float) -> dict:
    svc = Service(tmp / "idle")
    try:
        streams = svc.streams("idle", pairs)
        w = svc.worker("idle-w")
        for s in streams:
            svc.post(s)
        svc.wait(lambda: svc.applied(streams) and svc.holders(streams).count("idle-w") == pairs, 600, "all pairs held and applied")
        time.sleep(2.0)  # let the last answers and trims settle
        info0, stats0, cpu0, t0 = svc.r.info("stats"), svc.r.info("commandstats"), _cpu_seconds(w.pid), time.monotonic()
        time.sleep(seconds)
        info1, stats1, cpu1, t1 = svc.r.info("stats"), svc.r.info("commandstats"), _cpu_seconds(w.pid), time.monotonic()
        dt = t1 - t0
        calls = {k: stats1[k]["calls"] - stats0.get(k, {"calls": 0})["calls"] for k in stats1}
        calls["cmdstat_info"] = calls.get("cmdstat_info", 0) - 2
        top = sorted(((v, k.removeprefix("cmdstat_")) for k, v in calls.items() if v > 0), reverse=True)[:6]
        return {"pairs": pairs, "seconds": dt, "cpu_percent": 100 * (cpu1 - cpu0) / dt, "rss_mib": _rss_mib(w.pid),
                "commands_per_s": (info1["total_commands_processed"] - info0["total_commands_processed"] - 2) / dt,
                "inner_calls_per_s": sum(v for v in calls.values() if v > 0) / dt,
                "top": ", ".join(f"{k} {v / dt:.0f}/s" for v, k in top)}
    finally:
        svc.close()


def failover(tmp: Path, n: int) -> dict:
    svc = Service(tmp / "failover")
    try:
        streams = svc.streams("fo", n)
        a, _ = svc.worker("fo-a"), svc.worker("fo-b")

        def feed_unheld() -> bool:  # a pair is taken when it has chunks: feed the ones nobody holds
            held = svc.holders(streams)
            for s, h in zip(streams, held):
                if h is None:
                    svc.post(s)
            return None not in held and set(held) == {"fo-a", "fo-b"}

        svc.wait(lambda: feed_unheld() or time.sleep(0.5), 120, "both workers holding pairs")
        held_a = svc.holders(streams).count("fo-a")
        a.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        a.wait()
        last = 0.0
        while set(svc.holders(streams)) != {"fo-b"}:
            if time.monotonic() - t0 > 10 * LEASE:
                raise RuntimeError("no takeover within 10 leases")
            if time.monotonic() - last > 1.0:  # the streams keep getting chunks: the survivor must take them over
                for s, h in zip(streams, svc.holders(streams)):
                    if h != "fo-b":
                        svc.post(s)
                last = time.monotonic()
            time.sleep(0.1)
        took = time.monotonic() - t0
        return {"streams": n, "killed_held": held_a, "takeover_s": took}
    finally:
        svc.close()


def join(tmp: Path, n: int) -> dict:
    svc = Service(tmp / "join")
    try:
        streams = svc.streams("jn", n)
        svc.worker("jn-a")
        for s in streams:
            svc.post(s)
        svc.wait(lambda: svc.holders(streams).count("jn-a") == n, 120, "the first worker holding every pair")
        svc.worker("jn-b")
        t0, last = time.monotonic(), 0.0
        share = -(-n // 2)
        while svc.holders(streams).count("jn-b") < share - 1:
            if time.monotonic() - t0 > 10 * LEASE:
                raise RuntimeError(f"the joining worker holds {svc.holders(streams).count('jn-b')} after 10 leases")
            if time.monotonic() - last > 2.0:  # light load: a chunk per stream every 2 s
                for s in streams:
                    svc.post(s)
                last = time.monotonic()
            time.sleep(0.1)
        return {"streams": n, "share": share, "join_s": time.monotonic() - t0, "held": svc.holders(streams).count("jn-b")}
    finally:
        svc.close()


def sigterm(tmp: Path, n: int) -> dict:
    svc = Service(tmp / "sigterm")
    try:
        streams = svc.streams("st", n)
        w = svc.worker("st-w")
        for _ in range(20):
            for s in streams:
                svc.post(s, rows=200)
        svc.wait(lambda: svc.holders(streams).count("st-w") >= min(n, 5), 60, "the worker holding pairs")
        t0 = time.monotonic()
        w.send_signal(signal.SIGTERM)
        w.wait(60)
        took = time.monotonic() - t0
        return {"streams": n, "exit_s": took, "code": w.returncode, "leases_left": sum(h is not None for h in svc.holders(streams)),
                "backlog_left": not svc.applied(streams)}
    finally:
        svc.close()


def latency(tmp: Path, n: int, rate: float, seconds: float) -> dict:
    """POST-to-apply latency of chunks at a steady total ``rate`` spread over ``n`` streams."""
    from service.store import keys

    svc = Service(tmp / f"latency{n}")
    try:
        streams = svc.streams("lt", n)
        svc.worker("lt-w")
        svc.wait(lambda: svc.r.zscore(keys.WORKERS, "lt-w") is not None, 120, "the worker up")  # not its start-up
        for s in streams:  # steady state: the worker holds every pair before the timed run
            svc.post(s)
        svc.wait(lambda: svc.applied(streams), 600, "the warm-up chunks applied")
        time.sleep(1.0)
        posted: dict[tuple[str, int], float] = {}
        t0, k = time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            s = streams[k % n]
            seq = svc.seqs[s]
            svc.post(s)
            posted[(s, seq)] = time.time()
            k += 1
            time.sleep(max(0.0, t0 + k / rate - time.monotonic()))
        svc.wait(lambda: svc.applied([s for s in streams if svc.seqs[s]]), 300, "every chunk applied")
        import json as _json

        lat = []
        for s in {s for s, _ in posted}:
            for eid, fields in svc.r.xrange(keys.out(s)):
                if fields[b"kind"] == b"result":
                    seq = _json.loads(fields[b"data"])["seq"]
                    if (s, seq) not in posted:
                        continue  # a warm-up chunk
                    applied_ms = int(eid.decode().split("-")[0])
                    lat.append(applied_ms / 1000 - posted[(s, seq)])
        lat.sort()
        q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]  # noqa: E731
        return {"streams": n, "chunks": len(lat), "rate": k / seconds, "p50": q(0.5), "p99": q(0.99), "max": lat[-1]}
    finally:
        svc.close()


def report(figs: dict, command: str, seconds: float) -> str:
    i, f, j, t = figs["idle"], figs["failover"], figs["join"], figs["sigterm"]

    def met(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    rows = [
        [f"{i['pairs']:,} idle pairs on one worker: worker CPU <= 2 %", f"{i['cpu_percent']:.2f} %", met(i["cpu_percent"] <= 2)],
        [f"{i['pairs']:,} idle pairs: the worker's memory (RSS; each pair holds its state and its reservoir, "
         "which grows with the rows seen up to reservoir_capacity)", f"{i['rss_mib']:.0f} MiB", "(stated)"],
        [f"{i['pairs']:,} idle pairs: <= 50 Redis commands/s", f"{i['commands_per_s']:.0f}/s (calls inside scripts included: "
         f"{i['inner_calls_per_s']:.0f}/s; most: {i['top']})", met(i["commands_per_s"] <= 50)],
        [f"killed worker's pairs taken over within 1 lease ({LEASE:.0f} s)", f"{f['takeover_s']:.1f} s ({f['killed_held']} pairs)",
         met(f["takeover_s"] <= LEASE)],
        [f"joining worker gets its share within 2 leases, light load ({j['streams']} streams)",
         f"{j['join_s']:.1f} s to {j['held']} of share {j['share']}", met(j["join_s"] <= 2 * LEASE)],
        [f"{figs['latency_many']['streams']:,} pairs at a steady {figs['latency_one']['rate']:.0f} chunks/s: "
         "p99 POST-to-apply <= 2x one pair's at the same rate (pairs held)",
         f"{figs['latency_many']['p99'] * 1000:.0f} ms against {figs['latency_one']['p99'] * 1000:.0f} ms "
         f"({figs['latency_many']['p99'] / figs['latency_one']['p99']:.2f}x; p50 {figs['latency_many']['p50'] * 1000:.0f} / "
         f"{figs['latency_one']['p50'] * 1000:.0f} ms; {figs['latency_many']['chunks']:,} and {figs['latency_one']['chunks']:,} chunks)",
         met(figs['latency_many']['p99'] <= 2 * figs['latency_one']['p99'])],
        ["SIGTERM: exit within 5 s, leases released", f"{t['exit_s']:.1f} s, exit code {t['code']}, leases left {t['leases_left']} "
         f"(backlog left: {t['backlog_left']})", met(t["exit_s"] <= 5 and t["leases_left"] == 0)],
    ]
    return "\n".join([
        "## Scheduling",
        "",
        f"Generated by `{command}` (`bench/scheduling.py`) on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{seconds / 60:.1f} minutes on {machine()}. Real processes on loopback: embedded redis-server, `cusp serve` "
        f"(`CUSP_WORKERS=0`), `cusp worker`; `CUSP_LEASE_SECONDS={LEASE:.0f}`; one `gaussian` model per stream.",
        "",
        markdown_table(["target (issue 18)", "measured", "result"], rows, align="llc"),
        "",
        "Idle, a worker renews one life key per quarter lease (the pairs it holds are its own while that key "
        "lives), writes its heartbeat, and scans every stream every 30 s (three pipelined reads per stream); "
        "between scans it reads only the streams the wake channel names.",
    ])


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.pairs, args.idle_seconds, args.streams, args.latency_seconds = 100, 8.0, 10, 10.0
    t0 = time.monotonic()
    figs = {}
    with tempfile.TemporaryDirectory(prefix="cusp-sched-") as d:
        tmp = Path(d)
        _log(f"idle: {args.pairs} pairs, {args.idle_seconds:.0f} s")
        figs["idle"] = idle(tmp, args.pairs, args.idle_seconds)
        _log(f"idle: {figs['idle']}")
        figs["failover"] = failover(tmp, args.streams)
        _log(f"failover: {figs['failover']}")
        figs["join"] = join(tmp, args.streams)
        _log(f"join: {figs['join']}")
        figs["sigterm"] = sigterm(tmp, args.streams)
        _log(f"sigterm: {figs['sigterm']}")
        figs["latency_one"] = latency(tmp, 1, args.rate, args.latency_seconds)
        _log(f"latency, one stream: {figs['latency_one']}")
        figs["latency_many"] = latency(tmp, args.pairs, args.rate, args.latency_seconds)
        _log(f"latency, {args.pairs} streams: {figs['latency_many']}")
    command = "cusp bench scheduling" + (" --quick" if args.quick else "")
    text = report(figs, command, time.monotonic() - t0)
    print(text)
    if args.report:
        write_section(Path(args.report), "scheduling", text)
    return 0

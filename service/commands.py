"""``cusp serve``, ``cusp worker`` and ``cusp feed-demo``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

log = logging.getLogger("cusp")

# The demo's 3 GMMs on one worker process far fewer than --rate's 5,000 observations per second
# (a few hundred to ~1,500 on a 2-core machine; the paper preset's early chunks take several
# annealing steps each), so a fixed rate lets the lag grow to the whole data set. The feeder
# keeps at most this many chunks ahead of the slowest model instead: the live page stays
# within a few chunks of the data sent, on any machine.
DEMO_MAX_LAG = 4


def add_parsers(sub) -> None:
    p = sub.add_parser("serve", help="run the API and CUSP_WORKERS worker processes (embedded Redis unless CUSP_REDIS_URL)")
    p.add_argument("--host", help="listen address (default CUSP_HOST)")
    p.add_argument("--port", type=int, help="listen port (default CUSP_PORT)")
    p.add_argument("--demo", action="store_true", help="also feed the paper's 3 -> 5 -> 7 cluster demo stream")
    p.set_defaults(func=serve)

    p = sub.add_parser("worker", help="run a worker process against CUSP_REDIS_URL")
    p.add_argument("--metrics-port", type=int, default=9100, help="serve /metrics and /healthz here (0: off)")
    p.add_argument("--metrics-host", default="0.0.0.0", help="address the metrics server listens on")
    p.add_argument("--burst", action="store_true", help="stop when there is nothing left to do")
    # (cusp serve's own workers: serve has warned of unknown CUSP_ variables once, not once per worker)
    p.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=worker)

    p = sub.add_parser("feed-demo", help="create the demo stream and post the 3 -> 5 -> 7 cluster data to a running cusp")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--stream", default="demo")
    p.add_argument("--observations", type=int, default=100_000)
    p.add_argument("--chunk-size", type=int, default=500)
    p.add_argument("--rate", type=float, default=5000.0, help="at most this many observations per second (0: no cap)")
    p.add_argument("--max-lag", type=int, default=DEMO_MAX_LAG,
                   help="wait while the slowest model is more than this many chunks behind (0: never wait)")
    p.add_argument("--api-key", help="API key, if the server requires one")
    p.add_argument("--loop", action="store_true",
                   help="keep posting: after each round of data, a new round drawn with the next seed (its 3 clusters "
                        "after the last round's 7 are a change too); cusp serve --demo loops")
    p.add_argument("--rounds", type=int, default=0, help="with --loop: stop after this many rounds in all (0: never)")
    p.set_defaults(func=feed_demo)


def _logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _unknown_settings() -> None:
    """Warn of CUSP_ variables that are no setting (``settings.unknown_variables``): ignored, so a
    typo's setting keeps its default."""
    from service.settings import unknown_variables

    odd = unknown_variables(os.environ)
    if odd:
        log.warning("ignored: %s %s no cusp setting (README, Settings)", ", ".join(odd), "is" if len(odd) == 1 else "are")


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.api.app import create_app, server_options
    from service.settings import load_settings
    from service.supervise import DataDirInUse, SupervisedRedis, WorkerProcesses

    settings = load_settings(**{k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None})
    # the worker processes read their settings from the environment: they get the options' values
    # (an invalid CUSP_PORT beside --port made every worker exit at start, restarted for ever, while
    # the API served: a new user's trial)
    os.environ.update({"CUSP_HOST": settings.host, "CUSP_PORT": str(settings.port)})
    _logging(settings.log_level)
    _unknown_settings()
    busy = _port_problem(settings.host, settings.port)
    if busy:  # before Redis and the workers start, and before "serving on" is printed
        raise SystemExit(f"cusp serve: cannot listen on {settings.host}:{settings.port}: {busy} (another cusp serve? "
                         "choose another with --port or CUSP_PORT)")
    embedded = None
    url = settings.redis_url
    if url is None:  # a redis-server child, restarted on the same data if it dies, stopped when serve dies
        try:
            embedded = SupervisedRedis(settings.data_dir)
        except DataDirInUse as exc:
            raise SystemExit(f"cusp serve: {exc}") from None
        url = embedded.url
        log.info("embedded Redis under %s", settings.data_dir.resolve())
    try:
        workers = WorkerProcesses(url, settings.workers) if settings.workers else None
    except BaseException:
        if embedded:
            embedded.close()
        raise
    base = f"http://{settings.host}:{settings.port}"
    if args.demo:
        demo = argparse.Namespace(url=base, stream="demo", observations=100_000, chunk_size=500, rate=5000.0, max_lag=DEMO_MAX_LAG,
                                  api_key=next(iter(settings.keys), None), loop=True)
        threading.Thread(target=_demo_when_up, args=(demo,), daemon=True).start()
    print(f"cusp serving on {base}  (live page {base}/ , API docs {base}/docs)", flush=True)
    # uvicorn shuts down gracefully on SIGTERM and then raises the signal again once it restored the
    # previous handler: with the default one the process would die before the `finally` below has
    # stopped the workers and the embedded Redis. Exit through SystemExit instead.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        app = create_app(settings, url, worker_metrics=workers.metrics_urls if workers else ())
        uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                    **server_options(settings))
    finally:
        if workers:
            workers.stop()
        if embedded:
            embedded.close()
    return 0


def _port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (None: it can), checked as uvicorn binds (SO_REUSEADDR).
    A new user's busy port printed "cusp serving on ..." and only then failed."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return str(exc)
    for family, kind, proto, _, addr in infos:  # every address, as asyncio's create_server binds them
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:
            continue  # a family this machine lacks (IPv6 in some containers): uvicorn skips it too
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(addr)
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):  # others (EADDRNOTAVAIL): left to the server
                    return exc.strerror or str(exc)
    return None


def worker(args: argparse.Namespace) -> int:
    from service.settings import load_settings
    from service.worker import Worker

    settings = load_settings()
    _logging(settings.log_level)
    if not args.supervised:
        _unknown_settings()
    if settings.redis_url is None:
        raise SystemExit("cusp worker: set CUSP_REDIS_URL (a worker process shares the Redis of a running cusp)")
    w = Worker(settings.redis_url, lease_seconds=settings.lease_seconds, max_attempts=settings.max_attempts,
               result_maxlen=settings.result_maxlen, stall_seconds=settings.worker_stall_seconds,
               changepoint_maxlen=settings.changepoint_maxlen, worker_id=settings.worker_id,
               warm_bytes=settings.worker_warm_bytes)
    if args.metrics_port:
        _serve_metrics(args.metrics_port, args.metrics_host, w.health.problem, settings.scope_of if settings.keys else None)
    if args.burst:
        print(f"applied {w.run_until_idle()} chunks", flush=True)
        w.release_all()
        return 0
    stop = threading.Event()
    _stop_on_signals(stop)
    from models import native

    log.info("worker %s started; mixture kernel: %s", w.id, native.status())
    w.run_forever(stop)
    return 0


def _stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop``, from a thread of its own that reads the signal wake-up
    file descriptor (written by the interpreter's C-level handler). A Python handler that called
    ``stop.set()`` itself could deadlock: a second signal while the first handler held the Event's
    lock ran the handler again on the same thread, which then waited for that lock for ever (seen
    2026-11-28: a worker of a SIGKILLed ``cusp serve``, SIGTERMed by PR_SET_PDEATHSIG, hung in
    ``Event.set`` in 1 of 3 runs of tests/test_serve.py)."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # a Python handler must exist (not the default) for the fd to be written

    def watch() -> None:
        os.read(r, 1)
        stop.set()

    threading.Thread(target=watch, name="cusp-signals", daemon=True).start()


def _serve_metrics(port: int, host: str = "0.0.0.0", problem=lambda: None, scope_of=None) -> None:
    """/metrics and /healthz (503 with the reason while ``problem()`` names one) on a thread.
    ``scope_of``: with API keys configured, /metrics (it names every stream the worker holds)
    needs one, as the API's /metrics does (``Authorization: Bearer KEY``; a read key will do);
    /healthz stays open for probes (it says only whether the loop moves)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from service.metrics import REGISTRY

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server API
            auth = self.headers.get("Authorization", "")
            key = auth[7:].strip() if auth[:7].lower() == "bearer " else None
            if self.path.startswith("/metrics") and scope_of is not None and scope_of(key) is None:
                body, ctype, code = b'{"detail": "missing or unknown API key: send Authorization: Bearer <key>"}', "application/json", 401
            elif self.path.startswith("/metrics"):
                body, ctype, code = generate_latest(REGISTRY), CONTENT_TYPE_LATEST, 200
            elif self.path.startswith("/healthz"):
                why = problem()
                body = json.dumps({"status": "ok"} if why is None else {"status": "unhealthy", "reason": why}).encode()
                ctype, code = "application/json", 200 if why is None else 503
            else:
                body, ctype, code = b"not found", "text/plain", 404
            self.send_response(code)
            if code == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def _request(method: str, url: str, body: dict | None, key: str | None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _demo_when_up(args: argparse.Namespace) -> None:
    for _ in range(100):
        try:
            urllib.request.urlopen(args.url + "/healthz", timeout=2)
            break
        except OSError:
            time.sleep(0.2)
    feed_demo(args)


def feed_demo(args: argparse.Namespace) -> int:
    """Create the demo stream (GMMs with 3, 5, 7 components) and post the paper's data."""
    from service import times as T
    from service.demo import distribution_shift_data

    spec = {"name": args.stream, "columns": ["x", "y"],
            "models": [{"name": f"gmm{k}", "spec": f"gmm:components={k}"} for k in (3, 5, 7)], "seed": 0}
    code, body = _request("POST", f"{args.url}/v1/streams", spec, args.api_key)
    if code not in (201, 409):
        print(f"feed-demo: could not create stream: {code} {body}", file=sys.stderr)
        return 1
    code, info = _request("GET", f"{args.url}/v1/streams/{args.stream}", None, args.api_key)
    start_seq = info.get("next_seq", 0)
    pace = args.chunk_size / args.rate if args.rate > 0 else 0.0
    max_lag = getattr(args, "max_lag", DEMO_MAX_LAG)
    per_round = (args.observations + args.chunk_size - 1) // args.chunk_size
    rnd = start_seq // per_round
    # the rows' times: a chunk's rows spread evenly since the previous chunk was sent, as a sensor's
    # readings that arrive in batches (never ahead of the clock; resumed after the stream's last)
    clock = T.parse(info["last_time"], "the stream's last_time") if info.get("last_time") else time.time() - 1.0
    while True:  # one round of the paper's data per seed: 3 -> 5 -> 7 clusters, then 3 again
        data, changes = distribution_shift_data(args.observations, seed=rnd)
        first = rnd * per_round
        at = [first * args.chunk_size + c for c in ([0] if rnd else []) + list(changes)]
        print(f"feed-demo: stream {args.stream!r}, round {rnd}: change points at observations {at}, posting from seq "
              f"{max(start_seq, first)}", flush=True)
        code, clock = _post_round(args, data, first, max(start_seq, first), per_round, pace, max_lag, clock)
        rnd += 1
        if code or not getattr(args, "loop", False) or rnd == getattr(args, "rounds", 0):
            return code


def _post_round(args: argparse.Namespace, data, first: int, start_seq: int, per_round: int, pace: float,
                max_lag: int, clock: float) -> tuple[int, float]:
    done, next_at, told = -1, time.monotonic(), 0.0
    for seq in range(start_seq, first + per_round):
        while max_lag > 0 and seq - done > max_lag:  # back-pressure: wait for the slowest model
            done = _slowest_done(args, done)
            if seq - done > max_lag:
                if time.monotonic() - told > 30:
                    told = time.monotonic()
                    print(f"feed-demo: at seq {seq}, waiting for the workers (slowest model done up to seq {done}; "
                          f"--max-lag {max_lag})", flush=True)
                time.sleep(0.2)
        rows = data[(seq - first) * args.chunk_size : (seq - first + 1) * args.chunk_size].tolist()
        now = max(time.time(), clock + 1e-5 * len(rows))  # 10 µs a row at least: strictly increasing
        stamps = [clock + (now - clock) * (i + 1) / len(rows) for i in range(len(rows))]
        clock = stamps[-1]
        for attempt in range(30):
            code, body = _request("POST", f"{args.url}/v1/streams/{args.stream}/chunks", {"seq": seq, "rows": rows, "time": stamps},
                                  args.api_key)
            if code in (200, 202):
                break
            time.sleep(min(2.0, 0.1 * 2**attempt))
        else:
            print(f"feed-demo: giving up at seq {seq}: {code} {body}", file=sys.stderr)
            return 1, clock
        if pace:  # a cap, not a schedule: no burst to catch up after waiting for the workers
            next_at += pace
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()
    print(f"feed-demo: sent {data.shape[0]} observations (seq {first} to {first + per_round - 1})", flush=True)
    return 0, clock


def _slowest_done(args: argparse.Namespace, known: int) -> int:
    """The last seq that every model of the stream has applied (``known`` if the API did not answer)."""
    try:
        code, info = _request("GET", f"{args.url}/v1/streams/{args.stream}", None, args.api_key)
    except (OSError, ValueError):
        return known
    if code != 200 or not info.get("models"):
        return known
    return min(int(m["last_seq"]) for m in info["models"])

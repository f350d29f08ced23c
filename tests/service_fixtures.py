"""A real cusp API (uvicorn in a thread) on a real Redis (embedded, or a Redis Cluster), for service tests."""

import socket
import threading
import time

import httpx
import uvicorn

from service.api.app import create_app, server_options
from service.settings import Settings
from service.store import connect, is_cluster


def drain(redis_url: str, **worker_settings) -> int:
    """Run a fresh worker until it has nothing left to apply, then release its leases (so that
    another worker, in this test or the next, takes the pairs at once). Returns the chunks it
    applied."""
    from service.worker import Worker

    w = Worker(redis_url, **worker_settings)
    try:
        return w.run_until_idle()
    finally:
        w.release_all()


def routes_of(app) -> list:
    """The app's routes, one list: FastAPI >= 0.16x keeps an included router whole in
    ``app.routes`` (its routes carry their full paths, the router's prefix included)."""
    out = []
    for route in app.routes:
        inner = getattr(route, "original_router", None)
        out += routes_of(inner) if inner is not None else [route]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, redis_url: str, **settings):
        self.port = free_port()
        self.settings = Settings(port=self.port, workers=0, **settings)
        self.app = create_app(self.settings, redis_url)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    **server_options(self.settings)))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def stop(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)


def stream_keys_in_redis(redis_url: str, stream: str) -> list[bytes]:
    """Every key of ``stream`` that exists (on a Redis Cluster: KEYS asked of every master)."""
    r = connect(redis_url)
    try:
        pattern = f"cusp:{{{stream}}}:*"
        return r.keys(pattern, target_nodes=r.PRIMARIES) if is_cluster(redis_url) else r.keys(pattern)
    finally:
        r.close()

"""API keys, over real HTTP and WebSocket clients: every route of the app is enumerated from
``app.routes`` (a new route fails here until it is classified), and each must refuse a request
without a key (401; WebSockets close with 1008), a read-only key where it writes (403; 1008),
and accept a key with the scope. Keys are compared in constant time and never logged, not
even when they travel in a URL (WebSockets and the live page take ``?token=KEY``)."""

import ast
import inspect
import logging
import textwrap
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.routing import Route
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from service.api.app import create_app, server_options
from service.settings import Settings
from service.store import EmbeddedRedis
from tests.service_fixtures import free_port, routes_of

WRITER, READER = "writer-key-1x7Qz", "reader-key-9pLm2"
OPEN = {"/healthz", "/readyz"}  # the probes: orchestrators call them without credentials
S = "authed"


class Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(self.format(record))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The API with keys on an embedded redis-server, logging at INFO with uvicorn's own log
    configuration, as ``cusp serve`` runs it; every log record is captured."""
    redis = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    port = free_port()
    settings = Settings(port=port, workers=0, api_keys=f"{WRITER},{READER}:read")
    app = create_app(settings, redis.url)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="debug", **server_options(settings))
    capture = Capture()
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access", "cusp", "cusp.api"):
        logging.getLogger(name).addHandler(capture)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    r = client.post("/v1/streams", json={"name": S, "columns": ["a"], "models": ["gaussian"]},
                    headers={"Authorization": f"Bearer {WRITER}"})
    assert r.status_code == 201, r.text
    yield app, client, f"ws://127.0.0.1:{port}", capture
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access", "cusp", "cusp.api"):
        logging.getLogger(name).removeHandler(capture)
    client.close()
    srv.should_exit = True
    thread.join(10)
    redis.close()


def http_routes(app) -> list[tuple[str, str]]:
    out = []
    for route in routes_of(app):
        if isinstance(route, APIWebSocketRoute):
            continue
        assert isinstance(route, (APIRoute, Route)), route
        out += [(m, route.path) for m in sorted(route.methods - {"HEAD"})]
    return out


def request(client, method, path, key=None, stream="nope", how="bearer"):
    """One request to a route, aimed at a stream that does not exist (auth is checked first, and
    a 404 or 422 then shows the key was accepted without changing anything)."""
    headers, params = {}, {}
    if key is not None:
        if how == "bearer":
            headers["Authorization"] = f"Bearer {key}"
        elif how == "x-api-key":
            headers["X-API-Key"] = key
        else:
            params["token"] = key
    if method == "POST":
        headers["Content-Type"] = "application/json"
    return client.request(method, path.replace("{stream}", stream), headers=headers, params=params,
                          content=b"{}" if method == "POST" else None)


def test_every_http_route_needs_a_key_but_the_probes(server):
    app, client, _, _ = server
    routes = http_routes(app)
    assert {p for _, p in routes} >= {"/metrics", "/v1/streams", "/v1/streams/{stream}/chunks", "/", "/docs", "/openapi.json"}
    for method, path in routes:
        if path in OPEN:
            assert request(client, method, path).status_code in (200, 503), path
            continue
        for key in (None, "wrong-key-00000", WRITER[:-1], WRITER + "x", WRITER.upper(), f"{WRITER},{READER}"):
            r = request(client, method, path, key)
            assert r.status_code == 401, (method, path, key, r.status_code, r.text)
            assert "API key" in r.json()["detail"] and r.headers["www-authenticate"] == "Bearer"
        assert request(client, method, path, key="x" * 10_000).status_code in (401, 431), (method, path)


WRITES = {("POST", "/v1/streams"), ("DELETE", "/v1/streams/{stream}"), ("POST", "/v1/streams/{stream}/chunks")}


def test_read_only_keys_cannot_write_and_keys_with_the_scope_pass(server):
    app, client, _, _ = server
    routes = [r for r in http_routes(app) if r[1] not in OPEN]
    assert WRITES <= set(routes)
    for method, path in routes:
        for how in ("bearer", "x-api-key"):
            for key in (READER, WRITER):
                # the event stream of an existing stream never ends; the nonexistent one answers 404 after auth
                r = request(client, method, path, key, how=how)
                if (method, path) in WRITES and key == READER:
                    assert r.status_code == 403 and "read-only" in r.json()["detail"], (method, path, r.text)
                else:
                    assert r.status_code in (200, 404, 422), (method, path, key, r.status_code, r.text)
    # the pages opened in a browser also take ?token=
    for path in ("/", "/docs", "/redoc", "/openapi.json"):
        assert client.get(path, params={"token": READER}).status_code == 200, path
        assert client.get(path, params={"token": "wrong-key-00000"}).status_code == 401, path
    assert f"/openapi.json?token={READER}" in client.get("/docs", params={"token": READER}).text
    # the API routes take the key in headers only: a token in their URL would end up in proxies' logs
    assert client.get("/v1/streams", params={"token": READER}).status_code == 401
    # nothing was created or deleted by any of this
    assert client.get("/v1/streams", headers={"Authorization": f"Bearer {READER}"}).json() == {"streams": [S]}


def ws_outcome(url: str, headers=None) -> str:
    """'open' if the server accepted and kept the connection, else the close code."""
    try:
        with ws_connect(url, additional_headers=headers, open_timeout=10) as ws:
            try:
                ws.recv(timeout=0.5)
                return "message"
            except TimeoutError:
                return "open"
    except ConnectionClosed as exc:
        return str(exc.rcvd.code if exc.rcvd else None)


def test_websockets_authenticate_and_close_1008(server):
    app, client, ws_url, _ = server
    ws_routes = [r.path for r in routes_of(app) if isinstance(r, APIWebSocketRoute)]
    assert sorted(ws_routes) == ["/v1/streams/{stream}/evidence/ws", "/v1/streams/{stream}/ingest"]
    for path in ws_routes:
        url = ws_url + path.replace("{stream}", S)
        for query in ("", "?token=", "?token=wrong-key-00000", f"?token={WRITER}x"):
            assert ws_outcome(url + query) == "1008", (path, query)
        assert ws_outcome(url, headers={"Authorization": "Bearer wrong-key-00000"}) == "1008"
        need_write = path.endswith("/ingest")
        assert ws_outcome(url + f"?token={READER}") == ("1008" if need_write else "open"), path
        assert ws_outcome(url + f"?token={WRITER}") == "open", path
        assert ws_outcome(url, headers={"Authorization": f"Bearer {WRITER}"}) == "open", path
        assert ws_outcome(url, headers={"X-API-Key": WRITER}) == "open", path


def test_keys_are_compared_in_constant_time():
    """Settings.scope_of compares with hmac.compare_digest against every key, with no early exit
    and no ==, so the time taken does not tell how much of a key matched or which key it was."""
    src = textwrap.dedent(inspect.getsource(Settings.scope_of))
    tree = ast.parse(src)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert any(ast.unparse(c.func) == "hmac.compare_digest" for c in calls), src
    loops = [n for n in ast.walk(tree) if isinstance(n, ast.For)]
    assert loops and not any(isinstance(n, (ast.Return, ast.Break)) for loop in loops for n in ast.walk(loop)), src
    assert not any(isinstance(op, (ast.Eq, ast.NotEq, ast.In)) for n in ast.walk(tree) if isinstance(n, ast.Compare)
                   for op in n.ops if not (isinstance(n.left, ast.Name) and n.left.id == "presented")), src
    s = Settings(api_keys=f"{WRITER},{READER}:read")
    assert (s.scope_of(WRITER), s.scope_of(READER), s.scope_of(WRITER[:-1]), s.scope_of(None), s.scope_of("é" * 9)) == (
        "write", "read", None, None, None)


def test_keys_are_never_logged(server):
    app, client, ws_url, capture = server
    capture.lines.clear()
    # failing requests that carry a key: in a header, in a URL, on a WebSocket
    assert request(client, "POST", "/v1/streams", READER).status_code == 403
    assert request(client, "DELETE", "/v1/streams/{stream}", READER, stream=S).status_code == 403
    assert client.get("/v1/streams", headers={"Authorization": "Bearer wrong-key-00000"}).status_code == 401
    assert client.get("/", params={"token": "wrong-key-00000"}).status_code == 401
    assert client.get("/", params={"token": READER}).status_code == 200
    assert client.get(f"/v1/streams/{S}/evidence", params={"since": "bad", "token": READER},
                      headers={"Authorization": f"Bearer {READER}"}).status_code == 422
    assert ws_outcome(f"{ws_url}/v1/streams/{S}/ingest?token={READER}") == "1008"
    assert ws_outcome(f"{ws_url}/v1/streams/nope/evidence/ws?token={WRITER}") == "1008"
    assert ws_outcome(f"{ws_url}/v1/streams/{S}/evidence/ws?token=wrong-key-00000") == "1008"
    time.sleep(0.2)
    text = "\n".join(capture.lines)
    # the requests were logged (the access log is on), just not the keys
    assert "/v1/streams" in text and "token=REDACTED" in text, text[-2000:]
    for secret in (READER, WRITER, "wrong-key-00000"):
        assert secret not in text, secret

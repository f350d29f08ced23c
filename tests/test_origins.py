"""Issue 19 item 5: a page on another site cannot use cusp's WebSockets with the credentials of
whoever opens it (browsers apply no CORS to WebSockets), and CORS is off unless configured.
Over real HTTP and WebSockets with the embedded Redis, keys off (the default)."""

import json
import uuid

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from service.settings import Settings
from tests.service_fixtures import LiveServer


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cors(redis_url):
    server = LiveServer(redis_url, allowed_origins="https://grafana.example.com", cors=True)
    yield server
    server.stop()


def stream(server):
    s = "o" + uuid.uuid4().hex[:8]
    assert server.client.post("/v1/streams", json={"name": s, "columns": ["x"], "models": ["gaussian"]}).status_code == 201
    return s


def ws_result(url, origin):
    """What a first message gets: the ack, or the close reason."""
    try:
        with ws_connect(url, origin=origin) as ws:
            ws.send(json.dumps({"seq": 0, "rows": [[1.0]]}))
            return json.loads(ws.recv())["status"]
    except ConnectionClosed as exc:
        return f"closed {exc.rcvd.code if exc.rcvd else ''} {exc.rcvd.reason if exc.rcvd else ''}"


def test_a_websocket_from_another_site_writes_nothing(live):
    s = stream(live)
    url = f"{live.ws_url}/v1/streams/{s}/ingest"
    assert ws_result(url, "http://evil.example").startswith("closed 1008 origin not allowed")
    assert live.client.get(f"/v1/streams/{s}").json()["next_seq"] == 0
    assert ws_result(url, live.url) == "accepted"  # the same origin (the live page) may
    assert ws_result(url, None) == "duplicate"  # a program sends no Origin: the API key (none here) is its check
    with pytest.raises(ConnectionClosed):
        with ws_connect(f"{live.ws_url}/v1/streams/{s}/evidence/ws", origin="http://evil.example") as ws:
            ws.recv()


def test_cors_is_off_unless_configured(live, cors):
    pre = {"Origin": "https://grafana.example.com", "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in live.client.options("/v1/streams", headers=pre).headers
    assert "access-control-allow-origin" not in live.client.get("/v1/streams", headers={"Origin": "https://x.example"}).headers
    r = cors.client.options("/v1/streams", headers=pre)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://grafana.example.com"
    r = cors.client.get("/v1/streams", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers
    s = stream(cors)
    assert ws_result(f"{cors.ws_url}/v1/streams/{s}/ingest", "https://grafana.example.com") == "accepted"
    assert ws_result(f"{cors.ws_url}/v1/streams/{s}/ingest", "https://evil.example").startswith("closed 1008")


@pytest.mark.parametrize("bad", ["grafana.example.com", "ftp://x", "https://x/path"])
def test_bad_origins_are_refused_at_start(bad):
    with pytest.raises(ValueError, match="not an origin"):
        Settings(allowed_origins=bad)

"""The live page (``GET /``) in headless Chromium against a real service: a LiveServer on an
embedded redis-server, workers in burst mode, and Chromium driven over the Chrome DevTools
Protocol (its WebSocket, ``--remote-debugging-port``) with ``Runtime.evaluate`` reading
``window.cusp`` and the DOM, and ``Page.captureScreenshot`` saving a PNG into the test's
tmp dir. Skipped, with the reason, when no Chromium is installed (``make test`` installs it
when it runs as root on a machine with apt-get)."""

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest
from websockets.sync.client import connect as ws_connect

from service.store import connect, keys
from service.worker import Worker
from tests.service_fixtures import LiveServer

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chromium-headless-shell", "headless_shell")


def find_chromium() -> str | None:
    exe = os.environ.get("CUSP_CHROMIUM")
    if exe:
        return exe if shutil.which(exe) else None
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


class Chromium:
    """Headless Chromium with one page, driven over the DevTools Protocol."""

    def __init__(self, exe: str, profile: Path):
        profile.mkdir(parents=True, exist_ok=True)
        self.stack = contextlib.ExitStack()
        self.log = open(profile / "chromium.log", "wb")
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking", "--mute-audio",
             "--hide-scrollbars", "--window-size=1280,900", "--remote-debugging-port=0", f"--user-data-dir={profile}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"Chromium did not open its DevTools port; see {profile / 'chromium.log'}")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            page = next(t for t in json.load(resp) if t["type"] == "page")
        self.ws = self.stack.enter_context(ws_connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30))
        self.next_id, self.errors = 0, []
        self.call("Runtime.enable")
        self.call("Page.enable")

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("method") == "Runtime.exceptionThrown":
                self.errors.append(msg["params"]["exceptionDetails"])
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def eval(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0):
        """Evaluate until the value is truthy; return it (fails the test with the last value).
        An exception (the page still loading, say) counts as not yet."""
        deadline, value = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            try:
                value = self.eval(expression)
            except RuntimeError as exc:
                value = exc
            else:
                if value:
                    return value
            time.sleep(0.1)
        pytest.fail(f"timed out after {timeout} s waiting for {expression}; last value {value!r}; page errors {self.errors}")

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        return path

    def close(self) -> None:
        try:
            self.stack.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.log.close()


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    exe = find_chromium()
    if exe is None:
        pytest.skip(f"no Chromium found (looked for {', '.join(BROWSERS)} on PATH, or CUSP_CHROMIUM); "
                    "install it with `apt-get install chromium` (make test does when run as root)")
    browser = Chromium(exe, tmp_path_factory.mktemp("chromium"))
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url)
    yield server
    server.stop()


def rows(n, seed):
    return np.random.default_rng(seed).normal(size=(n, 2)).round(6).tolist()


def feed(live, redis_url, s, seqs):
    for seq in seqs:
        r = live.client.post(f"/v1/streams/{s}/chunks", json={"seq": seq, "rows": rows(100, seq)})
        assert r.status_code == 202, r.text
    w = Worker(redis_url)
    try:
        assert w.run_until_idle() == 2 * len(seqs)
    finally:
        w.release_all()


LENGTHS = "JSON.stringify(Object.fromEntries(Object.entries(window.cusp.series).map(([m, s]) => [m, s.n.length])))"
MODELS = ("gaussian", "gmm2")


def lengths(page) -> dict:
    return json.loads(page.eval(LENGTHS))


def ink(page, canvas: str, color: str, right_half: bool = False) -> int:
    """Pixels of ``color`` (#rrggbb, within a small tolerance for anti-aliasing) on a canvas,
    or on its right half only (where no legend text is)."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    page.wait_for("new Promise((ok) => requestAnimationFrame(() => ok(true)))")  # a scheduled render is done
    return page.eval(f"""(() => {{
        const c = document.getElementById({json.dumps(canvas)}), x0 = {"Math.floor(c.width / 2)" if right_half else 0};
        const d = c.getContext("2d").getImageData(x0, 0, c.width - x0, c.height).data;
        let k = 0;
        for (let i = 0; i < d.length; i += 4)
            if (Math.abs(d[i] - {r}) < 24 && Math.abs(d[i + 1] - {g}) < 24 && Math.abs(d[i + 2] - {b}) < 24 && d[i + 3] > 200) k++;
        return k;
    }})()""")


def test_live_page_plots_results_probabilities_and_changepoints(chromium, live, redis_url, tmp_path):
    page = chromium
    s = "page" + uuid.uuid4().hex[:8]
    other = "other" + uuid.uuid4().hex[:8]  # another stream, listed first, that the page must not show
    for name in (s, other):
        r = live.client.post("/v1/streams", json={"name": name, "columns": ["a", "b"], "seed": 1,
                                                  "models": ["gaussian", {"name": "gmm2", "spec": "gmm:components=2"}]})
        assert r.status_code == 201, r.text
    feed(live, redis_url, s, range(1))  # a result that exists before the page opens: back-filled

    page.call("Page.navigate", url=f"{live.url}/?stream={s}")
    page.wait_for(f"document.getElementById('status').textContent === 'live: {s}'")
    assert page.eval("window.cusp.stream") == s
    assert page.eval("document.getElementById('stream').value") == s
    assert lengths(page) == {m: 1 for m in MODELS}
    assert ink(page, "evidence", "#cccccc") > 100  # one result per model: the axes are drawn (no NaN scale)
    assert ink(page, "evidence", "#2563eb", right_half=True) > 0  # and the lone result is a dot

    feed(live, redis_url, s, [1])  # results that arrive over the WebSocket
    page.wait_for("window.cusp.series.gaussian.n.length === 2 && window.cusp.series.gmm2.n.length === 2")
    assert ink(page, "steps", "#dc2626", right_half=True) > 0  # two results: a line joins them
    blue = ink(page, "evidence", "#2563eb")

    feed(live, redis_url, s, range(2, 6))
    page.wait_for(f"{LENGTHS} === {json.dumps(json.dumps({m: 6 for m in MODELS}, separators=(',', ':')))}")
    assert page.eval("window.cusp.series.gaussian.n") == [100 * (i + 1) for i in range(6)]
    steps = page.eval("window.cusp.series.gmm2.steps")
    assert len(steps) == 6 and all(isinstance(v, int) and v >= 1 for v in steps)
    assert ink(page, "evidence", "#2563eb") > blue  # the drawn line grew with the series
    assert ink(page, "steps", "#dc2626") > 0  # the second model's annealing steps are drawn

    # posterior model probabilities: one row per model, each a number, summing to one
    table = page.wait_for("""(() => { const rows = [...document.querySelectorAll('#models tr')].slice(1)
        .map((tr) => [...tr.cells].map((td) => td.textContent));
        return rows.length === 2 && rows.every((r) => r[1] === '600' && /^[01]\\.\\d{3}$/.test(r[2])) && rows; })()""")
    assert [row[0] for row in table] == list(MODELS)
    api = {m["name"]: m["posterior_probability"] for m in live.client.get(f"/v1/streams/{s}").json()["models"]}
    assert sum(float(row[2]) for row in table) == pytest.approx(1.0, abs=2e-3)
    assert all(float(row[2]) == pytest.approx(api[row[0]], abs=6e-4) for row in table)
    assert ink(page, "evidence", "#b91c1c") == 0  # no change-point mark yet
    assert page.eval("document.getElementById('cps').textContent") == "none yet"

    # a model's own event, as the worker's apply script writes it (model, kind, data JSON): listed
    # under "model events" and ticked in the model's color, not drawn as the stream's change
    event = {"model": "gaussian", "kind": "changepoint", "data": json.dumps({"seq": 4, "location": 420, "confidence": 0.93})}
    connect(redis_url).xadd(keys.out(s), event)
    connect(redis_url).xadd(keys.changes(s), event)  # APPLY writes it to both
    page.wait_for("window.cusp.events.length === 1")
    ev = page.eval("window.cusp.events[0]")
    assert (ev["model"], ev["location"], ev["confidence"]) == ("gaussian", 420, 0.93)
    items = page.wait_for("(() => { const li = [...document.querySelectorAll('#events li.ev')]; return li.length && li.map((x) => x.textContent); })()")
    assert items == ["gaussian: observation 420 (confidence 0.930)"]
    assert page.eval("window.cusp.changepoints.length") == 0 and ink(page, "evidence", "#b91c1c") == 0
    # the stream's change point (the ANSWER script's entry): red dashed marks on both plots, listed first
    connect(redis_url).xadd(keys.out(s), {"model": "*", "kind": "stream_changepoint", "data": json.dumps(
        {"seq": 4, "location": 421, "detected_at": 500, "confidence": 0.97, "support": {"gaussian": [0.99, 0.93]}})})
    page.wait_for("window.cusp.changepoints.length === 1")
    items = page.wait_for("(() => { const li = [...document.querySelectorAll('#cps li.cp')]; return li.length && li.map((x) => x.textContent); })()")
    assert items == ["observation 421 (confidence 0.970)"]
    assert ink(page, "evidence", "#b91c1c") > 20 and ink(page, "steps", "#b91c1c") > 20  # dashed marks on both plots
    connect(redis_url).xadd(keys.out(s), {"model": "gmm2", "kind": "changepoint",
                                          "data": json.dumps({"seq": 5, "location": 550, "confidence": 0.5})})
    items = page.wait_for("(() => { const li = [...document.querySelectorAll('#events li.ev')]; return li.length === 2 && li.map((x) => x.textContent); })()")
    assert items == ["gmm2: observation 550 (confidence 0.500)", "gaussian: observation 420 (confidence 0.930)"]  # newest first
    # a change point only in the change-point store (its result entries trimmed away): shown after a reload
    connect(redis_url).xadd(keys.changes(s), {"model": "*", "kind": "stream_changepoint", "data": json.dumps(
        {"seq": 5, "location": 560, "detected_at": 600, "confidence": 0.995, "support": {"gmm2": [0.9, 0.5]}})})

    shot = page.screenshot(tmp_path / "live_page.png")
    print(f"\nlive page screenshot: {shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000

    # a reload back-fills everything, change point included, with no gaps or repeats
    page.call("Page.reload")
    page.wait_for(f"document.getElementById('status').textContent === 'live: {s}'")
    assert lengths(page) == {m: 6 for m in MODELS}
    assert [c["location"] for c in page.eval("window.cusp.changepoints")] == [421, 560]  # from results, then the store
    assert [c["location"] for c in page.eval("window.cusp.events")] == [420, 550]  # each once, though in both

    # one model ahead of the other: the API has no P(model) then, the page keeps the last one, marked
    assert live.client.post(f"/v1/streams/{s}/chunks", json={"seq": 6, "rows": rows(100, 6)}).status_code == 202
    w = Worker(redis_url)
    try:
        assert w._take(s, "gaussian") and w._process(w.hot[(s, "gaussian")]) == 1
        page.wait_for("window.cusp.series.gaussian.n.length === 7")
        cells = page.wait_for("""(() => { const r = [...document.querySelectorAll('#models tr')].slice(1).map((tr) => tr.cells[2].textContent);
            return r.length === 2 && r.every((x) => x.endsWith(' (n = 600)')) && r; })()""")
        assert [c.split(" ")[0] for c in cells] == [row[2] for row in table]
        assert w._take(s, "gmm2") and w._process(w.hot[(s, "gmm2")]) == 1
    finally:
        w.release_all()
    page.wait_for("window.cusp.series.gaussian.n.length === 7 && window.cusp.series.gmm2.n.length === 7")
    assert page.eval("window.cusp.series.gmm2.n") == [100 * (i + 1) for i in range(7)]
    fresh = page.wait_for("""(() => { const r = [...document.querySelectorAll('#models tr')].slice(1).map((tr) => [...tr.cells].map((td) => td.textContent));
        return r.length === 2 && r.every((x) => x[1] === '700' && /^[01]\\.\\d{3}$/.test(x[2])) && r; })()""")
    assert sum(float(r[2]) for r in fresh) == pytest.approx(1.0, abs=2e-3)
    assert page.eval("window.cusp.probabilities.gmm2.n") == 700
    assert page.errors == []


def test_live_page_names_a_missing_stream(chromium, live):
    page = chromium
    page.call("Page.navigate", url=f"{live.url}/?stream=no-such-stream")
    status = page.wait_for("(() => { const t = document.getElementById('status').textContent; return /404/.test(t) && t; })()")
    assert "no stream named 'no-such-stream'" in status and "retrying" in status
    # it keeps trying, and follows the stream once it exists (a page opened before the demo feeder ran)
    r = live.client.post("/v1/streams", json={"name": "no-such-stream", "columns": ["a", "b"], "models": ["gaussian"]})
    assert r.status_code == 201, r.text
    page.wait_for("document.getElementById('status').textContent === 'live: no-such-stream'", timeout=20)

"""The live page (``GET /``) in headless Chromium against a real service: a LiveServer on an
embedded redis-server, workers in burst mode, and Chromium driven over the Chrome DevTools
Protocol (its WebSocket, ``--remote-debugging-port``) with ``Runtime.evaluate`` reading
``window.cusp``, its uPlot charts and the DOM, ``Input.dispatchMouseEvent`` hovering, dragging
and double-clicking like a user, ``Emulation.setDeviceMetricsOverride`` narrowing the window to
a phone's width, and ``Page.captureScreenshot`` saving PNGs into the test's tmp dir. Skipped,
with the reason, when no Chromium is installed (``make test`` installs it when it runs as root
on a machine with apt-get)."""

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from websockets.sync.client import connect as ws_connect

from service.store import connect, keys
from service.worker import Worker
from tests.service_fixtures import LiveServer, drain

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
        self.call("Log.enable")

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            # what a page reports as an error: uncaught exceptions, console.error, and the
            # browser's own (a resource that failed to load, a blocked request)
            if msg.get("method") == "Runtime.exceptionThrown":
                self.errors.append(msg["params"]["exceptionDetails"])
            elif msg.get("method") == "Runtime.consoleAPICalled" and msg["params"]["type"] == "error":
                self.errors.append(msg["params"]["args"])
            elif msg.get("method") == "Log.entryAdded" and msg["params"]["entry"]["level"] == "error":
                self.errors.append(msg["params"]["entry"])
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
    assert drain(redis_url) == 2 * len(seqs)


LENGTHS = "JSON.stringify(Object.fromEntries(Object.entries(window.cusp.series).map(([m, s]) => [m, s.n.length])))"
MODELS = ("gaussian", "gmm2")
TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{3})?")  # how the page writes a time (UTC)


def lengths(page) -> dict:
    return json.loads(page.eval(LENGTHS))


def rendered(page) -> None:
    """Wait until no render is scheduled, and uPlot's drawing (a frame later at most) is done."""
    page.wait_for("!window.cusp.dirty && new Promise((ok) => requestAnimationFrame(() => requestAnimationFrame(() => ok(true))))")


def ink(page, chart: str, color: str, right_half: bool = False) -> int:
    """Pixels of ``color`` (#rrggbb, within a small tolerance for anti-aliasing) on a chart's
    canvas, or on its right half only."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    rendered(page)
    return page.eval(f"""(() => {{
        const c = document.querySelector("#{chart} canvas"), x0 = {"Math.floor(c.width / 2)" if right_half else 0};
        const d = c.getContext("2d").getImageData(x0, 0, c.width - x0, c.height).data;
        let k = 0;
        for (let i = 0; i < d.length; i += 4)
            if (Math.abs(d[i] - {r}) < 24 && Math.abs(d[i + 1] - {g}) < 24 && Math.abs(d[i + 2] - {b}) < 24 && d[i + 3] > 200) k++;
        return k;
    }})()""")


def red_columns(page, chart: str) -> list[float]:
    """CSS x (from the chart's left edge) of each run of canvas columns that hold a tall red
    (change-point) line: the dashed lines, not a model's short tick."""
    rendered(page)
    return page.eval(f"""(() => {{
        const c = document.querySelector("#{chart} canvas"), g = c.getContext("2d"), d = g.getImageData(0, 0, c.width, c.height).data;
        const dpr = c.width / c.getBoundingClientRect().width, red = [];
        for (let x = 0; x < c.width; x++) {{
            let k = 0;
            for (let y = 0; y < c.height; y++) {{
                const i = 4 * (y * c.width + x);
                if (Math.abs(d[i] - 0xb9) < 30 && d[i + 1] < 60 && d[i + 2] < 60 && d[i + 3] > 200) k++;
            }}
            if (k > c.height / 4) red.push(x);
        }}
        const runs = [];
        for (const x of red) if (runs.length && x - runs.at(-1).at(-1) <= 1) runs.at(-1).push(x); else runs.push([x]);
        return runs.map((r) => (r[0] + r.at(-1) + 1) / 2 / dpr);
    }})()""")


def tick_colors(page, chart: str, x: float) -> list[str]:
    """The colors (#rrggbb) of the model-event ticks at ``x``: opaque pixels in the bottom 16 CSS
    px of the plot, in the canvas column where the chart draws ``x``, from the bottom up."""
    rendered(page)
    return page.eval(f"""(() => {{
        const u = cusp.charts.{chart}, c = u.ctx.canvas, dpr = c.width / c.getBoundingClientRect().width;
        const X = Math.round(u.valToPos({x!r}, 'x', true)), bottom = u.bbox.top + u.bbox.height;
        const d = u.ctx.getImageData(X, bottom - 16 * dpr, 1, 16 * dpr).data, out = [];
        for (let i = d.length - 4; i >= 0; i -= 4) {{
            const hex = '#' + [d[i], d[i + 1], d[i + 2]].map((v) => v.toString(16).padStart(2, '0')).join('');
            if (d[i + 3] === 255 && hex !== '#ffffff' && out.at(-1) !== hex) out.push(hex);
        }}
        return out;
    }})()""")


def chart_x(page, chart: str, x: float) -> float:
    """CSS px, from the chart's canvas' left edge, where the chart draws ``x``."""
    return page.eval(f"(() => {{ const u = cusp.charts.{chart}; return u.valToPos({x!r}, 'x') + u.over.offsetLeft; }})()")


def mouse(page, kind: str, x: float, y: float, **extra) -> None:
    page.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)


def over_point(page, chart: str, x: float) -> tuple[float, float]:
    """The viewport position (CSS px) of ``x`` on a chart, half-way down its plot."""
    return tuple(page.eval(f"""(() => {{ const u = cusp.charts.{chart}, r = u.over.getBoundingClientRect();
        return [r.left + u.valToPos({x!r}, 'x'), r.top + r.height / 2]; }})()"""))


def x_range(page, chart: str) -> list[float]:
    return page.eval(f"[cusp.charts.{chart}.scales.x.min, cusp.charts.{chart}.scales.x.max]")


def seconds(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def shown(t: float) -> str:
    """A time as the page writes it: UTC, milliseconds only when there are some."""
    d = datetime.fromtimestamp(t, timezone.utc)
    return d.strftime("%Y-%m-%d %H:%M:%S") + (f".{d.microsecond // 1000:03d}" if d.microsecond // 1000 else "")


def legend(page, chart: str) -> dict:
    """The chart's legend as shown: series label -> value text."""
    return page.eval(f"""Object.fromEntries([...document.querySelectorAll('#{chart} .u-legend .u-series')]
        .map((tr) => [tr.querySelector('.u-label').textContent, tr.querySelector('.u-value').textContent]))""")


# Every text the charts draw on their canvases, with its box in CSS px (the canvas' transform and
# the text's own measured extent, around where it was anchored): fillText is wrapped to record
# it while the charts are redrawn with their axes laid out again.
LABEL_BOXES = """(async () => {
    const proto = CanvasRenderingContext2D.prototype, fill = proto.fillText, boxes = [];
    proto.fillText = function (text, x, y, ...rest) {
        const m = this.measureText(text), t = this.getTransform(), dpr = this.canvas.width / this.canvas.getBoundingClientRect().width;
        const corners = [[x - m.actualBoundingBoxLeft, y - m.actualBoundingBoxAscent], [x + m.actualBoundingBoxRight, y + m.actualBoundingBoxDescent],
                         [x - m.actualBoundingBoxLeft, y + m.actualBoundingBoxDescent], [x + m.actualBoundingBoxRight, y - m.actualBoundingBoxAscent]]
            .map(([a, b]) => [(t.a * a + t.c * b + t.e) / dpr, (t.b * a + t.d * b + t.f) / dpr]);
        const xs = corners.map((p) => p[0]), ys = corners.map((p) => p[1]);
        if (String(text).trim()) boxes.push({ chart: this.canvas.closest('.chart').id, text: String(text),
            left: Math.min(...xs), right: Math.max(...xs), top: Math.min(...ys), bottom: Math.max(...ys),
            width: this.canvas.width / dpr, height: this.canvas.height / dpr });
        return fill.call(this, text, x, y, ...rest);
    };
    try {  // uPlot draws on its next commit (a microtask): wait a frame
        for (const u of Object.values(cusp.charts)) u.redraw(false, true);
        await new Promise((ok) => requestAnimationFrame(() => requestAnimationFrame(ok)));
    } finally { proto.fillText = fill; }
    const once = new Map(boxes.map((b) => [[b.chart, b.text, b.left, b.top].join("|"), b]));  // a text drawn again in place
    return [...once.values()];
})()"""


def overlaps(boxes: list[dict]) -> list:
    """Pairs of texts on one canvas whose boxes intersect, and texts not wholly on their canvas."""
    bad = [(b["chart"], b["text"], "off the canvas") for b in boxes
           if b["left"] < 0 or b["top"] < 0 or b["right"] > b["width"] + 0.5 or b["bottom"] > b["height"] + 0.5]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if a["chart"] == b["chart"] and a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]:
                bad.append((a["chart"], a["text"], b["text"]))
    return bad


def test_live_page_plots_results_probabilities_and_changepoints(chromium, live, redis_url, tmp_path):
    page = chromium
    page.errors.clear()
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
    rendered(page)
    for chart in ("evidence", "steps"):  # one result per model: finite scales (no NaN), a lone x padded to a range
        scales = page.eval(f"(() => {{ const u = cusp.charts.{chart}; return [u.scales.x.min, u.scales.x.max, u.scales.y.min, u.scales.y.max]; }})()")
        assert all(isinstance(v, (int, float)) for v in scales) and scales[0] < scales[1] and scales[2] < scales[3], (chart, scales)
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
    # x is time (the chunks' arrival times: no row times were sent): one x per chunk, the same on both charts
    results = [e for e in live.client.get(f"/v1/streams/{s}/evidence", params={"model": "gaussian"}).json()["results"]]
    ends = [seconds(e["time_end"]) for e in results]
    assert page.eval("cusp.timed") and page.eval("cusp.series.gaussian.t") == pytest.approx(ends, abs=1e-6)
    assert x_range(page, "evidence") == x_range(page, "steps") == pytest.approx([ends[0], ends[-1]], abs=1e-6)
    ticks = page.eval("cusp.charts.steps.axes[0]._values")  # sub-second steps: as many decimals as they need
    assert len(ticks) >= 2 and len(set(ticks)) == len(ticks), ticks
    # the legend, the cursor away from the charts: each model's latest values
    assert legend(page, "steps") == {"time": shown(ends[-1]), **{m: str(page.eval(f"cusp.series.{m}.steps.at(-1)")) for m in MODELS}}

    # posterior model probabilities: one row per model, each a number, summing to one
    table = page.wait_for("""(() => { const rows = [...document.querySelectorAll('#models tr')].slice(1)
        .map((tr) => [...tr.cells].map((td) => td.textContent));
        return rows.length === 2 && rows.every((r) => r[1] === '600' && /^[01]\\.\\d{3}$/.test(r[2])) && rows; })()""")
    assert [row[0] for row in table] == list(MODELS)
    api = {m["name"]: m["posterior_probability"] for m in live.client.get(f"/v1/streams/{s}").json()["models"]}
    assert sum(float(row[2]) for row in table) == pytest.approx(1.0, abs=2e-3)
    assert all(float(row[2]) == pytest.approx(api[row[0]], abs=6e-4) for row in table)
    assert red_columns(page, "evidence") == red_columns(page, "steps") == []  # no change-point mark yet
    assert page.eval("document.getElementById('cps').textContent") == "none yet"

    # a model's own event, as the worker's apply script writes it (model, kind, data JSON), here
    # without times (an entry stored before change points had them): listed under "model events"
    # and ticked in the model's color, not drawn as the stream's change; placed at the time of
    # observation 420 in the chunk that holds it (chunk 4, rows 400-499: its arrival time)
    event = {"model": "gaussian", "kind": "changepoint", "data": json.dumps({"seq": 4, "location": 420, "confidence": 0.93})}
    connect(redis_url).xadd(keys.out(s), event)
    connect(redis_url).xadd(keys.changes(s), event)  # APPLY writes it to both
    page.wait_for("window.cusp.events.length === 1")
    ev = page.eval("window.cusp.events[0]")
    assert (ev["model"], ev["location"], ev["confidence"]) == ("gaussian", 420, 0.93)
    assert page.eval("cusp.xOf(cusp.events[0])") == {"x": pytest.approx(ends[4], abs=1e-6), "exact": False}
    items = page.wait_for("(() => { const li = [...document.querySelectorAll('#events li.ev')]; return li.length && li.map((x) => x.textContent); })()")
    assert items == [f"gaussian: observation 420 at ≈ {shown(ends[4])} UTC (confidence 0.930)"]
    assert page.eval("window.cusp.changepoints.length") == 0 and red_columns(page, "evidence") == []
    # the stream's change point (the ANSWER script's entry): red dashed marks on both plots, listed first
    connect(redis_url).xadd(keys.out(s), {"model": "*", "kind": "stream_changepoint", "data": json.dumps(
        {"seq": 4, "location": 421, "detected_at": 500, "confidence": 0.97, "support": {"gaussian": [0.99, 0.93]}})})
    page.wait_for("window.cusp.changepoints.length === 1")
    items = page.wait_for("(() => { const li = [...document.querySelectorAll('#cps li.cp')]; return li.length && li.map((x) => x.textContent); })()")
    assert items == [f"observation 421 at ≈ {shown(ends[4])} UTC (confidence 0.970)"]
    assert ink(page, "evidence", "#b91c1c") > 20 and ink(page, "steps", "#b91c1c") > 20  # dashed marks on both plots
    for chart in ("evidence", "steps"):  # at chunk 4's time on both: one x axis
        assert red_columns(page, chart) == [pytest.approx(chart_x(page, chart, ends[4]), abs=1.5)]
    connect(redis_url).xadd(keys.out(s), {"model": "gmm2", "kind": "changepoint",
                                          "data": json.dumps({"seq": 5, "location": 550, "confidence": 0.5})})
    items = page.wait_for("(() => { const li = [...document.querySelectorAll('#events li.ev')]; return li.length === 2 && li.map((x) => x.textContent); })()")
    assert items == [f"gmm2: observation 550 at ≈ {shown(ends[5])} UTC (confidence 0.500)",
                     f"gaussian: observation 420 at ≈ {shown(ends[4])} UTC (confidence 0.930)"]  # newest first
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

    # one model ahead of the other: P(model) compares them on the 600 rows both have seen (the API's
    # probability_observations, from the stream's answer), marked with that n
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


T0 = 1_795_000_000.0  # 2026-11-18T11:06:40Z
STEP = 60.0  # seconds between rows
CHUNK, CHUNKS, CHANGE = 50, 16, 400  # the level moves by 5 standard deviations at row 400


def timed_chunk(seq: int) -> dict:
    y = np.random.default_rng(seq).normal(size=CHUNK) + np.where(np.arange(seq * CHUNK, (seq + 1) * CHUNK) >= CHANGE, 5.0, 0.0)
    return {"seq": seq, "rows": [[round(v, 6)] for v in y], "time": [T0 + STEP * i for i in range(seq * CHUNK, (seq + 1) * CHUNK)]}


def test_live_page_time_axis_hover_zoom_and_narrow_layout(chromium, live, redis_url, tmp_path):
    """Rows sent with their own times (one a minute) and a change at row 400: one time axis on
    both charts with the stream's change at its time, values at the cursor, drag to zoom both
    charts (kept while results arrive), double-click back to everything, and at 400 and 360 px
    wide no page overflow and no axis label over another or off its canvas; every resource the
    page loads is the service's own; no errors."""
    page = chromium
    page.errors.clear()
    s = "timed" + uuid.uuid4().hex[:8]
    r = live.client.post("/v1/streams", json={"name": s, "columns": ["y"], "seed": 1, "models": ["gaussian", "level"]})
    assert r.status_code == 201, r.text
    for seq in range(CHUNKS):
        r = live.client.post(f"/v1/streams/{s}/chunks", json=timed_chunk(seq))
        assert r.status_code == 202, r.text
    assert drain(redis_url) == 2 * CHUNKS
    got = live.client.get(f"/v1/streams/{s}/changepoints").json()["stream"]
    assert [(c["location"], seconds(c["location_time"])) for c in got] == [(CHANGE, T0 + STEP * CHANGE)]
    found = got[0]
    level = [e for e in live.client.get(f"/v1/streams/{s}/evidence", params={"model": "level", "kind": "result"}).json()["results"]]
    ends = [seconds(e["time_end"]) for e in level]
    assert ends == [T0 + STEP * ((k + 1) * CHUNK - 1) for k in range(CHUNKS)]  # results at their last row's time

    page.call("Page.navigate", url=f"{live.url}/?stream={s}")
    page.wait_for(f"document.getElementById('status').textContent === 'live: {s}' && cusp.series.level && cusp.series.level.n.length === {CHUNKS}")
    rendered(page)
    # one time axis: both charts, the same x range (the first to the last result), labelled in UTC
    assert page.eval("cusp.timed && cusp.charts.evidence.scales.x.time && cusp.charts.steps.scales.x.time")
    assert x_range(page, "evidence") == x_range(page, "steps") == [ends[0], ends[-1]]
    assert page.eval("cusp.charts.evidence.axes[0].label(cusp.charts.evidence)") == "time (UTC), 2026-11-18 to 2026-11-19"
    ticks = page.eval("cusp.charts.evidence.axes[0]._values")
    assert len(ticks) >= 4 and all(re.fullmatch(r"\d\d:\d\d", t) for t in ticks), ticks
    # the stream's change: a red dashed line at its time (17:46:40) on both charts, listed with its time and delay
    for chart in ("evidence", "steps"):
        assert red_columns(page, chart) == [pytest.approx(chart_x(page, chart, T0 + STEP * CHANGE), abs=1.5)]
    # each model's event at the change: a tick in its color, stacked by model (gaussian, then level), both seen
    assert [c for c in tick_colors(page, "evidence", T0 + STEP * CHANGE) if c in ("#2563eb", "#dc2626")] == ["#2563eb", "#dc2626"]
    delay = found["delay_seconds"]
    assert delay == pytest.approx(seconds(found["detected_time"]) - seconds(found["location_time"]))
    minutes = f"{delay / 60:.3g} min" if delay >= 120 else f"{delay:.3g} s"
    assert page.eval("document.querySelector('#cps li.cp').textContent") == \
        f"observation 400 at 2026-11-18 17:46:40 UTC, found {minutes} later (confidence {found['confidence']:.3f})"

    # hover: the cursor over a result shows its time and each model's value there, on both charts (synced)
    api = {m: {seconds(e["time_end"]): e for e in live.client.get(f"/v1/streams/{s}/evidence",
                                                                    params={"model": m, "kind": "result"}).json()["results"]}
           for m in ("gaussian", "level")}
    k = 9
    mouse(page, "mouseMoved", *over_point(page, "evidence", ends[k]))
    shown_k = shown(ends[k])
    page.wait_for(f"document.querySelector('#evidence .u-legend .u-value').textContent === {json.dumps(shown_k)}")
    assert legend(page, "evidence") == {"time": shown_k, **{m: f"{api[m][ends[k]]['log_evidence_per_observation']:.4f}" for m in api}}
    assert legend(page, "steps") == {"time": shown_k, **{m: str(api[m][ends[k]]["annealing_steps"]) for m in api}}

    # drag from the 4th to the 12th result: both charts zoom to that span
    full_y = page.eval("[cusp.charts.evidence.scales.y.min, cusp.charts.evidence.scales.y.max]")
    (x1, y), (x2, _) = over_point(page, "evidence", ends[3]), over_point(page, "evidence", ends[11])
    mouse(page, "mousePressed", x1, y, button="left", buttons=1, clickCount=1)
    for f in (0.3, 0.7, 1.0):
        mouse(page, "mouseMoved", x1 + f * (x2 - x1), y, button="left", buttons=1)
    mouse(page, "mouseReleased", x2, y, button="left", buttons=0, clickCount=1)
    page.wait_for("cusp.zoom !== null")
    rendered(page)
    zoom = x_range(page, "evidence")
    assert zoom == x_range(page, "steps") == page.eval("cusp.zoom")
    assert zoom == pytest.approx([ends[3], ends[11]], abs=2 * STEP * CHUNK / 100)  # within a pixel or two of the drag
    y0, y1 = page.eval("[cusp.charts.evidence.scales.y.min, cusp.charts.evidence.scales.y.max]")  # y fits what is in view
    seen = [e["log_evidence_per_observation"] for m in api for t, e in api[m].items() if zoom[0] <= t <= zoom[1]]
    assert y0 <= min(seen) and max(seen) <= y1 and y1 - y0 < 0.75 * (full_y[1] - full_y[0]), (y0, y1, full_y, seen)
    assert page.eval("cusp.charts.evidence.axes[0].label(cusp.charts.evidence)") == "time (UTC), 2026-11-18"
    for chart in ("evidence", "steps"):  # the change line moved with the zoom and still sits at its time
        assert red_columns(page, chart) == [pytest.approx(chart_x(page, chart, T0 + STEP * CHANGE), abs=1.5)]
    # a result arriving while zoomed in: added, the zoom kept
    assert live.client.post(f"/v1/streams/{s}/chunks", json=timed_chunk(CHUNKS)).status_code == 202
    assert drain(redis_url) == 2
    page.wait_for(f"cusp.series.gaussian.n.length === {CHUNKS + 1} && cusp.series.level.n.length === {CHUNKS + 1}")
    rendered(page)
    assert x_range(page, "evidence") == x_range(page, "steps") == zoom
    # double-click: everything again, the new result included
    mouse(page, "mouseMoved", x1, y)
    for clicks in (1, 2):
        mouse(page, "mousePressed", x1, y, button="left", buttons=1, clickCount=clicks)
        mouse(page, "mouseReleased", x1, y, button="left", buttons=0, clickCount=clicks)
    page.wait_for("cusp.zoom === null")
    rendered(page)
    last = T0 + STEP * ((CHUNKS + 1) * CHUNK - 1)
    assert x_range(page, "evidence") == x_range(page, "steps") == [ends[0], last]
    page.screenshot(tmp_path / "wide.png")

    # a phone's width: the page fits without scrolling sideways, the charts follow, no label overprints another
    try:
        for width in (400, 360):
            page.call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False)
            page.wait_for(f"Object.values(cusp.charts).every((u) => u.width <= {width} - 16 && u.width >= {width} - 60)")
            rendered(page)
            assert page.eval("document.documentElement.scrollWidth") <= width
            boxes = page.eval(LABEL_BOXES)
            for chart in ("evidence", "steps"):
                texts = [b["text"] for b in boxes if b["chart"] == chart]
                assert len(texts) >= 6, texts  # tick labels on both axes, and the x axis' label
            assert overlaps(boxes) == [], boxes
            assert red_columns(page, "evidence") == [pytest.approx(chart_x(page, "evidence", T0 + STEP * CHANGE), abs=1.5)]
            page.screenshot(tmp_path / f"narrow{width}.png")
    finally:
        page.call("Emulation.clearDeviceMetricsOverride")
    print(f"\nlive page screenshots: {tmp_path}")

    # nothing but the service's own URLs (no CDN: the page works offline), and no errors
    resources = page.eval("performance.getEntriesByType('resource').map((e) => e.name)")
    assert any("/assets/uPlot.iife.min.js" in u for u in resources)
    assert all(u.startswith(f"{live.url}/") for u in resources), resources
    html = live.client.get("/").text
    assert not re.search(r"(src|href)=\"(https?:)?//", html) and not re.search(r"https?://", html)
    assert page.errors == []


def test_live_page_with_an_api_key(chromium, redis_url):
    """Behind API keys the page, opened with ?token=, loads its charting library (from /assets/,
    vendored in service/api/static) with the same token, and follows its stream; the library
    answers 401 without a key, and /assets/ serves nothing but the page's files."""
    page = chromium
    page.errors.clear()
    server = LiveServer(redis_url, api_keys="writer-key-9,page-key-1:read")
    try:
        for name, kind in (("uPlot.iife.min.js", "text/javascript"), ("uPlot.min.css", "text/css")):
            assert server.client.get(f"/assets/{name}").status_code == 401
            r = server.client.get(f"/assets/{name}", params={"token": "page-key-1"})
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind) and len(r.content) > 1000
        for name in ("index.html", "swagger-ui.css", "..%2Fapp.py"):
            assert server.client.get(f"/assets/{name}", params={"token": "page-key-1"}).status_code == 404
        s = "keyed" + uuid.uuid4().hex[:8]
        r = server.client.post("/v1/streams", json={"name": s, "columns": ["a"], "models": ["gaussian"]},
                               headers={"Authorization": "Bearer writer-key-9"})
        assert r.status_code == 201, r.text
        page.call("Page.navigate", url=f"{server.url}/?stream={s}&token=page-key-1")
        page.wait_for(f"document.getElementById('status').textContent === 'live: {s}' && Object.keys(cusp.charts).length === 2")
        resources = page.eval("performance.getEntriesByType('resource').map((e) => e.name)")
        assert f"{server.url}/assets/uPlot.iife.min.js?token=page-key-1" in resources
        assert page.errors == []
    finally:
        server.stop()


def untimed_stream(live, redis_url: str, prefix: str, chunks: int):
    """A new stream (a name from ``prefix``) of one model, gaussian, with ``chunks`` result entries
    of 100 rows each, stored as before results had times; (its name, a Redis client)."""
    s = prefix + uuid.uuid4().hex[:8]
    r = live.client.post("/v1/streams", json={"name": s, "columns": ["a"], "models": ["gaussian"]})
    assert r.status_code == 201, r.text
    redis = connect(redis_url)
    for k in range(chunks):
        redis.xadd(keys.out(s), {"model": "gaussian", "kind": "result", "data": json.dumps(
            {"seq": k, "chunk": k, "n": 100 * (k + 1), "rows": 100, "log_evidence": -1.5 * 100 * (k + 1),
             "log_evidence_per_observation": -1.5 + 0.01 * k, "annealing_steps": 0})})
    return s, redis


def test_live_page_without_times(chromium, live, redis_url):
    """A stream whose entries were stored before results had times: the x axis is observations
    (one axis still), the change at its observation, nothing broken."""
    page = chromium
    page.errors.clear()
    s, redis = untimed_stream(live, redis_url, "untimed", 5)
    redis.xadd(keys.out(s), {"model": "*", "kind": "stream_changepoint", "data": json.dumps(
        {"seq": 3, "location": 250, "detected_at": 400, "confidence": 0.99, "support": {"gaussian": [1.0, 0.99]}})})
    page.call("Page.navigate", url=f"{live.url}/?stream={s}")
    page.wait_for(f"document.getElementById('status').textContent === 'live: {s}' && cusp.changepoints.length === 1")
    rendered(page)
    assert page.eval("cusp.timed") is False and page.eval("cusp.charts.evidence.scales.x.time") is False
    assert page.eval("cusp.charts.evidence.axes[0].label(cusp.charts.evidence)") == "observations"
    assert x_range(page, "steps") == [100, 500] and x_range(page, "evidence") == [100, 500]
    assert red_columns(page, "evidence") == [pytest.approx(chart_x(page, "evidence", 250), abs=1.5)]
    assert page.eval("document.querySelector('#cps li.cp').textContent") == "observation 250 (confidence 0.990)"
    assert page.errors == []


def test_live_page_moves_a_withdrawn_change_apart(chromium, live, redis_url):
    """Two stream changes (250, 350) drawn as red dashed lines; a withdrawal of 250 arriving on
    the live feed takes it from the red lines to a grey dotted one, and lists it struck through with
    when it was withdrawn; 350 stays. Reloaded, the page reads the same from /changepoints."""
    page = chromium
    page.errors.clear()
    s, redis = untimed_stream(live, redis_url, "withdrawn", 6)
    # (350's entry says how its columns moved: the list names the three that moved most, as
    # service/detect/moves.py ranks them: a constant column that moved, then by |shift|)
    cols = [{"column": c, "shift": shift, "scale": scale, "mean_before": mb, "mean_after": ma, "sd_before": sb,
             "sd_after": sa, "rows_before": 40, "rows_after": 8}
            for c, shift, scale, mb, ma, sb, sa in (("ms", 0.5, 1.0, 250.0, 260.0, 20.0, 20.0),
                                                    ("rate", 5.25, 1.1, 1.0, 1.21, 0.04, 0.044),
                                                    ("flag", None, None, 0.0, 1.0, 0.0, 0.0))]
    for at, found in ((250, 300), (350, 400)):
        entry = {"model": "*", "kind": "stream_changepoint", "data": json.dumps(
            {"seq": found // 100 - 1, "location": at, "detected_at": found, "confidence": 0.99, "support": {"gaussian": [1.0, 0.99]},
             **({"columns": cols} if at == 350 else {})})}
        redis.xadd(keys.out(s), entry)
        redis.xadd(keys.changes(s), entry)
    page.call("Page.navigate", url=f"{live.url}/?stream={s}")
    page.wait_for(f"document.getElementById('status').textContent === 'live: {s}' && cusp.changepoints.length === 2")
    assert red_columns(page, "evidence") == [pytest.approx(chart_x(page, "evidence", x), abs=1.5) for x in (250, 350)]
    grey = ink(page, "evidence", "#9ca3af")
    entry = {"model": "*", "kind": "stream_changepoint_withdrawn", "data": json.dumps(
        {"seq": 5, "location": 250, "detected_at": 300, "withdrawn_at": 600, "confidence": 0.0123, "support": {"gaussian": [1.0, 0.0123]}})}
    redis.xadd(keys.out(s), entry)
    redis.xadd(keys.changes(s), entry)
    page.wait_for("cusp.changepoints.length === 1 && cusp.withdrawn.length === 1")
    for _ in range(2):  # live, then from a reload
        assert red_columns(page, "evidence") == [pytest.approx(chart_x(page, "evidence", 350), abs=1.5)]
        assert ink(page, "evidence", "#9ca3af") > grey
        items = page.eval("[...document.querySelectorAll('#cps li')].map((li) => li.textContent)")
        # newest first: the withdrawal (at 600) after the change at 350 (found at 400)
        assert items == ["observation 250 withdrawn at observation 600: its probability fell to 0.012",
                         "observation 350 (confidence 0.990); moved most: flag mean 0 → 1, rate +5.25 sd (sd ×1.10), ms +0.50 sd (sd ×1.00)"], items
        assert page.eval("document.querySelector('#cps li s').textContent") == "observation 250"
        page.call("Page.navigate", url=f"{live.url}/?stream={s}")
        page.wait_for(f"document.getElementById('status').textContent === 'live: {s}' && cusp.changepoints.length === 1 "
                      "&& cusp.withdrawn.length === 1")
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

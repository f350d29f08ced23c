"""cusp.AsyncClient, the result WebSocket for both clients, and row times checked by the client
(issue 17 item 3), against a running API: real HTTP and WebSocket, embedded redis-server, a worker
in burst mode, and real TCP connections cut mid-message by a proxy."""

import asyncio
import contextlib
import socket
import threading
from datetime import date, datetime, timedelta, timezone

import numpy as np
import pytest

import cusp
from cusp.times import wire_times
from tests.service_fixtures import LiveServer
from tests.test_client import FaultyProxy, burst, live, name, worker  # noqa: F401 - fixtures

T0 = datetime(2026, 11, 26, 8, 0, tzinfo=timezone.utc)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def values(q: int, n: int = 10) -> list[float]:
    return [float((q * n + i) % 7) for i in range(n)]


async def take(feed, n: int) -> list[dict]:
    """The first n entries of an async feed (fewer if it ends), which is closed then (its connection with it)."""
    out: list[dict] = []
    async with contextlib.aclosing(feed):
        if n > 0:
            async for e in feed:
                out.append(e)
                if len(out) == n:
                    break
    return out


class CuttingProxy:
    """A TCP proxy in front of the API that forwards bytes both ways and records the request line
    each connection opens with. ``cut(path_part, after)``: the next connection whose request line
    holds ``path_part`` is cut after ``after`` bytes of the server's answer, mid-message, as a
    network drops it (no close frame, no end of chunked body)."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.requests: list[str] = []
        self._cut: tuple[str, int] | None = None
        self.was_cut = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self, path_part: str, after: int) -> None:
        self._cut = (path_part, after)

    def feeds(self, path_part: str) -> list[str]:
        return [line for line in self.requests if path_part in line]

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket):
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        head = client.recv(65536)
        line = head.split(b"\r\n", 1)[0].decode(errors="replace")
        self.requests.append(line)
        budget = None
        if self._cut and self._cut[0] in line:
            budget, self._cut = self._cut[1], None
        upstream.sendall(head)
        threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
        self._pump(upstream, client, budget)

    def _pump(self, src: socket.socket, dst: socket.socket, budget: int | None):
        try:
            while data := src.recv(65536):
                if budget is not None and len(data) >= budget:
                    dst.sendall(data[:budget])
                    break
                if budget is not None:
                    budget -= len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            if budget is not None:
                self.was_cut.set()

    def close(self):
        self.sock.close()


@pytest.fixture
def tcp_proxy(live):  # noqa: F811
    p = CuttingProxy(live.port)
    yield p
    p.close()


@pytest.fixture
def proxy(live):  # noqa: F811
    p = FaultyProxy(live.url)
    yield p
    p.close()


def stored_stream(live, worker, chunks: int = 6) -> tuple[str, list[dict]]:  # noqa: F811
    """A stream with two models and ``chunks`` chunks processed; its entries as stored."""
    s = name()
    with cusp.Client(live.url) as c:
        c.create_stream(s, ["a"], models=["level", "ar"])
        for q in range(chunks):
            c.post(s, values(q))
        burst(worker)
        return s, list(c.results(s))


# --- AsyncClient ------------------------------------------------------------------------------
def test_async_client_create_post_results_changepoints_delete(live, worker):  # noqa: F811
    x = np.concatenate([np.random.default_rng(3).normal(0, 1, 200), np.random.default_rng(4).normal(4, 1, 200)]).round(4)

    async def main():
        s = name()
        async with cusp.AsyncClient(live.url, backoff=0.01) as c:
            info = await c.create_stream(s, ["ms"], models=["level", "ar"])
            assert info["name"] == s and info["next_seq"] == 0
            # gathered posts to one stream go one at a time, in the order they were called
            stamps = np.datetime64("2026-11-26T08:00:00") + np.arange(400) * np.timedelta64(15, "s")  # UTC
            acks = await asyncio.gather(*(c.post(s, x[lo : lo + 20], times=stamps[lo : lo + 20]) for lo in range(0, 400, 20)))
            assert [a["seq"] for a in acks] == list(range(20)) and {a["status"] for a in acks} == {"accepted"}
            assert (await c.post(s, x[:20], seq=0, times=stamps[:20]))["status"] == "duplicate"
            with pytest.raises(cusp.ConflictError) as err:  # the same rows without their times are other data
                await c.post(s, x[:20], seq=0)
            assert err.value.code == "seq_conflict"
            assert await c.next_seq(s) == 20
            # a live feed opened before the results exist gets them as the worker makes them
            live_feed = asyncio.create_task(take(c.results(s, follow=True, transport="ws", kind="result"), 40))
            await asyncio.sleep(0.2)
            assert await asyncio.to_thread(burst, worker) == 40
            stored = [e async for e in c.results(s)]
            got = await live_feed
            assert [e["id"] for e in got] == [e["id"] for e in stored if e["kind"] == "result"]
            assert [e["seq"] async for e in c.results(s, model="ar", kind="result")] == list(range(20))
            since = stored[10]["id"]
            assert [e["id"] async for e in c.results(s, since=since)] == [e["id"] for e in stored[11:]]
            over_sse = await take(c.results(s, follow=True), len(stored))
            assert over_sse == stored
            cps = await c.changepoints(s)
            assert [p["location"] for p in cps["stream"]] == [200]
            assert cps["stream"][0]["location_time"] == "2026-11-26T08:50:00.000000Z"  # row 200: 50 minutes in
            assert [(e["time_start"], e["time_end"]) for e in got if e["seq"] == 1] == [
                ("2026-11-26T08:05:00.000000Z", "2026-11-26T08:09:45.000000Z")] * 2  # chunk 1, both models
            assert [e["location"] for e in stored if e["kind"] == "stream_changepoint"] == [200]
            assert (await c.wait(s))["models"][0]["observations"] == 400
            assert s in await c.streams()
            # a feed that follows the stream ends when the stream is deleted
            following = asyncio.create_task(take(c.results(s, since=stored[-1]["id"], follow=True, transport="ws"), 1))
            await asyncio.sleep(0.3)
            await c.delete_stream(s)
            assert await asyncio.wait_for(following, 10) == []
            with pytest.raises(cusp.NotFoundError, match=f"no stream named '{s}'") as err:
                await c.stream(s)
            assert err.value.status == 404 and err.value.code == "stream_not_found"

    run(main())


def test_async_client_errors_carry_the_server_problem(live):  # noqa: F811
    async def main():
        s = name()
        async with cusp.AsyncClient(live.url, backoff=0.0) as c:
            await c.create_stream(s, ["a", "b"], models=["gaussian"])
            for call, kind, code, message in [
                (c.post(s, [[1.0, 2.0]], seq=3), cusp.ConflictError, "seq_gap", "out of order: expected seq 0"),
                (c.post(s, [[1.0, 2.0, 3.0]]), cusp.InvalidRequestError, "invalid_rows", "the stream has 2 columns"),
                (c.create_stream(name(), ["a"], models=["nope"]), cusp.InvalidRequestError, "invalid_model", "unknown model"),
                (c.create_stream(s, ["a", "b"], models=["gaussian"]), cusp.ConflictError, "stream_exists", s),
                (c.changepoints(name()), cusp.NotFoundError, "stream_not_found", "no stream named"),
            ]:
                with pytest.raises(kind, match=message) as err:
                    await call
                assert err.value.code == code
            with pytest.raises(cusp.InputError, match="rows\\[0\\]\\[1\\] is inf"):
                await c.post(s, [[1.0, float("inf")]])
            with pytest.raises(cusp.InputError, match="transport must be 'sse' or 'ws'"):
                c.results(s, follow=True, transport="grpc")
            assert (await c.stream(s))["next_seq"] == 0  # nothing stored
            await c.delete_stream(s)
        async with cusp.AsyncClient("http://127.0.0.1:9", retries=1, backoff=0.0) as dead:
            with pytest.raises(cusp.ServerUnavailable, match="ConnectError"):
                await dead.streams()
            with pytest.raises(cusp.ServerUnavailable, match="evidence/ws: .*after 2 attempts"):
                await take(dead.results("s", follow=True, transport="ws"), 1)

    run(main())


def test_async_client_retries_lost_answers_with_the_same_seq(live, proxy, worker):  # noqa: F811
    async def main():
        s = name()
        async with cusp.AsyncClient(proxy.url, backoff=0.01) as c:
            proxy.drop["/v1/streams"] = 1  # created, the answer lost: the retry finds it there
            assert (await c.create_stream(s, ["a"], models=["level"]))["name"] == s
            proxy.drop["/chunks"] = 1  # stored, the answer lost: the resend (same times) is a duplicate
            proxy.busy["/chunks"] = 1
            assert await c.post(s, [1.0, 2.0, 3.0], times=[T0, "2026-11-26T09:00:01+01:00", T0.timestamp() + 2]) == \
                   {"seq": 0, "status": "duplicate", "id": "chunk-0"}
            assert (await c.post(s, [4.0, 5.0]))["seq"] == 1
            burst(worker)
            stored = [e async for e in c.results(s)]
            proxy.cut_sse = 1  # the SSE feed drops after its first event: resumed with Last-Event-ID
            got = await take(c.results(s, follow=True), len(stored))
            assert [e["id"] for e in got] == [e["id"] for e in stored]
            assert [last for _, p, last in proxy.seen if p.endswith("/evidence/sse")] == [None, stored[0]["id"]]
            await c.delete_stream(s)

    run(main())


# --- results over the WebSocket -----------------------------------------------------------------
def test_ws_feed_resumes_from_the_last_id_after_leaving_the_loop(live, worker):  # noqa: F811
    s, stored = stored_stream(live, worker)
    ids = [e["id"] for e in stored]
    with cusp.Client(live.url) as c:
        feed = c.results(s, follow=True, transport="ws")
        first = [next(feed) for _ in range(5)]
        feed.close()
        rest = c.results(s, since=first[-1]["id"], follow=True, transport="ws")
        second = [next(rest) for _ in range(len(stored) - 5)]
        rest.close()
        assert [e["id"] for e in first + second] == ids  # nothing missed, nothing twice
        assert first + second == stored  # the feed's entries are the pages' entries
        ar = c.results(s, follow=True, transport="ws", model="ar")
        assert [next(ar)["id"] for _ in range(6)] == [e["id"] for e in stored if e["model"] == "ar"]
        ar.close()

    async def main():
        async with cusp.AsyncClient(live.url) as c:
            first = await take(c.results(s, follow=True, transport="ws"), 7)
            second = await take(c.results(s, since=first[-1]["id"], follow=True, transport="ws"), len(stored) - 7)
            assert [e["id"] for e in first + second] == ids

    run(main())


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_ws_feed_reconnects_after_a_dropped_connection(live, worker, tcp_proxy, flavour):  # noqa: F811
    """The connection is cut mid-frame by a real TCP proxy; the client reconnects with
    ?since=<the last entry it got> and every entry arrives once, in order."""
    s, stored = stored_stream(live, worker, chunks=8)
    ids = [e["id"] for e in stored]
    tcp_proxy.cut("/evidence/ws", 1800)  # the handshake and a few entries, then the middle of one
    if flavour == "sync":
        with cusp.Client(tcp_proxy.url, backoff=0.01) as c:
            feed = c.results(s, follow=True, transport="ws")
            got = [next(feed) for _ in stored]
            feed.close()
    else:
        async def main():
            async with cusp.AsyncClient(tcp_proxy.url, backoff=0.01) as c:
                return await take(c.results(s, follow=True, transport="ws"), len(stored))

        got = run(main())
    assert [e["id"] for e in got] == ids
    opened = tcp_proxy.feeds("/evidence/ws")
    assert len(opened) == 2 and "since=" not in opened[0], opened
    resumed_from = opened[1].split("since=")[1].split()[0]
    assert resumed_from in ids[:-1], opened  # mid-way: the last entry received before the cut


@pytest.mark.parametrize("transport", ["sse", "ws"])
def test_a_feed_ends_when_the_stream_is_deleted_while_it_reconnects(live, worker, tcp_proxy, transport):  # noqa: F811
    s, stored = stored_stream(live, worker, chunks=8)
    tcp_proxy.cut(f"/evidence/{transport}", 1800)
    got: list[dict] = []
    with cusp.Client(tcp_proxy.url, backoff=1.0) as c:
        reader = threading.Thread(target=lambda: got.extend(c.results(s, follow=True, transport=transport)))
        reader.start()
        assert tcp_proxy.was_cut.wait(10)
        assert live.client.delete(f"/v1/streams/{s}").status_code == 204  # before the client's backoff is over
        reader.join(15)
        assert not reader.is_alive()
    assert 0 < len(got) < len(stored) and [e["id"] for e in got] == [e["id"] for e in stored[: len(got)]]
    assert len(tcp_proxy.feeds(f"/evidence/{transport}")) == 2  # refused as 404 the second time: the end


def test_ws_refusals_raise_the_http_error(live, worker):  # noqa: F811
    """The WebSocket refuses with close code 1008 and a reason; the client raises the APIError (and
    code) that the same read over HTTP answers."""
    s, stored = stored_stream(live, worker, chunks=1)
    with cusp.Client(live.url, retries=0) as c:
        with pytest.raises(cusp.NotFoundError, match="no stream named 'nope1'") as err:
            next(c.results("nope1", follow=True, transport="ws"))
        assert err.value.code == "stream_not_found"
        assert str(err.value).startswith("GET /v1/streams/nope1/evidence/ws: 404")  # the feed opened, not the read behind
        with pytest.raises(cusp.InvalidRequestError, match="chunk's ack id") as err:
            next(c.results(s, since="chunk-0", follow=True, transport="ws"))
        assert err.value.code == "invalid_since" and err.value.path.endswith("/evidence/ws")
        with pytest.raises(cusp.InputError, match="since must be a result id"):
            c.results(s, since=5, follow=True, transport="ws")
        with pytest.raises(cusp.InputError, match="kind must be one of"):
            c.results(s, kind="results")


def test_api_keys_on_the_websocket(redis_url):
    server = LiveServer(redis_url, api_keys="writer-key-2,reader-key-2:read")
    try:
        s = name()

        async def main():
            async with cusp.AsyncClient(server.url, api_key="writer-key-2") as w, \
                    cusp.AsyncClient(server.url, api_key="reader-key-2", retries=0) as r, \
                    cusp.AsyncClient(server.url, retries=0) as anon:
                await w.create_stream(s, ["a"], models=["level"])
                with pytest.raises(cusp.AuthenticationError, match="403: this API key is read-only") as err:
                    await r.post(s, [1.0])
                assert err.value.code == "read_only_key"
                # the key goes as a header, on the WebSocket too: no entries yet, so the feed waits
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(take(r.results(s, follow=True, transport="ws"), 1), 1.0)
                with pytest.raises(cusp.AuthenticationError, match="401: missing or unknown API key") as err:
                    await take(anon.results(s, follow=True, transport="ws"), 1)
                assert err.value.code == "unauthorized"
                await w.delete_stream(s)

        run(main())
    finally:
        server.stop()


# --- row times, checked before anything is sent -------------------------------------------------
def test_times_become_what_the_service_reads():
    plus2 = timezone(timedelta(hours=2))
    assert wire_times([T0, datetime(2026, 11, 26, 10, 0, 1, 250000, tzinfo=plus2)], 2) == [
        "2026-11-26T08:00:00.000000Z", "2026-11-26T08:00:01.250000Z"]
    assert wire_times(["2026-11-26", "2026-11-26T00:00:01+00:00", 1795651202, 1795651202.5, date(2026, 11, 27)], 5) == [
        "2026-11-26", "2026-11-26T00:00:01+00:00", 1795651202, 1795651202.5, "2026-11-27"]
    stamps = np.array(["2026-11-26T08:00:00", "2026-11-26T08:00:00.000001"], dtype="datetime64[ns]")
    assert wire_times(stamps, 2) == ["2026-11-26T08:00:00.000000Z", "2026-11-26T08:00:00.000001Z"]  # numpy: UTC
    assert wire_times(list(stamps), 2) == wire_times(stamps, 2)
    assert cusp.parse_time("2026-11-26T00:21:24.123456Z") == datetime(2026, 11, 26, 0, 21, 24, 123456, tzinfo=timezone.utc)
    assert cusp.parse_time(None) is None
    pd = pytest.importorskip("pandas")
    index = pd.date_range("2026-11-26 09:00", periods=3, freq="min", tz="Europe/Berlin")
    assert wire_times(index, 3) == ["2026-11-26T08:00:00.000000Z", "2026-11-26T08:01:00.000000Z", "2026-11-26T08:02:00.000000Z"]
    assert wire_times(pd.Series(index), 3) == wire_times(index, 3) == wire_times(list(index), 3)


def test_bad_times_raise_before_anything_is_sent(live, proxy):  # noqa: F811
    s = name()
    live.client.post("/v1/streams", json={"name": s, "columns": ["a"], "models": ["level"]})
    naive = datetime(2026, 11, 26, 8, 0)
    cases = [
        ([naive, naive + timedelta(1)], "times\\[0\\]: .* is a naive datetime; give it a time zone"),
        (["2026-11-26T08:00:00"] * 2, "times\\[0\\]: '2026-11-26T08:00:00' has no UTC offset"),
        (["yesterday", T0], "times\\[0\\]: 'yesterday' is not an RFC 3339 time"),
        ([T0, T0], "times\\[1\\] repeats times\\[0\\]"),
        ([T0, T0 - timedelta(seconds=1)], "times\\[1\\] is before times\\[0\\]"),
        ([T0], "times has 1 entries for 2 rows"),
        ([T0, True], "times\\[1\\]: True is not a time"),
        ([0, float("nan")], "times\\[1\\]: nan epoch seconds is not a time"),
        ([0, 1e12], "times\\[1\\]: 1000000000000.0 epoch seconds is not a time between the years 1 and 9999 \\(epoch milliseconds"),
        (np.array(["2026-11-26", "NaT"], dtype="datetime64[s]"), "times\\[1\\] is NaT"),
        ("2026-11-26", "times must be a list with one time per row"),
    ]
    pd = pytest.importorskip("pandas")
    cases.append((pd.date_range("2026-11-26", periods=2, freq="h"), "tz-naive DatetimeIndex: say its zone first"))
    with cusp.Client(proxy.url) as c:
        for times, message in cases:
            with pytest.raises(cusp.InputError, match=message) as err:
                c.post(s, [1.0, 2.0], times=times)
            assert isinstance(err.value, ValueError)

        async def main():
            async with cusp.AsyncClient(proxy.url) as a:
                with pytest.raises(cusp.InputError, match="naive datetime"):
                    await a.post(s, [1.0, 2.0], times=[naive, naive + timedelta(1)])
                with pytest.raises(cusp.InputError, match="naive datetime"):
                    await a.detect([1.0, 2.0], times=[naive, naive + timedelta(1)])

        run(main())
    assert proxy.seen == []  # not a request went out
    assert live.client.get(f"/v1/streams/{s}").json()["next_seq"] == 0


# --- row times, end to end ----------------------------------------------------------------------
def test_times_round_trip_in_every_form(live, worker):  # noqa: F811
    """Times sent as datetimes, RFC 3339 strings with offsets, epoch seconds, datetime64 and (if
    installed) a pandas DatetimeIndex come back as the same instants: each result's first and last
    row, each change point's location and detection; the service's own refusal of times before the
    stream's last is a ConflictError with its code, and the count goes on after it."""
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.normal(0, 1, 200), rng.normal(4, 1, 200)]).round(4)
    stamps = [T0 + timedelta(minutes=i, microseconds=7) for i in range(400)]
    try:
        import pandas as pd
    except ImportError:
        pd = None
    forms = [
        lambda t: t,
        lambda t: [d.astimezone(timezone(timedelta(hours=-5))).isoformat() for d in t],
        lambda t: [d.timestamp() for d in t],
        lambda t: np.array([d.replace(tzinfo=None) for d in t], dtype="datetime64[us]"),
        lambda t: pd.DatetimeIndex(t).tz_convert("Asia/Kolkata") if pd is not None else t,
    ]
    s = name()
    with cusp.Client(live.url) as c:
        c.create_stream(s, ["ms"], models=["level", "ar"])
        for q, lo in enumerate(range(0, 400, 20)):
            c.post(s, x[lo : lo + 20], times=forms[q % len(forms)](stamps[lo : lo + 20]))
        burst(worker)
        results = [e for e in c.results(s) if e["kind"] == "result"]
        assert [(cusp.parse_time(e["time_start"]), cusp.parse_time(e["time_end"])) for e in results] == \
               [(stamps[e["seq"] * 20], stamps[e["seq"] * 20 + 19]) for e in results]
        cps = c.changepoints(s)
        assert [p["location"] for p in cps["stream"]] == [200]
        for p in cps["stream"] + cps["changepoints"]:
            where, when = cusp.parse_time(p["location_time"]), cusp.parse_time(p["detected_time"])
            assert (where, when) == (stamps[p["location"]], stamps[p["detected_at"] - 1])
            assert p["delay_seconds"] == pytest.approx((when - where).total_seconds(), abs=1e-6)
        with pytest.raises(cusp.ConflictError, match="time") as err:
            c.post(s, [1.0], times=[stamps[-1]])  # not after the stream's last time
        assert err.value.code == "time_order"
        assert c.post(s, [1.0], times=[stamps[-1] + timedelta(seconds=1)])["seq"] == 20
        assert c.post(s, [2.0])["seq"] == 21  # no times: the service stamps the arrival, after the last
        burst(worker)
        last = [e for e in c.results(s, model="level", kind="result")][-1]
        # its arrival time, but not before the stream's last time, which is in this machine's future here
        assert cusp.parse_time(last["time_start"]) == cusp.parse_time(last["time_end"]) >= stamps[-1] + timedelta(seconds=1)
        c.delete_stream(s)

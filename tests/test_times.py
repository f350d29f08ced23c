"""Time (issue 17 item 2): rows may carry timestamps in every ingest format; without them the
arrival time is used; results and change points carry both indices and times; times out of order
get a clear 4xx and store nothing. Real Redis, real HTTP, real workers (burst mode)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from websockets.sync.client import connect as ws_connect

from service import times as T
from tests.service_fixtures import LiveServer, drain

DAY = 86400.0
START = datetime(2021, 3, 1, tzinfo=timezone.utc)


def iso(d: datetime) -> str:
    return d.strftime("%Y-%m-%dT%H:%M:%SZ")


# --- parsing and formatting (service.times) ----------------------------------------------------
@pytest.mark.parametrize("given, want", [
    ("2026-11-26T08:00:00Z", 1795680000.0),
    ("2026-11-26T09:00:00+01:00", 1795680000.0),
    ("2026-11-26T08:00:00.250Z", 1795680000.25),
    ("2026-11-26", 1795651200.0),  # a date: midnight UTC
    ("1871-01-01", -3124137600.0),  # before 1970: negative epoch seconds (the Nile's first year)
    (1795680000, 1795680000.0),
    (-1.5, -1.5),
])
def test_parse(given, want):
    assert T.parse(given, "t") == want


@pytest.mark.parametrize("given, says", [
    ("2026-11-26T08:00:00", "no UTC offset"),
    ("26/11/2026", "not an RFC 3339 time"),
    ("", "not an RFC 3339 time"),
    (True, "not a time"),
    (None, "not a time"),
    (1e300, "between the years 1 and 9999"),
    (float("nan"), "between the years 1 and 9999"),
])
def test_parse_refuses(given, says):
    with pytest.raises(T.TimeError, match=says):
        T.parse(given, "t")


def test_a_leap_second_is_the_second_after_59():
    """RFC 3339 allows 23:59:60 (a new user's trial saw it refused); epoch seconds do not count it."""
    assert T.parse("2016-12-31T23:59:60Z", "t") == T.parse("2016-12-31T23:59:59Z", "t") + 1.0
    assert T.parse("2016-12-31T23:59:60.25+00:00", "t") == T.parse("2017-01-01T00:00:00.25Z", "t")
    with pytest.raises(T.TimeError, match="not an RFC 3339 time"):
        T.parse("2016-12-31T23:58:61Z", "t")


def test_format_round_trips_microseconds():
    for x in (0.0, 1795680000.123456, -3124137600.0, T.EARLIEST, T.LATEST):
        s = T.format(x)
        assert s.endswith("Z") and abs(datetime.fromisoformat(s).timestamp() - x) < 1e-6, (x, s)
    assert T.format(T.EARLIEST) == "0001-01-01T00:00:00.000000Z"


def test_parse_all_names_the_row_at_fault():
    with pytest.raises(T.TimeError, match=r"time\[2\] repeats time\[1\]"):
        T.parse_all([1, 2, 2], 3)
    with pytest.raises(T.TimeError, match=r"time\[1\] is before time\[0\] \(time\[1\] = [0-9T:.-]+Z, time\[0\] = "):
        T.parse_all(["2026-01-02", "2026-01-01"], 2)
    with pytest.raises(T.TimeError, match="2 entries for 3 rows"):
        T.parse_all([1, 2], 3)


# --- the service ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url)
    server.redis_url = redis_url
    yield server
    server.stop()


def create(live, name: str, columns=("v",), models=("gaussian",)) -> str:
    """A new stream named ``name`` plus a unique suffix (the module shares one Redis); its name."""
    name = f"{name}-{uuid.uuid4().hex[:8]}"
    r = live.client.post("/v1/streams", json={"name": name, "columns": list(columns), "models": list(models), "seed": 3})
    assert r.status_code == 201, r.text
    return name


def results(live, name: str) -> list[dict]:
    return [e for e in live.client.get(f"/v1/streams/{name}/evidence?kind=result&limit=1000").json()["results"]]


def test_every_format_carries_times(live):
    """JSON rows (field time), JSON columns (columns['time']), NDJSON (a time key), CSV (a time
    column, anywhere in the header) and raw float64 (?times=first): each chunk's result carries
    the times of its first and last rows as given."""
    fmt = create(live, "fmt", columns=("a", "b"))
    days = [START + timedelta(days=i) for i in range(10)]
    post = live.client.post
    assert post(f"/v1/streams/{fmt}/chunks", json={"seq": 0, "rows": [[1, 2], [3, 4]], "time": [iso(days[0]), iso(days[1])]}).status_code == 202
    r = post(f"/v1/streams/{fmt}/chunks", json={"seq": 1, "columns": {"a": [1, 2], "b": [3, 4], "time": [iso(days[2]), days[3].timestamp()]}})
    assert r.status_code == 202, r.text
    nd = "\n".join(json.dumps({"time": iso(d), "a": 1.0, "b": 2.0}) for d in days[4:6])
    r = post(f"/v1/streams/{fmt}/chunks?seq=2", content=nd, headers={"content-type": "application/x-ndjson"})
    assert r.status_code == 202, r.text
    csv = f"b,time,a\n2,{iso(days[6])},1\n4,{days[7].date().isoformat()},3\n"
    r = post(f"/v1/streams/{fmt}/chunks?seq=3", content=csv, headers={"content-type": "text/csv"})
    assert r.status_code == 202, r.text
    raw = np.array([[days[8].timestamp(), 1.0, 2.0], [days[9].timestamp(), 3.0, 4.0]]).astype("<f8").tobytes()
    r = post(f"/v1/streams/{fmt}/chunks?seq=4&times=first", content=raw, headers={"content-type": "application/octet-stream"})
    assert r.status_code == 202, r.text
    drain(live.redis_url)
    got = [(e["seq"], e["time_start"], e["time_end"]) for e in results(live, fmt)]
    want = [(q, T.format(days[2 * q].timestamp()), T.format(days[2 * q + 1].timestamp())) for q in range(5)]
    assert got == want
    # the CSV's columns were reordered by name: the values are a = 1, 3 and b = 2, 4 as in the other chunks
    assert [e["n"] for e in results(live, fmt)] == [2, 4, 6, 8, 10]
    info = live.client.get(f"/v1/streams/{fmt}").json()
    assert (info["rows"], info["first_time"], info["last_time"]) == (10, T.format(days[0].timestamp()), T.format(days[9].timestamp()))


def test_without_times_rows_get_the_arrival_time(live):
    arrive = create(live, "arrive")
    before = time.time()
    assert live.client.post(f"/v1/streams/{arrive}/chunks", json={"seq": 0, "rows": [[1.0], [2.0]]}).status_code == 202
    after = time.time()
    drain(live.redis_url)
    (e,) = results(live, arrive)
    t = datetime.fromisoformat(e["time_start"]).timestamp()
    assert e["time_start"] == e["time_end"] and before - 1e-3 <= t <= after + 1e-3


def test_arrival_time_never_goes_back(live):
    """Times given in the future (within CUSP_MAX_TIME_AHEAD_SECONDS), then a chunk without: its
    rows get the stream's last time, not the (earlier) clock, so the stream's times never decrease."""
    future = create(live, "future")
    ahead = time.time() + 0.5 * DAY
    assert live.client.post(f"/v1/streams/{future}/chunks", json={"seq": 0, "rows": [[1.0]], "time": [ahead]}).status_code == 202
    assert live.client.post(f"/v1/streams/{future}/chunks", json={"seq": 1, "rows": [[2.0]]}).status_code == 202
    drain(live.redis_url)
    assert [e["time_end"] for e in results(live, future)] == [T.format(ahead)] * 2


def test_a_time_far_ahead_of_the_clock_is_refused_and_stores_nothing(live):
    """One time far in the future (a new user's 9999-12-31) was accepted, and then every correct
    time after it was refused (409 time_order) until the stream was deleted. Now refused itself,
    naming it; a time within the day ahead is taken."""
    far = create(live, "far")
    for when in ("9999-12-31T00:00:00Z", time.time() + 2 * DAY):
        r = live.client.post(f"/v1/streams/{far}/chunks", json={"seq": 0, "rows": [[1.0], [2.0]], "time": [time.time(), when]})
        assert (r.status_code, r.json()["code"]) == (422, "invalid_time"), r.text
        assert "time[1]" in r.json()["detail"] and "CUSP_MAX_TIME_AHEAD_SECONDS=86400" in r.json()["detail"]
    now = time.time()
    assert live.client.post(f"/v1/streams/{far}/chunks", json={"seq": 0, "rows": [[1.0]], "time": [now]}).status_code == 202
    assert live.client.post(f"/v1/streams/{far}/chunks", json={"seq": 1, "rows": [[1.0]], "time": [now + 0.9 * DAY]}).status_code == 202


@pytest.mark.parametrize("body, status, code, says", [
    ({"seq": 0, "rows": [[1.0], [2.0]], "time": ["2021-03-02T00:00:00Z", "2021-03-01T00:00:00Z"]}, 422, "invalid_time", r"time\[1\] is before"),
    ({"seq": 0, "rows": [[1.0], [2.0]], "time": ["2021-03-02T00:00:00Z"]}, 422, "invalid_time", "1 entries for 2 rows"),
    ({"seq": 0, "rows": [[1.0]], "time": ["2021-03-02 00:00:00"]}, 422, "invalid_time", "no UTC offset"),
    ({"seq": 0, "rows": [[1.0]], "time": ["2021-03-02 00:00Z"]}, 422, "invalid_time", "not an RFC 3339 time"),
    ({"seq": 0, "rows": [[1.0]], "time": "2021-03-02T00:00:00Z"}, 422, "invalid_time", "one time per row"),
    ({"seq": 0, "columns": {"v": [1.0], "time": [1.0]}, "time": [1.0]}, 422, "invalid_time", "given twice"),
])
def test_bad_times_are_refused_and_store_nothing(live, body, status, code, says):
    bad = create(live, "bad")
    r = live.client.post(f"/v1/streams/{bad}/chunks", json=body)
    assert r.status_code == status and r.json()["code"] == code, r.text
    assert __import__("re").search(says, r.json()["detail"]), r.json()["detail"]
    # nothing stored: seq 0 is still the next one, and its time may be anything
    r = live.client.post(f"/v1/streams/{bad}/chunks", json={"seq": 0, "rows": [[1.0]], "time": ["1999-01-01"]})
    assert r.status_code == 202, r.text


def test_other_formats_refuse_bad_times(live):
    badfmt = create(live, "badfmt")
    post = live.client.post
    nd = json.dumps({"time": 1.0, "v": 1.0}) + "\n" + json.dumps({"v": 2.0}) + "\n"
    r = post(f"/v1/streams/{badfmt}/chunks?seq=0", content=nd, headers={"content-type": "application/x-ndjson"})
    assert (r.status_code, r.json()["code"]) == (422, "invalid_time") and "line 2" in r.json()["detail"], r.text
    r = post(f"/v1/streams/{badfmt}/chunks?seq=0", content="time,v\n2021-03-01,1\nyesterday,2\n", headers={"content-type": "text/csv"})
    assert (r.status_code, r.json()["code"]) == (422, "invalid_time") and "time[1]" in r.json()["detail"], r.text
    raw = np.array([[5.0, 1.0], [4.0, 2.0]]).astype("<f8").tobytes()
    r = post(f"/v1/streams/{badfmt}/chunks?seq=0&times=first", content=raw, headers={"content-type": "application/octet-stream"})
    assert (r.status_code, r.json()["code"]) == (422, "invalid_time"), r.text
    # a header-less CSV of dates and values: its first row is data, not a header with an extra column
    for body in ("2021-03-01,1\n2021-03-02,2\n", "2021-03-01T00:00:00Z,1\n", "1,2021-03-01 00:00:00\n"):
        r = post(f"/v1/streams/{badfmt}/chunks?seq=0", content=body, headers={"content-type": "text/csv"})
        assert (r.status_code, r.json()["code"]) == (422, "invalid_time"), r.text
        assert "is a time and values, with no header" in r.json()["detail"] and "time,v" in r.json()["detail"], r.text
    # columns named by dates: their header is a header (a review: refused as "a time and values")
    dated = create(live, "dated", columns=("2021-01-01", "2021-01-02"))
    r = post(f"/v1/streams/{dated}/chunks?seq=0", content="2021-01-01,2021-01-02\n1,2\n", headers={"content-type": "text/csv"})
    assert r.status_code == 202, r.text
    r = post(f"/v1/streams/{badfmt}/chunks?seq=0&times=first", content="v\n1\n", headers={"content-type": "text/csv"})
    assert (r.status_code, r.json()["code"]) == (422, "invalid_time") and "octet-stream" in r.json()["detail"], r.text
    r = post(f"/v1/streams/{badfmt}/chunks?seq=0&times=last", content=raw, headers={"content-type": "application/octet-stream"})
    assert r.status_code == 422, r.text
    assert post(f"/v1/streams/{badfmt}/chunks", json={"seq": 0, "rows": [[1.0]]}).status_code == 202


def test_times_must_follow_the_streams_last(live):
    """A chunk whose first time is not after the stream's last time: 409 time_order, naming both;
    nothing stored (the same seq with later times is then accepted). A resend with the same times
    is a duplicate; with other times, a conflict."""
    order = create(live, "order")
    post = live.client.post
    first = {"seq": 0, "rows": [[1.0], [2.0]], "time": ["2021-03-01T00:00:00Z", "2021-03-02T00:00:00Z"]}
    assert post(f"/v1/streams/{order}/chunks", json=first).status_code == 202
    r = post(f"/v1/streams/{order}/chunks", json={"seq": 1, "rows": [[3.0]], "time": ["2021-03-02T00:00:00Z"]})
    assert (r.status_code, r.json()["code"]) == (409, "time_order"), r.text
    assert "2021-03-02T00:00:00.000000Z" in r.json()["detail"]
    assert post(f"/v1/streams/{order}/chunks", json={"seq": 1, "rows": [[3.0]], "time": ["2021-03-03"]}).status_code == 202
    assert post(f"/v1/streams/{order}/chunks", json=first).status_code == 200  # the same chunk again: duplicate
    r = post(f"/v1/streams/{order}/chunks", json={**first, "time": ["2021-03-01T00:00:00Z", "2021-03-02T00:00:01Z"]})
    assert (r.status_code, r.json()["code"]) == (409, "seq_conflict"), r.text
    r = post(f"/v1/streams/{order}/chunks", json={"seq": 0, "rows": [[1.0], [2.0]]})
    assert (r.status_code, r.json()["code"]) == (409, "seq_conflict"), r.text


def test_websocket_ingest_takes_times(live):
    wsin = create(live, "wsin")
    with ws_connect(f"{live.ws_url}/v1/streams/{wsin}/ingest") as ws:
        ws.send(json.dumps({"seq": 0, "rows": [[1.0]], "time": ["2021-03-01"]}))
        assert json.loads(ws.recv(timeout=10))["status"] == "accepted"
        ws.send(json.dumps({"seq": 1, "rows": [[1.0]], "time": ["2021-02-01"]}))
        err = json.loads(ws.recv(timeout=10))
        assert (err["code"], err["error"]) == (409, "time_order"), err
    drain(live.redis_url)
    assert [e["time_end"] for e in results(live, wsin)] == ["2021-03-01T00:00:00.000000Z"]


def test_change_points_carry_times(live):
    """Daily data with a jump of 6 sd at day 300, in chunks of 25 days: the model's event and the
    stream's change point carry location_time (the day of the row at location), detected_time (the
    last day of the chunk that reported it) and their difference as delay_seconds; the indices
    are as before."""
    jump = create(live, "jump")
    g = np.random.default_rng(5)
    x = g.normal(0.0, 1.0, 600) + np.where(np.arange(600) >= 300, 6.0, 0.0)
    day = [START.timestamp() + i * DAY for i in range(600)]
    for seq, lo in enumerate(range(0, 600, 25)):
        r = live.client.post(f"/v1/streams/{jump}/chunks", json={"seq": seq, "rows": x[lo:lo + 25, None].tolist(), "time": day[lo:lo + 25]})
        assert r.status_code == 202, r.text
    drain(live.redis_url)
    got = live.client.get(f"/v1/streams/{jump}/changepoints").json()
    assert got["changepoints"] and got["stream"], got
    for c in got["changepoints"] + got["stream"]:
        assert abs(c["location"] - 300) <= 25, c
        assert c["location_time"] == T.format(day[c["location"]]), c
        assert c["detected_time"] == T.format(day[c["detected_at"] - 1]), c
        assert c["delay_seconds"] == pytest.approx(day[c["detected_at"] - 1] - day[c["location"]]), c
    ev = got["changepoints"][0]
    assert ev["location"] == ev["seq"] * 25 + ev["row"], ev


# --- expected_run_length as a duration -----------------------------------------------------------
@pytest.mark.parametrize("given, seconds", [("30d", 30 * DAY), ("12h", 43200.0), ("PT12H", 43200.0), ("P1DT6H", 108000.0),
                                            ("2w", 14 * DAY), ("10y", 10 * 365.25 * DAY), ("90m", 5400.0)])
def test_durations(given, seconds):
    assert T.parse_duration(given) == seconds


@pytest.mark.parametrize("given", ["30", "P1Y", "P1M", "0d", "1 day", "PT", "", "-5d"])
def test_bad_durations(given):
    with pytest.raises(T.TimeError, match="duration"):
        T.parse_duration(given)


def test_detector_config_takes_a_duration_or_observations():
    from service.detect import DetectorConfig
    from service.sgais import ConfigError

    assert DetectorConfig(expected_run_length="30d").run_length_seconds == 30 * DAY
    assert DetectorConfig(expected_run_length=500).run_length_seconds is None
    with pytest.raises(ConfigError, match="expected_run_length.*'30 parsecs' is not a duration"):
        DetectorConfig.from_dict({"expected_run_length": "30 parsecs"})
    with pytest.raises(ConfigError, match="expected_run_length must be a number > 1"):
        DetectorConfig.from_dict({"expected_run_length": 1})


def test_a_duration_is_the_run_length_in_observations_at_the_streams_rate():
    """expected_run_length='250m' with a row a minute is expected_run_length=250 observations:
    the same events, confidences and Bayes factors, chunk by chunk; with a row every two minutes it
    is 125 observations; with no interval known yet, DEFAULT_RUN_LENGTH."""
    from models import build_model
    from service.detect import DetectorConfig, OfflineRun
    from service.detect.config import DEFAULT_RUN_LENGTH
    from service.sgais import SGAISConfig, build_sampler

    g = np.random.default_rng(2)
    x = np.r_[g.normal(0, 1, 300), g.normal(1.5, 1, 300)][:, None]

    def run(erl, spacing):
        r = OfflineRun(build_sampler(build_model("gaussian", 1), SGAISConfig()), 4, DetectorConfig(expected_run_length=erl))
        out = []
        for lo in range(0, 600, 20):
            interval = None if spacing is None else T.seconds_per_row(0.0, spacing * (lo + 19), lo + 20)
            res, evs = r.step(__import__("torch").from_numpy(x[lo:lo + 20]), interval)
            out.append((res.log_evidence, [(e.location, e.confidence, e.log_prior_odds) for e in evs]))
        return out

    per_minute = run("250m", 60.0)
    assert per_minute == run(250, None) == run("500m", 120.0)
    assert any(evs for _, evs in per_minute), "no change found: the comparison would be vacuous"
    assert run("250m", None) == run(DEFAULT_RUN_LENGTH, None)
    assert per_minute != run(2500, None)  # the prior odds do move with the run length


def test_service_turns_a_duration_into_observations_by_the_rows_times(live):
    """Two streams, the same rows a minute apart (given times): one with expected_run_length
    '300m', one with 300 observations. The same change points, the same confidences."""
    g = np.random.default_rng(5)
    x = np.r_[g.normal(0, 1, 200), g.normal(2.0, 1, 200)]
    stamps = 1.6e9 + 60.0 * np.arange(400)
    names = {"dur": f"dur-{uuid.uuid4().hex[:8]}", "obs": f"obs-{uuid.uuid4().hex[:8]}"}
    for key, erl in (("dur", "300m"), ("obs", 300)):
        name = names[key]
        r = live.client.post("/v1/streams", json={"name": name, "columns": ["v"], "models": ["gaussian"], "seed": 3,
                                                   "detector": {"expected_run_length": erl}})
        assert r.status_code == 201, r.text
        for seq, lo in enumerate(range(0, 400, 20)):
            body = {"seq": seq, "rows": x[lo:lo + 20, None].tolist(), "time": stamps[lo:lo + 20].tolist()}
            assert live.client.post(f"/v1/streams/{name}/chunks", json=body).status_code == 202
    assert live.client.get(f"/v1/streams/{names['dur']}").json()["detector"]["expected_run_length"] == "300m"
    drain(live.redis_url)
    got = {k: live.client.get(f"/v1/streams/{n}/changepoints").json()["changepoints"] for k, n in names.items()}
    keep = ("location", "confidence", "log_prior_odds", "location_time")
    assert got["dur"] and [{k: c[k] for k in keep} for c in got["dur"]] == [{k: c[k] for k in keep} for c in got["obs"]]
    r = live.client.post("/v1/streams", json={"name": "soon", "columns": ["v"], "detector": {"expected_run_length": "soon"}})
    assert r.status_code == 422 and "expected_run_length" in r.json()["detail"], r.text


def test_what_a_new_user_tried(live):
    """Found trying the time support from outside: "time": null is no times (the schema allows
    it); a CSV time column named otherwise says where times go; a CSV row short of a value is
    not read as its time; RFC 3339 in any case, not ISO 8601's other forms."""
    s = create(live, "user")
    post = live.client.post
    assert post(f"/v1/streams/{s}/chunks", json={"seq": 0, "rows": [[1.0]], "time": None}).status_code == 202
    r = post(f"/v1/streams/{s}/chunks?seq=1", content="ts,v\n2026-11-06T00:00:00Z,1\n", headers={"content-type": "text/csv"})
    assert (r.status_code, r.json()["code"]) == (422, "invalid_time") and "column named 'time'" in r.json()["detail"], r.text
    r = post(f"/v1/streams/{s}/chunks?seq=1", content="time,v\n2036-11-05T00:00:00Z,1\n2036-11-05T00:00:01Z\n",
             headers={"content-type": "text/csv"})
    assert r.status_code == 422 and "row 1 (line 3): has 1 values, the header has 2" in r.json()["detail"], r.text
    soon = datetime.fromtimestamp(int(time.time()) + 3600, timezone.utc)  # after chunk 0's arrival, within the day ahead
    r = post(f"/v1/streams/{s}/chunks", json={"seq": 1, "rows": [[1.0], [2.0]], "time": [
        soon.strftime("%Y-%m-%dt%H:%M:%Sz"), (soon + timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M:%S+00:00")]})
    assert r.status_code == 202, r.text
    for bad in ("2036-W45-1T00:00:10Z", "20361102T000013Z", "2036-11-02T00:00:13+0000"):
        r = post(f"/v1/streams/{s}/chunks", json={"seq": 2, "rows": [[1.0]], "time": [bad]})
        assert (r.status_code, r.json()["code"]) == (422, "invalid_time") and "not an RFC 3339 time" in r.json()["detail"], r.text

"""Which columns a change moved (``service.detect.moves``): each column's mean and sd over the
detector's rows before a change and after it, on every path a user reads a change from: the
detector's events, the stream's answer, ``cusp.Detector``, ``cusp replay``, the service's change
points (real Redis, real HTTP, a real worker) and ``POST /v1/detect``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from service.detect import detect_series, detect_stream
from service.detect.moves import column_moves, named, summary


def table(seed: int = 3, n: int = 600, at: int = 400) -> np.ndarray:
    """Three columns in raw units (latency in ms; a gauge of 4-6; a rate at 1e6 +- 1e-4), the
    third up 5 sd at ``at``."""
    g = np.random.default_rng(seed)
    x = np.column_stack([250 + 20 * g.standard_normal(n), 4 + g.integers(0, 3, n), 1e6 + 1e-4 * g.standard_normal(n)])
    x[at:, 2] += 5e-4
    return x


def test_column_moves_are_the_columns_means_and_sds_in_raw_units():
    x = table()
    before, after = torch.as_tensor(x[:300]), torch.as_tensor(x[300:310])
    m = column_moves(before, after)
    assert (m["rows_before"], m["rows_after"]) == (300, 10)
    # numpy's figures over the same rows, to rounding (the rate sits at 1e6 with a spread of 1e-4:
    # taken about the mean, its sd keeps its digits)
    np.testing.assert_allclose(m["mean_before"], x[:300].mean(0), rtol=1e-15)
    np.testing.assert_allclose(m["mean_after"], x[300:310].mean(0), rtol=1e-15)
    np.testing.assert_allclose(m["sd_before"], x[:300].std(0, ddof=1), rtol=1e-9)
    np.testing.assert_allclose(m["sd_after"], x[300:310].std(0, ddof=1), rtol=1e-9)
    # one column: the change is the column's; no rows on a side: nothing to say
    assert column_moves(before[:, :1], after[:, :1]) is None
    assert column_moves(before[:0], after) is None and column_moves(before, after[:0]) is None


def test_named_moves_say_how_far_each_column_went_in_its_spread_before():
    m = column_moves(torch.tensor([[1.0, 5.0, 2.0], [3.0, 5.0, 2.0]]), torch.tensor([[4.0, 5.0, 7.0], [6.0, 5.0, 7.0]]))
    a, b, c = named(m, ["a", "b", "c"])
    # a: mean 2 -> 5, sd sqrt(2) both sides
    assert a["column"] == "a" and a["shift"] == pytest.approx(3 / math.sqrt(2)) and a["scale"] == pytest.approx(1.0)
    # b constant and staying: shift 0, no scale; c constant before and moved: no spread to measure it in
    assert (b["shift"], b["scale"]) == (0.0, None)
    assert (c["shift"], c["scale"], c["mean_before"], c["mean_after"]) == (None, None, 2.0, 7.0)
    assert a["rows_before"] == a["rows_after"] == 2
    # ranked: the constant column that moved first, then |shift|; the constant one that stayed not at all
    assert summary(m, ["a", "b", "c"], most=2) == "c mean 2 -> 7, a +2.12 sd (sd x1.00); 2 rows before, 2 after"
    # without names: the columns' indices
    assert [e["column"] for e in named(m)] == [0, 1, 2]
    assert named(None) is None and summary(None) is None


@pytest.mark.parametrize("chunk", [1, 10, 50])
def test_an_event_carries_the_rows_before_and_after_it_and_the_moved_column_first(chunk):
    """The detector's rows: those after the change are exactly location .. detected_at, those
    before the rows just before it; the column that moved (5 sd, in raw units) ranks first."""
    x = table()
    events = detect_series(x, "gaussian:warmup=5", chunk_size=chunk, seed=0)
    assert [e.location for e in events] == [400]
    e = events[0]
    m = e.columns
    assert m["rows_after"] == e.delay and m["rows_before"] >= 50
    lo = e.location - m["rows_before"]
    np.testing.assert_allclose(m["mean_before"], x[lo:e.location].mean(0), rtol=1e-14)
    np.testing.assert_allclose(m["mean_after"], x[e.location:e.detected_at].mean(0), rtol=1e-14)
    np.testing.assert_allclose(m["sd_before"], x[lo:e.location].std(0, ddof=1), rtol=1e-8)
    ranked = summary(m, ["ms", "gauge", "rate"]).split(", ")
    assert ranked[0].startswith("rate +") and float(ranked[0].split()[1]) > 3.0


def test_a_one_column_event_has_none_and_the_stream_change_carries_its_models():
    g = np.random.default_rng(0)
    y = 100 + g.standard_normal(300)
    y[150:] += 5
    assert [e.columns for e in detect_series(y, "gaussian:warmup=5", chunk_size=10)] == [None]
    x = table()
    events, changes = detect_stream(x, ["gaussian:warmup=5", "student-t"], chunk_size=10)
    assert [c.location for c in changes] == [400]
    top = max(changes[0].support, key=lambda m: changes[0].support[m][0] * changes[0].support[m][1])
    assert changes[0].columns == next(e.columns for e in events[top] if e.location == 400)


def test_cusp_detector_and_replay_name_the_columns(tmp_path, capsys):
    import cusp
    from service.cli import main

    x = table()
    det = cusp.Detector(columns=["ms", "gauge", "rate"], chunk_size=10).update(x).flush()
    (c,) = det.changepoints
    moved = det.columns_moved(c)
    assert [e["column"] for e in moved] == ["ms", "gauge", "rate"] and moved[2]["shift"] > 3.0
    assert det.columns_moved(det.events[det.names[0]][0]) == moved  # (one model: its event is the change)
    path = tmp_path / "t.csv"
    np.savetxt(path, x, delimiter=",", fmt="%.17g", header="ms,gauge,rate", comments="")
    out = tmp_path / "trace.jsonl"
    assert main(["replay", str(path), "--detect", "--chunk-size", "10", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "stream (model-averaged): change point at observation 400" in err and "moved most: rate +" in err
    line = next(json.loads(s) for s in out.read_text().splitlines() if '"stream_changepoint"' in s)
    assert line["columns"] == moved


@pytest.fixture()
def redis(tmp_path):
    from service.store import EmbeddedRedis

    r = EmbeddedRedis(tmp_path / "redis")
    yield r
    r.close()


def test_the_service_and_post_detect_name_the_columns_that_moved(redis):
    """A three-column stream through the service (real Redis, HTTP and worker): its change point and
    its model's event list each column's move by name, as ``cusp.Detector`` has them; so does POST
    /v1/detect."""
    import cusp
    from tests.service_fixtures import LiveServer, drain

    x = table()
    names = ["ms", "gauge", "rate"]
    det = cusp.Detector(columns=names, chunk_size=10).update(x).flush()
    want = det.columns_moved(det.changepoints[0])
    live = LiveServer(redis.url)
    try:
        r = live.client.post("/v1/streams", json={"name": "table", "columns": names, "seed": 0})
        assert r.status_code == 201, r.text
        for seq, lo in enumerate(range(0, len(x), 10)):
            r = live.client.post("/v1/streams/table/chunks", json={"seq": seq, "rows": x[lo:lo + 10].tolist()})
            assert r.status_code == 202, r.text
        drain(redis.url)
        got = live.client.get("/v1/streams/table/changepoints").json()
        assert [c["location"] for c in got["stream"]] == [400]
        assert got["stream"][0]["columns"] == want
        assert got["changepoints"][0]["columns"] == want
        r = live.client.post("/v1/detect", json={"values": x.tolist(), "columns": names, "chunk_size": 10})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["changepoints"][0]["columns"] == want
        assert body["models"][0]["changepoints"][0]["columns"] == want
    finally:
        live.stop()


def test_a_constant_column_is_exactly_constant_in_its_summary():
    """A column of 0.1 throughout: its mean 0.1 and sd 0 exactly on both sides, shift 0 (a mean taken
    as a plain sum was 1 ulp off, its sd 1e-17: "flag -1.00 sd (sd x0.00)", a review); one that goes
    0.1 -> 0.3 has no shift to give (no spread before) and ranks first."""
    g = torch.Generator().manual_seed(0)
    before = torch.cat([torch.randn(40, 1, generator=g, dtype=torch.float64), torch.full((40, 1), 0.1, dtype=torch.float64),
                        torch.full((40, 1), 0.1, dtype=torch.float64)], 1)
    after = torch.cat([torch.randn(7, 1, generator=g, dtype=torch.float64) + 5, torch.full((7, 1), 0.1, dtype=torch.float64),
                       torch.full((7, 1), 0.3, dtype=torch.float64)], 1)
    m = column_moves(before, after)
    x, flag, moved = named(m, ["x", "flag", "moved"])
    assert (flag["mean_before"], flag["mean_after"], flag["sd_before"], flag["sd_after"], flag["shift"], flag["scale"]) == \
        (0.1, 0.1, 0.0, 0.0, 0.0, None)
    assert (moved["mean_before"], moved["mean_after"], moved["shift"]) == (0.1, 0.3, None)
    assert summary(m, ["x", "flag", "moved"]).startswith("moved mean 0.1 -> 0.3, x +")

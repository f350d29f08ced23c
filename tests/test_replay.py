"""``cusp replay`` on good and bad files, run as a real subprocess."""

import collections
import json
import re
import subprocess
import sys

import numpy as np
import pytest


def cusp(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "service.cli", "replay", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.fixture
def lr_csv(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1200, 3))
    y = x @ [1.0, 2.0, -1.0] + 0.3 + rng.normal(size=1200)
    p = tmp_path / "lr.csv"
    np.savetxt(p, np.c_[y, x], delimiter=",", header="y,a,b,c", comments="")
    return p


def test_replay_writes_a_trace_per_chunk_and_model(lr_csv, tmp_path):
    out, png = tmp_path / "trace.jsonl", tmp_path / "trace.png"
    r = cusp(str(lr_csv), "--model", "linear-regression", "--model", "gaussian", "--target", "y",
             "--chunk-size", "300", "--out", str(out), "--plot", str(png), "--seed", "3")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(s) for s in out.read_text().splitlines()]
    assert [(d["model"], d["chunk"]) for d in lines] == [(m, c) for c in range(4) for m in ("linear-regression", "gaussian")]
    keys = {"n", "rows", "log_evidence", "log_predictive", "annealing_steps", "ess_before", "ess_after", "resamples", "seconds"}
    assert keys <= set(lines[0])
    lr = [d for d in lines if d["model"] == "linear-regression"]
    assert lr[-1]["n"] == 1200 and sum(d["log_predictive"] for d in lr) == pytest.approx(lr[-1]["log_evidence"])
    # the regression on the right target explains y far better than a Gaussian on all columns
    assert "posterior probability 1.0000" in r.stderr.splitlines()[0]
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    # deterministic: the same seed gives the same numbers
    out2 = tmp_path / "again.jsonl"
    cusp(str(lr_csv), "--model", "linear-regression", "--model", "gaussian", "--target", "y",
         "--chunk-size", "300", "--out", str(out2), "--seed", "3")
    strip = lambda text: [{k: v for k, v in json.loads(s).items() if k != "seconds"} for s in text.splitlines()]
    assert strip(out.read_text()) == strip(out2.read_text())


def test_replay_reads_npy(tmp_path):
    p = tmp_path / "d.npy"
    np.save(p, np.random.default_rng(1).normal(size=(400, 2)))
    r = cusp(str(p), "--model", "gmm:components=2", "--chunk-size", "200")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2


@pytest.mark.parametrize(
    "content,args,message",
    [
        ("a,b\n1,2\n3,nan\n", ["--model", "gaussian"], "row 2 column 'b' is nan"),
        ("a,b\n1,2\n3,inf\n", ["--model", "gaussian"], "NaN and infinite"),
        ("a\n1\n2\n-1e200\n", [], "row 3 column 'a' is -1e+200: values must be within"),
        ("a,b\n1,2\n3\n", ["--model", "gaussian"], "line 3 has 1 fields"),
        ("a,b\n1,x\n", ["--model", "gaussian"], "'x' is not a number"),
        ("1,2\n3,4\n", ["--model", "gaussian"], "header"),
        ("2021-01-01,5\n2021-01-02,6\n", [], "the first line looks like data; a header row with column names is required"),
        ('"2021-01-01",5\n2021-01-02,6\n', [], "the first line looks like data; a header row with column names is required"),
        ("", ["--model", "gaussian"], "empty file"),
        ("a,b\n", ["--model", "gaussian"], "no data rows"),
        ("a,b\n1,2\n", ["--model", "nope"], "unknown model 'nope'"),
        ("a,b\n1,2\n", ["--model", "gmm:components=0"], "components"),
        ("a,b\n1,2\n", ["--model", "gaussian", "--sampler", "fast"], "unknown sampler preset"),
        ("a,b\n1,2\n", ["--model", "gaussian", "--particles", "1"], "particles"),
        ("a,b\n1,2\n", ["--model", "gaussian", "--chunk-size", "0"], "chunk-size"),
        ("a,b\n1,2\n", ["--model", "gaussian", "--seed", "-1"], "--seed must be an integer in [0, 2^62]"),
        ("a,b\n1,2\n", ["--model", "linear-regression", "--target", "zz"], "target column 'zz'"),
        ("a,b\n1,2\n", ["--model", "logistic-regression"], "class label"),
        ("ts,v\n2021-01-02,1\n2021-01-01,2\n", ["--model", "gaussian"], "ts[1] is before ts[0]"),
        ("ts,v\n2021-01-01T00:00:00,1\n", ["--model", "gaussian"], "line 2 column 'ts': '2021-01-01T00:00:00' has no UTC offset"),
        ("when,v\n2021-01-01,1\n", ["--model", "gaussian", "--time-column", "at"], "no column 'at'"),
        ("time\n2021-01-01\n", ["--model", "gaussian"], "the only column is the times"),
        ("v\n1\n", ["--model", "gaussian", "--detect", "--detector", "expected_run_length=30d"], "needs the rows' times"),
        # a model's refusal names the file's row (from 1, as the reader does) and column, not its row in the chunk
        ("a\n1\n2\n-3\n4\n", ["--model", "poisson", "--chunk-size", "2"],
         "bad.csv: poisson: counts must be whole numbers >= 0; row 3, column 'a' has -3.0"),
        ("x\n1\n1.001\n0.999\n1\n1.0005\n1\n1e148\n", ["--model", "student-t", "--chunk-size", "3"],
         "bad.csv: student-t: row 7 column 'x': 1e+148 is too large for this model's frame"),
        ("x\n1\n1.001\n0.999\n1\n1.0005\n1\n1e148\n", ["--model", "gaussian:warmup=5", "--chunk-size", "7"],
         "bad.csv: gaussian_warmup5: row 7 column 'x': 1e+148 is too large for this model's frame"),
        # a detector setting without --detect (was ignored without a word: a new user's trial)
        ("v\n1\n2\n", ["--model", "gaussian", "--detector", "threshold=0.9"], "--detector threshold=0.9 sets the change-point "
                                                                              "detector, which runs with --detect: add it"),
    ],
)
def test_bad_input_stops_with_a_clear_message(tmp_path, capsys, content, args, message):
    # in-process (the subprocess path is covered above): main() returns the exit status
    from service.cli import main

    p = tmp_path / "bad.csv"
    p.write_text(content)
    assert main(["replay", str(p), *args]) == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_missing_file(tmp_path):
    r = cusp(str(tmp_path / "nope.csv"), "--model", "gaussian")
    assert r.returncode == 2 and "no such file" in r.stderr


def test_replay_detect_prints_marks_and_traces_change_points(tmp_path):
    rng = np.random.default_rng(1)
    p = tmp_path / "shift.csv"
    np.savetxt(p, np.r_[rng.normal(0, 1, 300), rng.normal(2, 1, 300)][:, None], delimiter=",", header="v", comments="")
    out, png = tmp_path / "t.jsonl", tmp_path / "t.png"
    r = cusp(str(p), "--model", "gaussian", "--chunk-size", "10", "--detect", "--out", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    cps = [d for d in map(json.loads, out.read_text().splitlines()) if d.get("kind") == "changepoint"]
    assert len(cps) == 1 and abs(cps[0]["location"] - 300) <= 10 and cps[0]["confidence"] >= 0.99, cps
    assert f"gaussian: change point at observation {cps[0]['location']}" in r.stderr
    assert "not looked for" not in r.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"
    # without --detect: the evidence alone, and a line that says change points were not looked for
    r = cusp(str(p), "--model", "gaussian", "--out", str(out))
    assert r.returncode == 0 and "change points: not looked for; add --detect" in r.stderr, r.stderr
    # with --detect and no change: a line that says so (there was none: a new user's trial)
    flat = tmp_path / "flat.csv"
    np.savetxt(flat, rng.normal(0, 1, 300)[:, None], delimiter=",", header="v", comments="")
    r = cusp(str(flat), "--model", "gaussian", "--detect")
    assert r.returncode == 0 and "stream (model-averaged): no change found (threshold 0.99)" in r.stderr, r.stderr
    # three values, the default portfolio: all of them its warm-up, and a line that says so
    np.savetxt(flat, [[1.0], [5.0], [2.0]], delimiter=",", header="v", comments="")
    r = cusp(str(flat), "--detect")
    assert r.returncode == 0 and "stream (model-averaged): all 3 rows are the models' warm-up: their first 5 rows" in r.stderr, r.stderr
    # two models: each model's events and the stream's model-averaged change
    r = cusp(str(p), "--model", "gaussian", "--model", "gaussian:kappa0=0.1", "--chunk-size", "10", "--detect", "--out", str(out))
    assert r.returncode == 0, r.stderr
    lines = list(map(json.loads, out.read_text().splitlines()))
    # each model named as the service names it, its spec beside the name
    assert {(d["model"], d["spec"]) for d in lines if d.get("kind") == "changepoint"} == \
        {("gaussian", "gaussian"), ("gaussian_kappa00.1", "gaussian:kappa0=0.1")}
    stream = [d for d in lines if d.get("kind") == "stream_changepoint"]
    assert len(stream) == 1 and abs(stream[0]["location"] - 300) <= 10 and stream[0]["confidence"] >= 0.99, stream
    assert set(stream[0]["support"]) == {"gaussian", "gaussian_kappa00.1"}
    assert f"stream (model-averaged): change point at observation {stream[0]['location']}" in r.stderr
    # without --detect: no change points; bad detector settings stop with a clear message
    r = cusp(str(p), "--model", "gaussian", "--chunk-size", "10", "--out", str(out))
    assert r.returncode == 0 and "changepoint" not in out.read_text()
    for bad, msg in (("threshold=2", "threshold"), ("nonsense", "not key=value"), ("colour=1", "unknown detector setting")):
        r = cusp(str(p), "--model", "gaussian", "--detect", "--detector", bad)
        assert r.returncode == 2 and msg in r.stderr, (bad, r.stderr)


def test_replay_reads_a_time_column_and_times_its_change_points(tmp_path):
    """Issue 17: a CSV with a ``ts`` column was refused. Its times now go with the rows: each
    chunk's line carries time_start/time_end, change points location_time/detected_time as the
    service's results do; the numbers are those of the same data without the column."""
    rng = np.random.default_rng(1)
    x = np.r_[rng.normal(0, 1, 300), rng.normal(3, 1, 300)]
    days = np.datetime64("2020-01-01") + np.arange(600)
    timed, plain = tmp_path / "timed.csv", tmp_path / "plain.csv"
    timed.write_text("v,ts\n" + "".join(f"{v!r},{d}\n" for v, d in zip(x.tolist(), days)))
    plain.write_text("v\n" + "".join(f"{v!r}\n" for v in x.tolist()))
    out_t, out_p = tmp_path / "t.jsonl", tmp_path / "p.jsonl"
    stderr = {}
    for src, out in ((timed, out_t), (plain, out_p)):
        r = cusp(str(src), "--model", "gaussian", "--chunk-size", "25", "--detect", "--out", str(out))
        assert r.returncode == 0, r.stderr
        stderr[src] = r.stderr
    t_lines = list(map(json.loads, out_t.read_text().splitlines()))
    p_lines = list(map(json.loads, out_p.read_text().splitlines()))
    times = ("time_start", "time_end", "location_time", "detected_time", "delay_seconds", "seconds")
    assert [{k: v for k, v in d.items() if k not in times} for d in t_lines] == \
        [{k: v for k, v in d.items() if k not in times} for d in p_lines]
    results = [d for d in t_lines if "kind" not in d]
    assert (results[0]["time_start"], results[-1]["time_end"]) == ("2020-01-01T00:00:00.000000Z", "2021-08-22T00:00:00.000000Z")
    changes = [d for d in t_lines if d.get("kind") in ("changepoint", "stream_changepoint")]
    assert changes and all(abs(c["location"] - 300) <= 25 for c in changes), changes
    for c in changes:
        assert c["location_time"] == f"{days[c['location']]}T00:00:00.000000Z", c
        assert c["detected_time"] == f"{days[c['detected_at'] - 1]}T00:00:00.000000Z", c
        assert c["delay_seconds"] == 86400.0 * (c["detected_at"] - 1 - c["location"])
    assert f"change point at observation {changes[0]['location']} ({changes[0]['location_time']})" in stderr[timed]


def test_a_time_column_named_in_another_case_is_that_column(tmp_path):
    """--time-column Date on a 'date' header reads it (the automatic choice ignores case too), when
    exactly one column matches; 'Date' and 'date' both in the header: only the exact name."""
    from service.data import DataError, read_series

    f = tmp_path / "d.csv"
    f.write_text("date,v\n2021-01-01,1\n2021-01-02,2\n")
    names, data, stamps = read_series(f, "Date")
    assert names == ["v"] and data.shape == (2, 1) and list(stamps) == [1609459200.0, 1609545600.0]
    both = tmp_path / "b.csv"
    both.write_text("Date,date,v\n2021-01-01,2021-01-01,1\n2021-01-02,2021-01-02,2\n")
    with pytest.raises(DataError, match="no column 'DATE'"):
        read_series(both, "DATE")


@pytest.mark.parametrize("detect", [False, True], ids=["plain", "detect"])
def test_replay_reproduces_the_service_bit_for_bit_for_every_model(tmp_path, redis_url, detect):
    """The same data, seed and chunking through the service (a real API on a real Redis, a worker
    process's loop in burst mode) and through `cusp replay`: every model's numbers per chunk are
    equal bit for bit, not only the first model's (each model's seed derives from the stream's
    seed and its place in the list). With the detector (the service's default) its change points
    and the restarts they cause agree too."""
    import uuid

    from tests.service_fixtures import LiveServer, drain

    rng = np.random.default_rng(5)
    x = np.r_[rng.normal(0, 1, 300), rng.normal(2.5, 1, 300)].round(6)
    p = tmp_path / "shift.csv"
    stamps = 1.6e9 + 60.0 * np.arange(len(x))  # a row a minute, given as epoch seconds in a ts column
    np.savetxt(p, np.c_[x, stamps], delimiter=",", header="v,ts", comments="", fmt=["%.6f", "%.1f"])
    specs, chunk, seed = ["gaussian", "gaussian:kappa0=0.1", "gmm:components=2"], 20, 7
    s = "replay" + uuid.uuid4().hex[:8]
    live = LiveServer(redis_url)
    try:
        body = {"name": s, "columns": ["v"], "models": specs, "seed": seed, "detector": {"enabled": detect}}
        r = live.client.post("/v1/streams", json=body)
        assert r.status_code == 201, r.text
        for q, lo in enumerate(range(0, len(x), chunk)):
            r = live.client.post(f"/v1/streams/{s}/chunks", json={"seq": q, "rows": x[lo : lo + chunk, None].tolist(),
                                                                 "time": stamps[lo : lo + chunk].tolist()})
            assert r.status_code == 202, r.text
        assert drain(redis_url) == len(specs) * len(x) // chunk
        names = [m["name"] for m in live.client.get(f"/v1/streams/{s}").json()["models"]]
        entries, since = [], None
        while True:
            page = live.client.get(f"/v1/streams/{s}/evidence", params={"since": since} if since else {}).json()
            if not page["results"]:
                break
            entries += page["results"]
            since = page["next"]
    finally:
        live.stop()

    out = tmp_path / "trace.jsonl"
    args = [str(p), *(a for spec in specs for a in ("--model", spec)), "--chunk-size", str(chunk), "--seed", str(seed),
            "--out", str(out), *(["--detect"] if detect else [])]
    r = cusp(*args)
    assert r.returncode == 0, r.stderr
    trace = [json.loads(line) for line in out.read_text().splitlines()]

    fields = ("log_evidence", "log_predictive", "annealing_steps", "ess_after", "resamples", "time_start", "time_end")
    for name, spec in zip(names, specs):
        served = sorted((e for e in entries if e["model"] == name and e["kind"] == "result"), key=lambda e: e["seq"])
        replayed = [t for t in trace if t["model"] == name and t["spec"] == spec and "kind" not in t]
        assert [e["seq"] for e in served] == [t["chunk"] for t in replayed] == list(range(len(x) // chunk)), name
        for f in fields:
            assert [repr(e[f]) for e in served] == [repr(t[f]) for t in replayed], (name, f)
        served_cps = [(e["location"], repr(e["confidence"]), e["location_time"], e["detected_time"])
                      for e in entries if e["model"] == name and e["kind"] == "changepoint"]
        replayed_cps = [(t["location"], repr(t["confidence"]), t["location_time"], t["detected_time"])
                        for t in trace if t["model"] == name and t.get("kind") == "changepoint"]
        assert served_cps == replayed_cps, name
    if detect:  # the test means something: the shift at observation 300 was found and restarted models
        assert any(e["kind"] == "changepoint" for e in entries)


def test_replay_without_models_runs_the_default_portfolio_and_shows_its_prior(tmp_path):
    """No --model: the default portfolio, as for a stream created without models; each metric-series
    model says which data-dependent prior it used (its frame: the warm-up's centre and scale)."""
    y = [250.0, 260.0, 240.0, 255.0, 245.0] + [250.0 + (i % 7) for i in range(60)]
    p = tmp_path / "ms.csv"
    p.write_text("ms\n" + "\n".join(repr(v) for v in y) + "\n")
    out = cusp(str(p), "--chunk-size", "10", "--out", str(tmp_path / "t.jsonl"))
    assert out.returncode == 0, out.stderr
    for model in ("level", "ar", "trend"):
        assert f"{model}: prior on (y - centre) / scale, centre 250, scale 7.90569415 (from its first 5 rows" in out.stderr, out.stderr
    # two columns: gaussian in a frame per column
    p.write_text("ms,kb\n" + "\n".join(f"{v!r},{2 * v!r}" for v in y) + "\n")
    out = cusp(str(p), "--chunk-size", "10", "--out", str(tmp_path / "t.jsonl"))
    assert out.returncode == 0, out.stderr
    assert ("gaussian_warmup5: prior on (y - centre) / scale, centre [250, 500], scale [7.90569415, 15.8113883] (from its "
            "first 5 rows") in out.stderr, out.stderr


def test_replay_detect_chunks_a_short_series_as_post_detect_does(tmp_path):
    """25 yearly values around 1e4 (sd 50) with +250 from row 12: with --detect and no --chunk-size,
    chunks of ceil(25 / 250) = 1 row, as POST /v1/detect, and the stream answer has the jump (in
    chunks of 500, the old default, the series was one chunk and nothing was reported); without
    --detect the evidence keeps chunks of 500. The chosen size is printed."""
    r = np.random.default_rng(0)
    y = 1e4 + 50 * r.standard_normal(25)
    y[12:] += 250
    p = tmp_path / "yearly.csv"
    p.write_text("v\n" + "\n".join(repr(float(v)) for v in y) + "\n")
    out = cusp(str(p), "--detect", "--out", str(tmp_path / "t.jsonl"))
    assert out.returncode == 0, out.stderr
    assert "chunks of 1 row (--chunk-size to change)" in out.stderr
    assert "stream (model-averaged): change point at observation 12," in out.stderr, out.stderr
    # several models: each one's own change points are counted at the end, not printed one by one (a new
    # user's random walk printed about 100 of them and no stream change), unless asked; the trace has them
    events = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    own = collections.Counter(e["model"] for e in events if e.get("kind") == "changepoint")
    assert own and not re.search(r"^(level|ar|trend|student-t|seasonal): change point", out.stderr, re.M), out.stderr
    assert ("each model's own change points (not the stream's: it weighs them by the models' probabilities; "
            "'changepoint' lines in the trace, --model-events to print them): " + ", ".join(
                f"{m} {own[m]}" for m in ["level", "ar", "trend", "student-t", "seasonal"])) in out.stderr, out.stderr
    listed = cusp(str(p), "--detect", "--model-events", "--out", str(tmp_path / "t.jsonl"))
    assert len(re.findall(r"^(?:level|ar|trend|student-t|seasonal): change point at", listed.stderr, re.M)) == sum(own.values())
    old = cusp(str(p), "--detect", "--chunk-size", "500", "--out", str(tmp_path / "t.jsonl"))
    assert old.returncode == 0 and "stream (model-averaged): change point" not in old.stderr, old.stderr
    assert "stream (model-averaged): no change found" in old.stderr, old.stderr
    assert "chunks of 500 rows" in cusp(str(p), "--out", str(tmp_path / "t.jsonl")).stderr
    bad = cusp(str(p), "--model", "gmm:components=0", "--out", str(tmp_path / "t.jsonl"))
    assert bad.returncode != 0 and "components" in bad.stderr and "chunks of" not in bad.stderr, bad.stderr  # said after the specs passed


def test_a_column_that_numbers_the_rows_gets_a_note(tmp_path, capsys):
    """A new user's yearly CSV (year, value) ran as two columns of data without a word: now a note
    names the column and says what to do (the run goes on: it may be data)."""
    from service.cli import main

    p = tmp_path / "yearly.csv"
    p.write_text("year,value\n" + "".join(f"{1990 + i},{10 + (i > 12) * 5 + (i % 3)}\n" for i in range(25)))
    assert main(["replay", str(p)]) == 0
    err = capsys.readouterr().err
    assert "note: column 'year' is modelled as data" in err, err
    p.write_text("value\n" + "".join(f"{10 + (i % 3)}\n" for i in range(25)))
    assert main(["replay", str(p)]) == 0
    assert "note:" not in capsys.readouterr().err


def test_replay_says_when_model_events_fall_short_of_a_stream_change(tmp_path, capsys):
    """25 yearly values with a +2.4 sd jump at 12: `level` reports it at the 24th (0.9966), the
    model-averaged probability stays at 0.9799, under 0.99 (a new user saw events and silence from
    the stream; theirs, +3 sd, is a stream change since the events count with their probability
    now, ``Detector._stand``). The replay says how near the stream came, and with which support;
    nothing of the kind where the stream reports the change (a jump twice as large)."""
    from service.cli import main

    y = 100 + 5 * np.random.default_rng(0).standard_normal(25)
    p = tmp_path / "yearly.csv"
    p.write_text("value\n" + "".join(f"{v:.3f}\n" for v in np.where(np.arange(25) >= 12, y + 15, y)))
    assert main(["replay", str(p), "--detect", "--out", str(tmp_path / "t.jsonl")]) == 0
    err = capsys.readouterr().err  # theirs: two reports, a stream change with their probabilities now
    assert "stream (model-averaged): change point at observation 13, confidence 0.99" in err, err
    y[12:] += 12
    p.write_text("value\n" + "".join(f"{v:.3f}\n" for v in y))
    assert main(["replay", str(p), "--detect", "--out", str(tmp_path / "t.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "stream (model-averaged): no change at observation 13: its probability reached 0.97" in err, err
    assert "level p=0.9" in err and "below the threshold 0.99" in err, err
    y[12:] += 12
    p.write_text("value\n" + "".join(f"{v:.3f}\n" for v in y))
    assert main(["replay", str(p), "--detect", "--out", str(tmp_path / "t.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "stream (model-averaged): change point at observation 1" in err and "no change at" not in err, err


def test_replay_lists_a_withdrawn_change_as_the_service_does(tmp_path, capsys):
    """Per-minute latency with a daily cycle, no change, chunks of 60 (the case of
    tests/test_changepoint_store.py): the change found at 121 is withdrawn at 1,740. The replay
    prints the withdrawal, traces it as a ``stream_changepoint_withdrawn`` line after its
    ``stream_changepoint`` line, and says no change stands, as ``cusp.Detector`` has it."""
    import json

    from service.cli import main

    g = np.random.default_rng(3)
    y = 250 + 30 * np.sin(2 * np.pi * np.arange(1800) / 1440) + g.normal(0, 20, 1800)
    p = tmp_path / "ms.csv"
    p.write_text("ms\n" + "".join(f"{float(v)!r}\n" for v in y))
    out = tmp_path / "t.jsonl"
    assert main(["replay", str(p), "--detect", "--chunk-size", "60", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "change point at observation 121 (found at 480) withdrawn at 1740: its probability is 0.0000 now" in err, err
    assert "stream (model-averaged): no change stands (threshold 0.99; 1 withdrawn)" in err, err
    lines = [json.loads(ln) for ln in out.read_text().splitlines()]
    stream = [(ln["kind"], ln["location"], ln.get("withdrawn_at")) for ln in lines if ln["model"] == "*"]
    assert stream == [("stream_changepoint", 121, None), ("stream_changepoint_withdrawn", 121, 1740)]

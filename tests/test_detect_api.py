"""POST /v1/detect (issue 17, item 7) over real HTTP: a whole series in, its change points,
evidence and per-chunk log predictive out, nothing stored in Redis; bad input a 4xx naming it."""

import re

import numpy as np
import pytest

from service.store import connect
from tests.service_fixtures import LiveServer


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url, max_chunk_rows=500)
    yield server
    server.stop()


def shifted(n=150, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(10, 1, n), rng.normal(14, 1, n)]).round(4).tolist()


def test_a_series_in_its_change_points_out_and_nothing_stored(live, redis_url):
    before = connect(redis_url).dbsize()
    times = [1_700_000_000 + 60 * i for i in range(300)]
    r = live.client.post("/v1/detect", json={"values": shifted(), "times": times, "chunk_size": 10})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["rows"] == 300 and out["chunk_size"] == 10 and len(out["chunks"]) == 30
    assert [(c["index"], c["time"]) for c in out["changepoints"]] == [(150, times[150])]
    assert isinstance(out["changepoints"][0]["time"], int)  # as given (an integer came back as 1700009000.0)
    assert out["changepoints"][0]["confidence"] >= 0.99
    first = out["changepoints"][0]
    assert first["delay"] == first["detected_at"] - first["index"] > 0  # (a new user missed it here)
    assert all(e["delay"] == e["detected_at"] - e["index"] for m in out["models"] for e in m["changepoints"])
    assert [i for i, b in enumerate(out["is_change_point"]) if b] == [150]
    assert out["confidence_scores"][150] == out["changepoints"][0]["confidence"] and sum(out["confidence_scores"]) < 1.0 + 1e-9
    assert [m["name"] for m in out["models"]] == ["level", "ar", "trend", "student-t", "seasonal"]  # the default portfolio
    assert sum(m["posterior_probability"] for m in out["models"]) == pytest.approx(1.0)
    level = out["models"][0]
    assert level["method"] == "exact" and len(level["log_predictive"]) == 30 and level["warnings"] == []
    assert level["annealing_steps"] == [0] * 30 and all(np.isfinite(level["log_predictive"]))
    # the effective prior's frame, as the stream's GET shows it: the first 5 values' sd, and the
    # centre where the old regime expected the next row when `level` restarted at 150: the posterior
    # mean of its level given rows 0-149, their mean shrunk towards the warm-up's by 1 / (1 + 150 x
    # coef_scale^2) of the 0.05 frame units between them
    values = np.asarray(shifted())
    assert level["frame"]["warmup_rows"] == 5 and level["frame"]["periods"] is None
    assert level["frame"]["centre"] == pytest.approx(values[:150].mean(), rel=1e-6)
    assert level["frame"]["scale"] == pytest.approx(values[:5].std(ddof=1), rel=1e-12)
    assert out["notes"] == []  # a change found, no candidate below the threshold: nothing to add
    assert connect(redis_url).dbsize() == before


def test_a_series_too_short_for_a_change_says_so(live):
    """A new user posted 1-2 values and got an answer with no change points and no hint why. The
    answer's notes say it: every row in the models' warm-up (their first 5), or too few scored after
    it; with 11 rows, 20 sd from row 6, the change is found (measured: no fewer rows find it, point
    by point at the defaults) and no note is left."""
    out = live.client.post("/v1/detect", json={"values": [1.0, 5.0]}).json()
    assert out["changepoints"] == [] and len(out["notes"]) == 1, out
    assert out["notes"][0].startswith("all 2 rows are the models' warm-up: their first 5 rows fix each model's frame")
    y = (np.r_[np.zeros(6), np.full(5, 20.0)] + np.random.default_rng(0).normal(size=11)).round(2)
    out = live.client.post("/v1/detect", json={"values": y[:8].tolist()}).json()
    assert out["changepoints"] == [] and out["notes"][0].startswith("only 3 rows were scored after the models' warm-up of 5"), out
    out = live.client.post("/v1/detect", json={"values": y.tolist()}).json()
    assert [c["index"] for c in out["changepoints"]] == [6] and out["notes"] == [], out


def test_azure_shaped_series_models_and_default_chunks(live):
    values = shifted(100, seed=2)
    series = [{"timestamp": f"2024-05-01T{i // 60:02d}:{i % 60:02d}:00Z", "value": v} for i, v in enumerate(values)]
    # Azure's body carries granularity (required there) and may carry customInterval: taken, not needed
    out = live.client.post("/v1/detect", json={"series": series, "granularity": "minutely", "customInterval": 1,
                                               "models": ["level", {"spec": "gaussian", "name": "g", "prior": 2}]}).json()
    assert out["chunk_size"] == 1  # ceil(200 / 250)
    assert [m["name"] for m in out["models"]] == ["level", "g"]
    (change,) = out["changepoints"]  # point by point: the change at 100, placed up to a few rows late
    assert 100 <= change["index"] <= 103 and change["time"] == series[change["index"]]["timestamp"]
    rows = np.random.default_rng(3).normal(size=(60, 2)).round(4).tolist()
    two = live.client.post("/v1/detect", json={"values": rows, "columns": ["a", "b"], "chunk_size": 20}).json()
    assert [m["spec"] for m in two["models"]] == ["gaussian:warmup=5"] and two["changepoints"] == []
    assert two["models"][0]["frame"]["centre"] == pytest.approx(np.mean(rows[:5], axis=0).tolist(), rel=1e-12)
    assert out["models"][1]["frame"] is None  # gaussian without a warm-up: its prior is in the data's units


@pytest.mark.parametrize("body, code, message", [
    ({"values": [[1.0, 2.0], [3.0, 4.0]], "columns": ["a", " "]}, "invalid_series", "column names must be non-empty and distinct"),
    ({"values": [[1.0, 2.0], [3.0, 4.0]], "columns": ["a", "a"]}, "invalid_series", "column names must be non-empty and distinct"),
    ({"values": [1.0, 2.0], "detector": {"threshold": 2}}, "invalid_request", "detector: threshold must be a probability"),
])
def test_the_codes_name_the_series_and_the_request_not_a_stream(live, body, code, message):
    """A new user's finding: bad column names and bad detector settings answered ``invalid_stream``
    ("The stream's name, columns or settings are invalid"), though POST /v1/detect makes no stream."""
    r = live.client.post("/v1/detect", json=body)
    assert r.status_code == 422 and r.json()["code"] == code, r.text
    assert message in r.json()["detail"]


@pytest.mark.parametrize("body, status, message", [
    ({}, 422, "give the series as 'values'"),
    ({"values": [1.0], "series": [{"timestamp": 0, "value": 1.0}]}, 422, "not both or neither"),
    ({"values": []}, 422, "values is empty"),
    ({"values": [[1.0, 2.0], [3.0]]}, 422, "values\\[1\\] is 1 value, values\\[0\\] 2 values: all rows need the same"),
    ({"values": [[1.0, 2.0], [3.0, 4.0], 5.0]}, 422, "values\\[2\\] is a number, values\\[0\\] a row: give numbers"),
    ({"values": [1.0, "x"]}, 422, "values"),
    ({"values": [True, False]}, 422, "values"),  # a boolean is not a number (pydantic's lax float took it)
    ({"values": [1.0, "2"]}, 422, "values"),
    ({"series": [{"timestamp": 1, "value": 1.0}, {"timestamp": 2, "value": -1e200}]}, 422,
     "series\\[1\\].value is -1e\\+200: values must be within"),

    ({"values": [1.0, 2.0], "times": [0]}, 422, "'times' has 1 entries for 2 rows"),
    ({"values": [1.0, 2.0], "times": [5, 5]}, 422, "times\\[1\\] repeats times\\[0\\]"),
    ({"values": [1.0, 2.0], "times": [1e300, 2e300]}, 422, "times\\[0\\]: 1e\\+300 epoch seconds is not a time between the years 1 and 9999"),
    ({"values": [1.0, 2.0], "times": ["2024-01-01T00:00:00Z", "yesterday"]}, 422, "times\\[1\\]: 'yesterday' is not an RFC 3339"),
    ({"values": [1.0, 2.0], "times": ["2024-01-01T00:00:00", "2024-01-01T00:01:00"]}, 422, "has no UTC offset"),
    ({"values": [1.0, 2.0], "models": ["nope"]}, 422, "model 'nope': unknown model 'nope'"),
    ({"values": [1.0, 2.0], "models": ["linear-regression"]}, 422, "needs at least 2 columns"),
    ({"values": [1.0, 2.0], "detector": {"threshold": 2}}, 422, "detector: threshold must be a probability"),
    ({"values": [1.0, 2.0], "columns": ["a", "b"]}, 422, "columns names 2 columns but the rows have 1 values"),
    ({"values": [1.0, 2.0], "chunk_size": 501}, 422, "exceeds CUSP_MAX_CHUNK_ROWS=500"),
    ({"values": [1.0] * 3000, "chunk_size": 1}, 422, "make 3,000 chunks; the limit is 2,000: use chunk_size >= 2"),
    # one chunk holds no change (was cut to the series, answered with none: the trial of 2026-12-06)
    ({"values": [1.0] * 30, "chunk_size": 50}, 422, "chunk_size 50 is not below the series' 30 rows: in one chunk no change"),
    ({"values": [1.0] * 30, "chunk_size": 30}, 422, "chunk_size 30 is not below"),
    ({"values": [1.0] * 100_001}, 413, "at most 100,000"),
    ({"values": [-1.0, 2.0], "models": ["poisson"]}, 422, "model 'poisson'"),
    ({"values": [1.0, 2.0], "sampler": {"overrides": {"particles": 0}}}, 422, "sampler"),
    # Azure's tuning fields: refused with cusp's way to say them, not ignored (a new user's Azure body)
    ({"values": [1.0, 2.0], "granularity": "daily", "period": 7}, 422, "'period' .*Azure.*seasonal:period=7"),
    ({"values": [1.0, 2.0], "threshold": 0.9}, 422, "'threshold' .*\"detector\": {\"threshold\""),
    ({"values": [1.0, 2.0], "stableTrendWindow": 5}, 422, "'stableTrendWindow' .*no such window"),
    ({"values": [1.0, 2.0], "granularity": "fortnightly"}, 422, "granularity"),
    # the new user's small ones: a string where an integer goes, a spec with nothing after ':', a prior of 0
    ({"values": [1.0, 2.0], "chunk_size": "2"}, 422, "chunk_size: Input should be a valid integer"),
    ({"values": [1.0, 2.0], "seed": "3"}, 422, "seed: Input should be a valid integer"),
    ({"values": [1.0, 2.0], "models": ["level:"]}, 422, "model 'level:': nothing after ':'"),
    ({"values": [1.0, 2.0], "models": ["seasonal:period=7,"]}, 422, "an empty setting"),
    ({"values": [1.0, 2.0], "models": [{"spec": "level", "prior": 0}]}, 422, "^body.models.0.object.prior: Input should be greater than 0$"),
    # within +-1e150, but beyond float64 in a mixture's frame from a warm-up with an sd of 1e-5 (was a 500: a bare ValueError)
    ({"values": [1.0 + 1e-5 * (i % 3) for i in range(20)] + [1e150, 1.0], "models": ["gmm:warmup=5"], "chunk_size": 4}, 422,
     "^model 'gmm_warmup5': observation 20 column 'x0': 1e\\+150 is too large for this model's frame \\(centre 1.00001, scale "
     "8.3666e-06, from the stream's first 5 rows\\): it takes values within 1e\\+30 scales of the centre"),
    ({"values": [1.0 + 1e-5 * (i % 3) for i in range(20)] + [1.0, 1e150], "models": ["level"], "chunk_size": 4}, 422,
     "^model 'level': observation 21 column 'x0': 1e\\+150 is too large for this model's frame .*: it takes values within 1e\\+150 "
     "scales"),
])
def test_bad_input_answers_4xx_naming_it_and_stores_nothing(live, redis_url, body, status, message):
    before = connect(redis_url).dbsize()
    r = live.client.post("/v1/detect", json=body)
    assert r.status_code == status, r.text
    assert re.search(message, r.json()["detail"]), r.json()["detail"]
    if "1e\\+150" in message:  # a value the models cannot hold: the series' fault, not the spec's
        assert r.json()["code"] == "invalid_series", r.json()
    assert connect(redis_url).dbsize() == before


@pytest.mark.parametrize("text, message", [('{"values": [1.0, NaN, 2.0]}', "values[1] is nan: values must be finite numbers"),
                                           ('{"values": [[1.0, 2.0], [3.0, -Infinity]]}', "values[1][1] is -inf"),
                                           # finite, but the models' squares overflow (was 'invalid_model')
                                           ('{"values": [1.0, 2.0, 1e200]}', "values[2] is 1e+200: values must be within +-1e+150"),
                                           ('{"values": [1, 1' + '0' * 400 + ']}', "values[1] is 10000000... (401 digits): values must be"),

                                           # one message, not pydantic's errors of both shapes (a new user)
                                           ('{"values": ["a", "b"]}', "values[0] is 'a': values must be numbers"),
                                           ('{"values": [[1.0], [null]]}', "values[1][0] is null: values must be numbers")])
def test_a_nan_in_values_is_named_by_its_place(live, text, message):
    """JSON's NaN and Infinity (which Python's parser reads): one message naming the value's place,
    not the two shapes' errors of the union (one of them about the other shape)."""
    r = live.client.post("/v1/detect", content=text, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and message in r.json()["detail"], r.text
    assert len(r.json()["errors"]) == 1, r.json()
    assert r.json()["code"] == "invalid_series", r.json()  # as an empty or ragged series (was 'invalid_request')


@pytest.mark.parametrize("body, message", [
    ('{"values": [1, 2, 3], "values": [4, 5, 6, 7]}', "JSON object has the key 'values' twice"),
    ('{"values": [1, 2, 3], "detector": {"threshold": 0.9, "threshold": 0.999}}', "the key 'threshold' twice"),
    (b"\xef\xbb\xbf" + b'{"values": [1, 2, 3]}', "byte-order mark"),
    ('{"values": [1, 2, 3], "columns": ["\u00e9"]}'.encode("latin-1"), "body is not UTF-8"),
    ('{"values": [1, 2, 3', "body is not valid JSON: Expecting"),
    ('{"values": ' + "[" * 5000 + "]" * 5000 + "}", "JSON nested too deeply"),
])
def test_a_body_that_is_not_json_as_exchanged_is_malformed(live, redis_url, body, message):
    """The body is read as a chunk's is (``service.api.middleware.StrictJson``): before, a key given
    twice was taken (the last: 4 rows answered 200), a byte-order mark skipped, and a body that is
    not UTF-8 or nested too deeply was "There was an error parsing the body" (a new user's trial)."""
    before = connect(redis_url).dbsize()
    r = live.client.post("/v1/detect", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "malformed_body", r.text
    assert message in r.json()["detail"], r.text
    assert connect(redis_url).dbsize() == before


def test_a_duration_run_length_counts_the_times_interval(live):
    """expected_run_length '100m' over rows a minute apart is 100 observations (the workers' and
    cusp.Detector's rule); without times a duration cannot be turned into observations: 422."""
    values = shifted()
    times = [1.6e9 + 60.0 * i for i in range(len(values))]
    ask = {"values": values, "times": times, "chunk_size": 10, "models": ["gaussian"]}
    by_time = live.client.post("/v1/detect", json={**ask, "detector": {"expected_run_length": "100m"}}).json()
    by_rows = live.client.post("/v1/detect", json={**ask, "detector": {"expected_run_length": 100}}).json()
    other = live.client.post("/v1/detect", json={**ask, "detector": {"expected_run_length": 100_000}}).json()
    assert by_time["changepoints"], by_time
    assert by_time["models"][0]["changepoints"] == by_rows["models"][0]["changepoints"]
    assert [e["log_prior_odds"] for e in other["models"][0]["changepoints"]] != \
        [e["log_prior_odds"] for e in by_time["models"][0]["changepoints"]]
    r = live.client.post("/v1/detect", json={"values": values, "detector": {"expected_run_length": "100m"}})
    assert r.status_code == 422 and "needs the rows' times" in r.json()["detail"], r.text

"""A stream created without a model list gets the default portfolio (models.registry.
default_portfolio), over real HTTP with the embedded Redis and a burst worker, and gives the same
numbers as the offline detect_stream on the same data, seed and chunks."""

import uuid

import numpy as np
import pytest
import torch

from models import build_model
from service.detect import detect_stream
from tests.service_fixtures import LiveServer, drain


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url)
    yield server
    server.stop()


def test_a_univariate_stream_without_models_gets_the_portfolio_and_its_answer(live, redis_url):
    s = "p" + uuid.uuid4().hex[:10]
    r = live.client.post("/v1/streams", json={"name": s, "columns": ["latency_ms"], "seed": 4})
    assert r.status_code == 201, r.text
    assert [m["spec"] for m in r.json()["models"]] == ["level", "ar", "trend", "student-t", "seasonal"]
    rng = np.random.default_rng(7)
    y = np.concatenate([rng.normal(250, 20, 120), rng.normal(330, 20, 80)])  # +4 sd at 120
    chunks = [y[i : i + 10] for i in range(0, 200, 10)]
    for seq, c in enumerate(chunks):
        assert live.client.post(f"/v1/streams/{s}/chunks", json={"seq": seq, "rows": [[v] for v in c.tolist()]}).status_code == 202
    drain(redis_url)
    got = live.client.get(f"/v1/streams/{s}/changepoints").json()
    per_model, stream = detect_stream(np.concatenate(chunks), chunk_size=10, seed=4)
    assert [c["location"] for c in got["stream"]] == [c.location for c in stream] == [120]
    by_model = {}
    for e in got["changepoints"]:
        by_model.setdefault(e["model"], []).append(e["location"])
    assert by_model == {m: [e.location for e in evs] for m, evs in per_model.items() if evs}
    info = live.client.get(f"/v1/streams/{s}").json()
    assert {m["name"] for m in info["models"]} == {"level", "ar", "trend", "student-t", "seasonal"}
    assert abs(sum(m["posterior_probability"] for m in info["models"]) - 1.0) < 1e-9


def test_a_value_too_large_for_the_models_is_refused_at_ingest(live, redis_url):
    """A univariate stream of the default portfolio, whose models take values as they are: 1e308
    was accepted (202), failed in the worker three times over 45 s and was dead-lettered by every
    model (a new user's trial). Now a 422 naming the row and column, and nothing is stored."""
    from service.store import connect

    s = "p" + uuid.uuid4().hex[:10]
    assert live.client.post("/v1/streams", json={"name": s, "columns": ["latency_ms"]}).status_code == 201
    before = connect(redis_url).dbsize()
    for value in ("1e308", "-1e200"):
        r = live.client.post(f"/v1/streams/{s}/chunks", content='{"seq": 0, "rows": [[1.0], [' + value + ']]}',
                             headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and "row 1 column 'latency_ms'" in r.json()["detail"], r.text
        assert "values must be within +-1e+150" in r.json()["detail"]
    assert connect(redis_url).dbsize() == before
    assert live.client.post(f"/v1/streams/{s}/chunks", json={"seq": 0, "rows": [[1e150], [-1e150]]}).status_code == 202


def test_several_columns_without_models_get_gaussian_in_a_frame(live, redis_url):
    """Two columns without a model list: ``gaussian:warmup=5``, its frame (one centre and scale per
    column, from the first 5 rows) shown on the stream once the rows are in; the evidence that
    of the model offline."""
    s = "p" + uuid.uuid4().hex[:10]
    r = live.client.post("/v1/streams", json={"name": s, "columns": ["a", "b"]})
    assert r.status_code == 201, r.text
    assert [m["spec"] for m in r.json()["models"]] == ["gaussian:warmup=5"]
    assert live.client.get(f"/v1/streams/{s}").json()["models"][0]["frame"] == {
        "warmup_rows": 5, "centre": None, "scale": None, "periods": None}
    y = np.column_stack([1000 + 5 * np.random.default_rng(3).standard_normal(30), np.arange(30) % 4 + 5e4])
    assert live.client.post(f"/v1/streams/{s}/chunks", json={"seq": 0, "rows": y.tolist()}).status_code == 202
    drain(redis_url)
    got = live.client.get(f"/v1/streams/{s}").json()["models"][0]
    assert got["frame"]["centre"] == pytest.approx(list(y[:5].mean(0)), rel=1e-12)
    assert got["frame"]["scale"] == pytest.approx(list(y[:5].std(0, ddof=1)), rel=1e-12)
    m = build_model("gaussian:warmup=5", 2)
    assert got["log_evidence"] == pytest.approx(m.exact_update(m.exact_init(), m.featurize(torch.from_numpy(y)))[1], rel=1e-12)


def test_an_empty_model_list_is_still_refused(live):
    r = live.client.post("/v1/streams", json={"name": "p" + uuid.uuid4().hex[:10], "columns": ["a"], "models": []})
    assert r.status_code == 422 and "models" in r.text


def test_the_effective_prior_of_each_model_is_shown(live, redis_url):
    """The metric-series models' frame (centre and scale of their warm-up rows) is their
    data-dependent prior: GET /v1/streams/{s} shows it once the warm-up is done (issue 20), and
    `seasonal` without a period its periods' posterior probabilities: the prior's at first, then
    those of the model offline on the same rows."""
    s = "f" + uuid.uuid4().hex[:10]
    assert live.client.post("/v1/streams", json={"name": s, "columns": ["ms"],
                                                  "models": ["level", "gaussian", "seasonal"]}).status_code == 201
    first = live.client.get(f"/v1/streams/{s}").json()["models"]
    assert first[0]["frame"] == {"warmup_rows": 5, "centre": None, "scale": None, "periods": None} and first[1]["frame"] is None
    assert first[2]["frame"]["periods"] == {p: pytest.approx(0.1) for p in ("4", "7", "12", "24", "52.1786", "96", "168",
                                                                          "288", "365.25", "1440")}
    y = [250.0, 260.0, 240.0, 255.0, 245.0, 251.0]
    assert live.client.post(f"/v1/streams/{s}/chunks", json={"seq": 0, "rows": [[v] for v in y]}).status_code == 202
    drain(redis_url)
    models = live.client.get(f"/v1/streams/{s}").json()["models"]
    m = build_model("seasonal", 1)
    post, _ = m.exact_update(m.exact_init(), torch.tensor(y, dtype=torch.float64)[:, None])
    assert models[2]["frame"]["periods"] == {f"{p:g}": pytest.approx(w, rel=1e-12) for p, w in m.period_probabilities(post).items()}
    frame = models[0]["frame"]
    assert frame["centre"] == pytest.approx(np.mean(y[:5]), rel=1e-12)
    assert frame["scale"] == pytest.approx(np.std(y[:5], ddof=1), rel=1e-12)

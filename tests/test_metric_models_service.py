"""`negbin` and `student-t` where users reach them: the API (POST /v1/streams with models, a burst
worker, the frame shown, the same change points as the offline `detect_stream`), bad settings
refused with nothing stored, and `cusp replay`."""

import subprocess
import sys
import uuid

import numpy as np
import pytest

import torch

from models import build_model
from models.registry import default_model_name
from service.detect import DetectorConfig, detect_stream
from service.detect.offline import OfflineRun
from service.seeding import seed_for
from service.sgais import SGAISConfig, build_sampler
from tests.service_fixtures import LiveServer, drain


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url)
    yield server
    server.stop()


def _through_the_api(live, redis_url, column: str, models: list[str], y: np.ndarray, chunk: int, seed: int):
    """``y`` posted to a new stream of ``models`` in chunks of ``chunk``, the worker drained: its change
    points, per model and the stream's, must be the offline detector's for the same data, seed and
    chunks. Returns (per-model events, stream changes, the stream's models by name)."""
    s = "m" + uuid.uuid4().hex[:10]
    r = live.client.post("/v1/streams", json={"name": s, "columns": [column], "seed": seed, "models": models})
    assert r.status_code == 201, r.text
    for seq, lo in enumerate(range(0, len(y), chunk)):
        rows = [[v] for v in y[lo : lo + chunk].tolist()]
        assert live.client.post(f"/v1/streams/{s}/chunks", json={"seq": seq, "rows": rows}).status_code == 202
    drain(redis_url)
    got = live.client.get(f"/v1/streams/{s}/changepoints").json()
    per_model, stream = detect_stream(y, models, chunk_size=chunk, seed=seed)
    by_model = {}
    for e in got["changepoints"]:
        by_model.setdefault(e["model"], []).append(e["location"])
    # (the API names a model by its spec, ':' and '=' and ',' mended: `gmm:components=3` is `gmm_components3`)
    named = {default_model_name(m): m for m in models}
    assert {named[m]: v for m, v in by_model.items()} == {m: [e.location for e in evs] for m, evs in per_model.items() if evs}
    assert [c["location"] for c in got["stream"]] == [c.location for c in stream]
    # each with how late it was found, as a model's event has (a new user saw one found 458 rows late)
    assert [c["delay"] for c in got["stream"]] == [c.detected_at - c.location for c in stream]
    return per_model, stream, {named[m["name"]]: m for m in live.client.get(f"/v1/streams/{s}").json()["models"]}

def _offline_centre(spec: str, y: np.ndarray, chunk: int, seed: int) -> float:
    """The frame's centre of ``spec`` after ``y`` in chunks of ``chunk`` offline with its detector
    (a restart moves it to where the old regime expected the next row)."""
    offline = OfflineRun(build_sampler(build_model(spec, 1), SGAISConfig()), seed, DetectorConfig())
    for lo in range(0, len(y), chunk):
        offline.step(torch.from_numpy(y[lo : lo + chunk, None]))
    return offline.sampler.model.frame(offline.state.post)[0]


def test_counts_and_heavy_tails_through_the_api(live, redis_url):
    """A count series (negative binomial r = 4, mean 40 -> 90 at 150) to a stream of `negbin` and
    `student-t`: the API's change points are the offline detector's, and each model shows its
    frame (negbin: centre 0, scale the warm-up mean; student-t: the scale 1.4826 x the warm-up's
    MAD, the centre where the old regime expected the next row at its last change)."""
    rng = np.random.default_rng(5)
    mean = np.r_[np.full(150, 40.0), np.full(100, 90.0)]
    y = rng.negative_binomial(4, 4 / (4 + mean)).astype(float)
    _, stream, info = _through_the_api(live, redis_url, "errors", ["negbin", "student-t"], y, 10, 3)
    assert len(stream) == 1 and abs(stream[0].location - 150) <= 5, [c.location for c in stream]
    assert info["negbin"]["frame"] == {"warmup_rows": 5, "centre": 0.0, "scale": pytest.approx(float(np.mean(y[:5]))),
                                       "periods": None}
    med = float(np.median(y[:5]))
    # the scale the warm-up's; the centre where the regime before the last change `student-t` adopted
    # expected the next row (its level there, near the old mean of 40): the offline run's, to the bit
    centre = _offline_centre("student-t", y, 10, seed_for(3, 1))
    assert 30 < centre < 50 and info["student-t"]["frame"] == {
        "warmup_rows": 5, "centre": centre, "scale": pytest.approx(1.4826 * float(np.median(np.abs(y[:5] - med)))),
        "periods": None}


def test_a_local_trend_through_the_api(live, redis_url):
    """A bending rise in raw units with a jump (+25, 5 sd, at 200) to a stream of `local-trend` and
    `trend`, in chunks of 10: the API's change points are the offline detector's, bit for bit,
    and `local-trend` shows its frame (the warm-up's sd; the centre where it expected row 200 when it
    restarted there, about 250 + 0.5 x 200 + 0.001 x 200^2 = 390)."""
    t = np.arange(300)
    y = 250 + 0.5 * t + 0.001 * t**2 + np.random.default_rng(1).normal(0, 5, 300)
    y[200:] += 25
    per_model, _, info = _through_the_api(live, redis_url, "ms", ["local-trend", "trend"], y, 10, 4)
    assert [e.location for e in per_model["local-trend"]] == [200]
    centre = _offline_centre("local-trend", y, 10, seed_for(4, 0))
    assert abs(centre - 390) < 15 and info["local-trend"]["frame"] == {
        "warmup_rows": 5, "centre": centre, "scale": pytest.approx(float(np.std(y[:5], ddof=1))), "periods": None}


def test_a_local_seasonal_stream_through_the_api(live, redis_url):
    """Hourly traffic growing with a daily cycle and a shift (+100 at 420 of 600), raw units, to a
    stream of `local-seasonal` in chunks of 24: the API's change points are the offline detector's,
    and the stream shows the period's posterior (24 hours, about 1 here)."""
    t = np.arange(600)
    y = 4000 + 1.5 * t + 60 * np.sin(2 * np.pi * t / 24) + np.random.default_rng([0, 16]).normal(0, 25, 600)
    y[420:] += 100
    _, stream, info = _through_the_api(live, redis_url, "req", ["local-seasonal"], y, 24, 2)
    assert any(abs(c.location - 420) <= 5 for c in stream), [c.location for c in stream]
    assert info["local-seasonal"]["frame"]["periods"]["24"] > 0.99, info


def test_a_framed_mixture_through_the_api(live, redis_url):
    """One column of three clusters at 1e4 with spreads of 1e-2, their weights 1/3 each -> 0.7/0.2/0.1
    at 1,500 of 3,000, to a stream of `gmm:components=3,warmup=120` in chunks of 50: the warm-up
    spans three chunks (kept in the state, through Redis, until its frame is fixed), the API's
    change points are the offline detector's, bit for bit, the change is found within 5 rows of
    1,500 (at 1,499; at 1,550 before ``Detector._within`` scored the chunk before its span when the
    span's first row was the most probable; without the frame, nothing), and the stream shows the
    frame: the first 120 rows' mean and sd."""
    r = np.random.default_rng(7)
    lab = np.r_[r.choice(3, 1500), r.choice(3, 1500, p=[0.7, 0.2, 0.1])]
    y = 1e4 + 1e-2 * (np.array([0.0, 5.0, -5.0])[lab] + r.standard_normal(3000))
    spec = "gmm:components=3,warmup=120"
    _, stream, info = _through_the_api(live, redis_url, "x", [spec], y, 50, 1)
    assert len(stream) == 1 and abs(stream[0].location - 1500) <= 5, [c.location for c in stream]
    assert info[spec]["frame"] == {"warmup_rows": 120, "centre": [pytest.approx(float(np.mean(y[:120])), rel=1e-12)],
                                   "scale": [pytest.approx(float(np.std(y[:120], ddof=1)), rel=1e-9)], "periods": None}


@pytest.mark.parametrize("spec,option", [("negbin:per_decade=0", "per_decade"), ("gmm:warmup=1", "warmup"), ("student-t:nu=-2", "nu"),
                                         ("negbin:dispersion=3", "dispersion"), ("student-t:warmup=1", "warmup"),
                                         ("local-trend:discount=1.5", "discount"), ("local-trend:coef_scale=0", "coef_scale"),
                                         ("local-seasonal:period=2", "period"), ("local-seasonal:season_discount=0", "season_discount")])
def test_bad_settings_are_refused_with_nothing_stored(live, spec, option):
    s = "b" + uuid.uuid4().hex[:10]
    r = live.client.post("/v1/streams", json={"name": s, "columns": ["x"], "models": [spec]})
    assert 400 <= r.status_code < 500 and option in r.text, r.text
    assert live.client.get(f"/v1/streams/{s}").status_code == 404


def test_replay_runs_both_and_shows_their_frames(tmp_path):
    rng = np.random.default_rng(2)
    y = np.r_[rng.negative_binomial(4, 4 / 44, 120), rng.negative_binomial(4, 4 / 104, 80)].astype(int)
    p = tmp_path / "errors.csv"
    p.write_text("errors\n" + "\n".join(str(v) for v in y) + "\n")
    out = subprocess.run([sys.executable, "-m", "service.cli", "replay", str(p), "--model", "negbin", "--model", "student-t",
                          "--chunk-size", "10", "--detect", "--out", str(tmp_path / "t.jsonl")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"negbin: prior on (y - centre) / scale, centre 0, scale {float(np.mean(y[:5])):.10g}" in out.stderr, out.stderr
    assert "student-t: prior on (y - centre) / scale, centre" in out.stderr
    assert "stream (model-averaged): change point at observation" in out.stderr
    # eight years of monthly values with a yearly season: seasonal prints its periods' posterior (12: 0.963)
    t = np.arange(96)
    p.write_text("sales\n" + "\n".join(f"{v:.4f}" for v in 100 + 20 * np.sin(2 * np.pi * t / 12) + rng.normal(0, 2, 96)) + "\n")
    out = subprocess.run([sys.executable, "-m", "service.cli", "replay", str(p), "--model", "seasonal"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stderr.splitlines() if "period (observations) posterior" in ln)
    probs = dict(kv.split(": ") for kv in line.split("posterior ")[1].split(", "))
    assert max(probs, key=lambda k: float(probs[k])) == "12" and float(probs["12"]) > 0.9, line
    p.write_text("errors\n" + "\n".join(str(v) for v in y[:30]) + "\n2.5\n")
    bad = subprocess.run([sys.executable, "-m", "service.cli", "replay", str(p), "--model", "negbin"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "counts must be whole numbers" in bad.stderr, bad.stderr


def test_a_refused_model_is_named_as_the_request_gave_it(live):
    """The error names the spec the user sent (not the stream's derived name, 'local-trend_discount2'),
    and the name too where the request gave one."""
    r = live.client.post("/v1/streams", json={"name": "n" + uuid.uuid4().hex[:8], "columns": ["x"],
                                              "models": ["local-trend:discount=2"]})
    assert r.status_code == 422 and "model 'local-trend:discount=2': local-trend: discount must be" in r.text, r.text
    r = live.client.post("/v1/streams", json={"name": "n" + uuid.uuid4().hex[:8], "columns": ["x"],
                                              "models": [{"spec": "level:warmup=1", "name": "base"}]})
    assert r.status_code == 422 and "model 'base' ('level:warmup=1'): level: warmup" in r.text, r.text


def test_a_value_a_count_model_refuses_is_named_by_its_column(live):
    """As every other chunk error does: column 'errors', not "column 0" (a new user's trial); and
    nothing stored: the stream still expects seq 0."""
    s = "n" + uuid.uuid4().hex[:8]
    assert live.client.post("/v1/streams", json={"name": s, "columns": ["errors"], "models": ["poisson", "negbin"]}).status_code == 201
    r = live.client.post(f"/v1/streams/{s}/chunks", json={"seq": 0, "rows": [[0], [1.5]]})
    assert r.status_code == 422 and "row 1, column 'errors' has 1.5" in r.text, r.text
    assert live.client.get(f"/v1/streams/{s}").json()["next_seq"] == 0


def test_a_stream_of_sparse_counts_says_so_where_no_count_model_reads_it(live):
    """A new user's hourly error counts on a default stream: `student-t` took all the weight and GET
    said nothing, where `cusp replay` named the count models. The ingest counts whole numbers >= 0,
    zeros and the largest value per column; GET notes sparse counts as ``POST /v1/detect`` does, and
    ``cusp_stream_sparse_counts`` is 1. A resend counts nothing; count models alone, or readings that
    are not whole numbers, get no note."""
    y = np.random.default_rng(1).poisson(0.3, 60).astype(float)  # 58 % zeros; 60 % were the resend counted
    names = {k: "n" + uuid.uuid4().hex[:8] for k in ("default", "counts", "float")}
    bodies = {"default": {"columns": ["errors"]}, "counts": {"columns": ["errors"], "models": ["poisson", "negbin"]},
              "float": {"columns": ["errors"]}}
    for k, s in names.items():
        assert live.client.post("/v1/streams", json={"name": s, **bodies[k]}).status_code == 201
        data = y + 0.5 if k == "float" else y
        for seq, lo in enumerate(range(0, 60, 10)):
            body = {"seq": seq, "rows": [[v] for v in data[lo : lo + 10].tolist()]}
            assert live.client.post(f"/v1/streams/{s}/chunks", json=body).status_code == 202
            if seq == 2:  # a resend: answered 200, counted once
                assert live.client.post(f"/v1/streams/{s}/chunks", json=body).status_code == 200
    got = live.client.get(f"/v1/streams/{names['default']}").json()
    zeros = int((y == 0).sum())
    assert got["notes"] == [f"column 'errors' holds whole numbers from 0 to {y.max():g}, {zeros / 60:.0%} of them 0: counts? "
                            "These models read it as a continuous reading; on sparse counts student-t can take chance bumps "
                            "for changes (README, Models for metric series): for counts, name poisson or negbin, without "
                            "student-t (its narrow density on the zeros outweighs their probabilities)"], got["notes"]
    assert live.client.get(f"/v1/streams/{names['counts']}").json()["notes"] == []
    assert live.client.get(f"/v1/streams/{names['float']}").json()["notes"] == []
    text = live.client.get("/metrics").text
    assert f'cusp_stream_sparse_counts{{stream="{names["default"]}"}} 1.0' in text
    assert f'cusp_stream_sparse_counts{{stream="{names["counts"]}"}} 0.0' in text


def test_a_stream_deleted_through_another_api_replica_leaves_no_gauges_here(live):
    """The scrape sets these gauges for every stream it reads; a stream deleted through another
    replica was forgotten only there (a review): the next scrape here drops its series."""
    from service import metrics as M

    ghost = "g" + uuid.uuid4().hex[:8]  # no such stream: as one another replica deleted
    M.SPARSE_COUNTS.labels(ghost).set(1)
    M.MODEL_POSTERIOR.labels(ghost, "level").set(0.5)
    M.INGEST_LAG.labels(ghost, "level").set(3)
    assert ghost not in live.client.get("/metrics").text

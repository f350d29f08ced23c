"""bench.detect: the TCPD metrics against hand-computed values, the TCPD reader, the BOCPD peer,
the synthetic suite, the report writer and a quick end-to-end smoke run of ``cusp bench detect``."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import bench
from bench import detect as B

FIXTURE = Path(__file__).parent / "data" / "tcpd"


# --- metrics ------------------------------------------------------------------------------------


def test_true_positives_match_each_prediction_once():
    # TCPDBench's own examples
    assert B.true_positives({1, 10, 20, 23}, {3, 8, 20}) == {1, 10, 20}
    assert B.true_positives({1, 10, 20, 23}, {1, 3, 5, 8, 20}) == {1, 10, 20}
    assert B.true_positives(set(), {1, 2, 3}) == set() and B.true_positives({1, 2, 3}, set()) == set()
    # two true points 2 apart, one prediction between them: only one of them is matched
    assert B.true_positives([10, 12], [11]) == {10}
    assert B.true_positives([10, 12], [11, 13]) == {10, 12}
    assert B.true_positives([10], [16]) == set() and B.true_positives([10], [15]) == {10}  # margin 5 inclusive


def test_f_measure_hand_computed():
    # TCPDBench's doctests
    assert B.f_measure({1: [10, 20], 2: [11, 20], 3: [10], 4: [0, 5]}, [10, 20]) == 1.0
    assert B.f_measure({1: [], 2: [10], 3: [50]}, [10]) == pytest.approx(0.9090909090909091, abs=1e-15)
    assert B.f_measure({1: [], 2: [10], 3: [50]}, []) == pytest.approx(0.8, abs=1e-15)
    # by hand: X = {0, 11, 30}; union {0, 10, 12, 50}: 0 and 10 matched (11 used once) -> P = 2/3;
    # annotator a {0, 10, 50}: 2/3, annotator b {0, 12}: 2/2 -> R = 5/6; F1 = 2PR / (P + R) = 20/27
    f, p, r = B.f_measure({"a": [10, 50], "b": [12]}, [11, 30], return_pr=True)
    assert (p, r) == (pytest.approx(2 / 3), pytest.approx(5 / 6)) and f == pytest.approx(20 / 27)
    # index 0 in the predictions changes nothing (it is always there)
    assert B.f_measure({"a": [10]}, [0, 10]) == B.f_measure({"a": [10]}, [10]) == 1.0
    with pytest.raises(ValueError):
        B.f_measure({}, [1])


def _covering_reference(annotations, predictions, n_obs):
    """TCPDBench's set-based covering (analysis/scripts/metrics.py), for comparison."""
    def partition(locs):
        part, cur, cps = [], set(), iter(sorted(set(locs)))
        cp = next(cps, None)
        for i in range(n_obs):
            if i == cp:
                if cur:
                    part.append(cur)
                cur = set()
                cp = next(cps, None)
            cur.add(i)
        part.append(cur)
        return part

    def cover(sp, s):
        return sum(len(r) * max(len(r & q) / len(r | q) for q in sp) for r in s) / n_obs

    px = partition(predictions)
    return sum(cover(px, partition(a)) for a in annotations.values()) / len(annotations)


def test_covering_hand_computed_and_against_the_set_version():
    # TCPDBench's doctests
    assert B.covering({1: [10, 20], 2: [10], 3: [0, 5]}, [10, 20], 45) == pytest.approx(0.7962962962962963, abs=1e-15)
    assert B.covering({1: [], 2: [10], 3: [40]}, [10], 45) == pytest.approx(0.7954144620811286, abs=1e-15)
    assert B.covering({1: [], 2: [10], 3: [40]}, [], 45) == pytest.approx(0.8189300411522634, abs=1e-15)
    assert B.cover_single([(1, 4), (4, 6), (6, 7)], [(1, 4), (4, 7)]) == pytest.approx(0.8333333333333334)
    assert B.cover_single([(1, 5), (5, 7)], [(1, 7)]) == pytest.approx(2 / 3)
    assert B.cover_single([(1, 7)], [(1, 2), (2, 3), (3, 4), (4, 7)]) == pytest.approx(1 / 3)
    # by hand, n = 10: truth [0,5) [5,10), prediction [0,3) [3,10): 5 x 3/5 + 5 x 5/7 over 10 = 46/70;
    # a second annotator with no change: [0,10) best covered by [3,10): 0.7 -> mean 95/140
    assert B.covering({"a": [5]}, [3], 10) == pytest.approx(46 / 70)
    assert B.covering({"a": [5], "b": []}, [3], 10) == pytest.approx(95 / 140)
    assert B.covering({"a": [5]}, [5], 10) == 1.0
    assert B.segments([0, 3, 3, 12, -1], 10) == [(0, 3), (3, 10)]
    # the interval version equals the set version on random cases
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(8, 60))
        ann = {k: sorted(rng.choice(n, int(rng.integers(0, 5)), replace=False).tolist()) for k in range(int(rng.integers(1, 4)))}
        pred = sorted(rng.choice(n, int(rng.integers(0, 8)), replace=False).tolist())
        assert B.covering(ann, pred, n) == pytest.approx(_covering_reference(ann, pred, n), abs=1e-12)


def test_detection_delays():
    # changes at 100 and 200 of 300; reports seen after 90 (before the change), 130, 150, 260
    assert B.detection_delays([100, 200], [90, 130, 150, 260], 300) == [30, 60]
    assert B.detection_delays([100, 200], [90, 201], 300) == [None, 1]  # 201 is the next regime's
    assert B.detection_delays([100], [100], 300) == [None]  # at 100 it had not seen row 100 yet
    assert B.detection_delays([100], [None, 101], 300) == [1]
    assert B.detection_delays([], [5], 10) == []


# --- TCPD format ----------------------------------------------------------------------------------


def test_read_tcpd_fixture_is_the_statsmodels_nile_with_tcpd_annotations():
    (s,) = B.read_tcpd(FIXTURE)
    assert s.key == "tcpd:nile" and s.n == 100 and s.data.shape == (100, 1) and s.chunk == 1
    assert s.annotations == B.NILE_ANNOTATIONS and s.changes == (28,)
    assert abs(s.data.mean()) < 1e-12 and s.data.std(ddof=1) == pytest.approx(1.0)  # TCPDBench's normalisation
    name, raw, labels = B.read_tcpd_dataset(FIXTURE / "datasets" / "nile" / "nile.json")
    assert name == "nile" and labels == ["Volume at Aswan"] and raw[:3, 0].tolist() == [1120, 1160, 963]
    nile = B.nile_series()
    np.testing.assert_allclose(nile.data, s.data, rtol=0, atol=1e-12)
    assert nile.annotations == s.annotations


def test_write_and_read_tcpd_with_missing_values_and_several_columns(tmp_path):
    x = np.array([[np.nan, 1.0], [2.0, 2.5], [np.nan, 3.0], [4.0, np.nan], [5.0, 5.0]])
    path = B.write_tcpd(tmp_path, "tiny", x, {"1": [2], "2": []})
    obj = json.loads(path.read_text())
    assert obj["n_obs"] == 5 and obj["n_dim"] == 2 and obj["series"][0]["raw"][:2] == [None, 2.0]
    # missing values (JSON null) are carried forward (leading ones back)
    _, raw, _ = B.read_tcpd_dataset(path)
    assert raw[:, 0].tolist() == [2.0, 2.0, 2.0, 4.0, 5.0] and raw[:, 1].tolist() == [1.0, 2.5, 3.0, 3.0, 5.0]
    B.write_tcpd(tmp_path, "other", np.arange(6.0), {"1": [3]})
    (tmp_path / "results.json").write_text("[1, 2]")  # not a data set: ignored
    got = {s.key: s for s in B.read_tcpd(tmp_path)}
    assert set(got) == {"tcpd:tiny", "tcpd:other"} and got["tcpd:tiny"].changes == (2,)
    with pytest.raises(FileNotFoundError):
        B.read_tcpd(tmp_path / "datasets" / "tiny")


# --- peers ----------------------------------------------------------------------------------------


def test_bocpd_predictive_and_posterior_by_hand():
    b = B.BOCPD()
    # the prior predictive of NIG(0, 1, 1, 1) is a Student-t, 2 dof, scale^2 = beta (kappa + 1) / (alpha kappa) = 2
    lp = b._log_predictive(np.array([0.7]), np.zeros(1, dtype=np.int64), np.zeros((1, 1)), np.ones((1, 1)))
    assert lp[0] == pytest.approx(stats.t.logpdf(0.7, df=2, scale=math.sqrt(2)), abs=1e-12)
    x0, x1 = 0.3, 2.0
    b.update([x0]).update([x1])
    # after x0 the run of length 1 has mu = x0 / 2, kappa 2, alpha 3/2, beta = 1 + x0^2 / 4
    grow = 0.99 * stats.t.pdf(x1, df=3, loc=x0 / 2, scale=math.sqrt((1 + x0**2 / 4) * 3 / (1.5 * 2)))
    new = 0.01 * stats.t.pdf(x1, df=2, scale=math.sqrt(2))
    post = dict(zip(b._runs.tolist(), np.exp(b._logp).tolist()))
    assert post == {1: pytest.approx(new / (new + grow)), 2: pytest.approx(grow / (new + grow))}


def test_bocpd_finds_a_large_shift_and_pruning_keeps_the_map():
    rng = np.random.default_rng(7)
    x = np.r_[rng.standard_normal(200), 5 + rng.standard_normal(200)][:, None]
    out = B.run_bocpd(x)
    assert out.locations and all(abs(loc - 200) <= 2 for loc in out.locations)
    assert all(at - 200 <= 5 for at in out.detected_at)
    pruned, full = B.BOCPD(), B.BOCPD(prune=-np.inf, max_runs=10**6)
    for v in x[:120]:
        pruned.update(v)
        full.update(v)
        assert pruned._map == full._map
    # two columns: a change in one of them
    x2 = np.column_stack([rng.standard_normal(400), x[:, 0]])
    assert all(abs(loc - 200) <= 2 for loc in B.run_bocpd(x2).locations)


def test_river_and_ruptures_peers_on_a_clear_shift():
    rng = np.random.default_rng(3)
    x = np.r_[rng.standard_normal(300), 4 + rng.standard_normal(300)][:, None]
    for m in ("ADWIN", "PageHinkley"):
        out = B.run_method(m, B.Series("s", "s", "", x, (300,), {"t": [300]}, "gaussian", 10))
        assert out.ok and any(300 <= at <= 400 for at in out.detected_at), (m, out)
    for m in ("PELT", "BinSeg"):
        out = B.run_method(m, B.Series("s", "s", "", x, (300,), {"t": [300]}, "gaussian", 10))
        assert out.ok and out.detected_at == [None] * len(out.locations) and any(abs(loc - 300) <= 5 for loc in out.locations)
    big = B.Series("s", "s", "", np.zeros((B.RUPTURES_MAX_N["PELT"] + 1, 1)), (), {"t": []}, "gaussian", 10)
    assert B.run_method("PELT", big).skipped
    # per-column reports of the same change are merged
    assert B._merge_columns([(310, 300), (312, 303), (400, 390)]) == ([300, 390], [310, 400])


# --- suite -----------------------------------------------------------------------------------------


def test_suite_generators():
    for made, cols, spec in ((B.mean_shift(0, 2.0), 1, "gaussian"), (B.variance_shift(0, 1.0, 3.0), 1, "gaussian"),
                             (B.multivariate_mean_shift(0), 5, "gaussian"), (B.regression_change(0), 4, "linear-regression"),
                             (B.class_balance_change(0), 3, "logistic-regression:classes=2")):
        data, changes, s, chunk = made
        assert data.dtype == np.float64 and data.shape[1] == cols and s == spec and chunk >= 1
        assert all(0 < c < data.shape[0] for c in changes)
    x, ch, _, _ = B.mean_shift(1, 4.0)
    assert np.array_equal(x, B.mean_shift(1, 4.0)[0]) and not np.array_equal(x, B.mean_shift(2, 4.0)[0])
    assert abs(x[ch[0]:ch[1]].mean() - 4) < 0.3 and abs(x[: ch[0]].mean()) < 0.3
    y, _, _, _ = B.class_balance_change(0)
    rates = [y[a:b, -1].mean() for a, b in ((0, 1000), (1000, 2000), (2000, 3000))]
    assert rates[0] < 0.4 and rates[1] > 0.6 and 0.3 < rates[2] < 0.5 and set(np.unique(y[:, -1])) == {0.0, 1.0}
    items = B.suite(quick=True)
    keys = [s.key for s in items]
    assert len(keys) == len(set(keys)) and "mean-2/pointwise" in keys and "clusters/K=5" in keys
    by = {s.key: s for s in items}
    assert by["clusters/K=5"].changes == (1000, 10000) and by["clusters/K=5"].chunk == 500
    assert by["clusters-shuffled/K=5"].kind == "stationary" and by["stationary-5d"].data.shape[1] == 5
    assert by["clusters-drop/K=5"].changes == (5000, 6000, 15000) and by["clusters-drop/K=5"].data.shape == (35_000, 2)
    assert by["mean-2/pointwise"].chunk == 1 and by["mean-2/pointwise"].data_key == by["mean-2"].data_key
    off = by["class-balance/off-grid"].changes  # drawn per seed, off the chunk grid of 50 (``Detector._within``)
    assert 801 <= off[0] < 1200 and 1801 <= off[1] < 2200 and by["class-balance/off-grid"].chunk == 50


# --- report ---------------------------------------------------------------------------------------


def test_command_line_errors(tmp_path, capsys):
    assert bench.main(["detect", "--methods", "nope", "--out", str(tmp_path / "b.md")]) == 2
    assert "unknown method" in capsys.readouterr().err
    assert bench.main(["detect", "--only", "no-such-data-set", "--out", str(tmp_path / "b.md")]) == 2
    assert not (tmp_path / "b.md").exists()
    assert bench.main(["detect", "--help"]) == 0
    assert "--tcpd" in capsys.readouterr().out


def test_smoke_quick_run_writes_only_its_section(tmp_path):
    out = tmp_path / "benchmarks.md"
    out.write_text("# Benchmarks\n\n## 1. Paper\n\nkept\n")
    rc = bench.main(["detect", "--quick", "--only", "mean-4", "--only", "tcpd:*", "--tcpd", str(FIXTURE),
                     "--out", str(out), "--json", str(tmp_path / "r.json")])
    assert rc == 0
    doc = out.read_text()
    assert doc.startswith("# Benchmarks\n\n## 1. Paper\n\nkept\n\n<!-- cusp bench detect: begin -->\n## Change-point detection\n")
    assert doc.count("## Change-point detection") == 1
    for needle in ("| mean-4 |", "| tcpd:nile |", "### F1 (margin 5)", "### Segmentation covering", "Machine (`lscpu`)"):
        assert needle in doc, needle
    rows = {r["key"]: r for r in json.loads((tmp_path / "r.json").read_text())}
    assert set(rows) == {"mean-4", "tcpd:nile"}
    for key, r in rows.items():
        assert set(r["methods"]) == set(B.METHODS)
        for m, o in r["methods"].items():
            if m == "cusp" and B.cusp_available():
                assert o["skipped"]
                continue
            assert not o["error"], (key, m, o["error"])
            assert 0 <= o["score"]["f1"] <= 1 and 0 <= o["score"]["cover"] <= 1
            assert all(0 < loc < r["n"] for loc in o["locations"])
    # BOCPD finds the Nile's change (TCPD's index 28) within the margin
    assert any(abs(loc - 28) <= 5 for loc in rows["tcpd:nile"]["methods"]["BOCPD"]["locations"])
    # rerunning replaces the section instead of adding a second one
    assert bench.main(["detect", "--quick", "--only", "nile", "--methods", "BOCPD,PELT", "--out", str(out)]) == 0
    doc2 = out.read_text()
    assert doc2.count("## Change-point detection") == 1 and "| mean-4 |" not in doc2 and "kept" in doc2


def test_paper_summary_adds_the_model_averaged_stream_row():
    # two GMMs on the clusters: K=3 misses 1,000 and has posterior weight ~0; the stream row
    # takes K=5's events; on the shuffled rows one model's lone event at half weight is no alarm
    x = np.zeros((2000, 2))
    ns = [500, 1000, 1500, 2000]

    def result(key, k, locs, ats, confs, logz_per_obs, changes=(1000,)):
        s = B.Series(key=key, group=key, title=key, data=x, changes=changes, annotations={"truth": list(changes)},
                     spec=f"gmm:components={k}", chunk=500)
        o = B.Outcome("cusp", locs, ats, confidences=confs, evidence=[(n, logz_per_obs * n) for n in ns])
        return B.Result(s, {"cusp": o}, {})

    res = [result("clusters/K=3", 3, [], [], [], -4.5), result("clusters/K=5", 5, [1000], [1500], [0.999], -4.0),
           result("clusters-shuffled/K=3", 3, [700], [1000], [0.999], -4.0, ()),
           result("clusters-shuffled/K=5", 5, [], [], [], -4.0, ())]
    rows = B.paper_summary(res)
    assert [r["K"] for r in rows] == ["3", "5", "3, 5 (model-averaged)"]
    assert [r["within_chunk"] for r in rows] == [False, True, True]
    avg = rows[-1]
    assert avg["changes"][0]["location"] == 1000 and avg["changes"][0]["delay"] == 500
    assert avg["changes"][0]["support"] == {"K=5": 1.0}
    assert avg["shuffled_alarms"] == 0 and rows[0]["shuffled_alarms"] == 1
    text = B.render(res, ["cusp"], quick=False, elapsed=1.0, tcpd_dirs=[])
    assert "3, 5 (model-averaged)" in text and "K=5 1" in text

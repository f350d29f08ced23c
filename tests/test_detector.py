"""cusp.Detector in-process (issue 17, item 3): the same numbers as ``service.detect.detect_stream``
for the same data, seed and chunking; buffering into chunks; bad input refused before anything
is processed. Its agreement with a running service: tests/test_client.py."""

import numpy as np
import pytest

import cusp
from service.detect import DetectorConfig, detect_stream


def shifted(n=300, shift=3.0, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(0, 1, n), rng.normal(shift, 1, n)]).round(4)


def test_same_numbers_as_detect_stream_and_the_change_found():
    x = shifted()
    det = cusp.Detector(chunk_size=20, seed=5, threshold=0.995).update(x)
    events, changes = detect_stream(x, chunk_size=20, seed=5, config=DetectorConfig(threshold=0.995))
    assert det.names == ["level", "ar", "trend", "student-t"] and det.n == 600 and det.pending == 0
    assert det.events == events
    assert [c.location for c in det.changepoints] == [c.location for c in changes] == [300]
    assert det.changepoints[0].confidence >= 0.995
    assert det.evidence["level"] == det.results["level"][-1].log_evidence
    assert sum(det.probabilities.values()) == pytest.approx(1.0) and max(det.probabilities, key=det.probabilities.get) == "level"


def test_point_by_point_buffered_equals_one_call():
    x = shifted(100)
    whole = cusp.Detector(chunk_size=10).update(x)
    points = cusp.Detector(chunk_size=10)
    for v in x[:-5]:
        points.update(float(v))
    assert points.pending == 5 and points.n == 190
    points.update(x[-5:])
    assert [[r.log_evidence for r in rs] for rs in points.results.values()] == \
           [[r.log_evidence for r in rs] for rs in whole.results.values()]
    assert points.events == whole.events
    # without chunk_size every update is one chunk, as every POST is for the service
    single = cusp.Detector(models=["level"])
    single.update(x[:7]).update(x[7:9])
    assert single.chunks == [(0, 7), (7, 2)] and single.flush().n == 9


def test_rows_columns_and_user_settings():
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(40, 2))
    det = cusp.Detector(models=["gaussian", "gmm:components=2"], columns=2, seed=1, enabled=False,
                        sampler_settings={"particles": 8}, priors={"gaussian": 3.0})
    det.update(rows[0])  # a row of a two-column detector
    det.update(rows[1:])
    assert det.n == 40 and len(det.results["gaussian"]) == 2 and det.changepoints == []
    assert det.results["gmm:components=2"][-1].method == "sgais"
    det.reset()
    assert det.n == 0 and det.evidence == {"gaussian": 0.0, "gmm:components=2": 0.0}


@pytest.mark.parametrize("kwargs, message", [
    ({"models": ["nope"]}, "models\\[0\\]: unknown model 'nope'; known models: ar, gaussian"),
    ({"models": ["gmm:components=x"], "columns": 1}, "model 'gmm:components=x': .*components='x' is not a valid int"),
    ({"models": []}, "non-empty list"),
    ({"models": ["level", "level"]}, "listed twice"),
    ({"chunk_size": 0}, "chunk_size must be an integer >= 1"),
    ({"seed": -1}, "seed must be an integer"),
    ({"threshold": 2}, "detector: threshold must be a probability"),
    ({"colour": "red"}, "unknown detector setting\\(s\\) colour"),
    ({"sampler": "fast"}, "sampler: unknown sampler preset 'fast'"),
    ({"sampler_settings": {"particles": -1}}, "sampler: "),
    ({"priors": {"level": 0}, "models": ["level"]}, "priors\\['level'\\] must be a positive finite number"),
    ({"models": ["linear-regression"], "columns": 1}, "model 'linear-regression': .*needs at least 2 columns"),
])
def test_bad_settings_raise_input_error_naming_them(kwargs, message):
    with pytest.raises(cusp.InputError, match=message):
        cusp.Detector(**kwargs)


def test_bad_data_is_refused_before_any_model_sees_it():
    det = cusp.Detector(models=["level", "poisson"], chunk_size=4)
    det.update([1.0, 2.0, 3.0])
    before = (det.n, det.pending, det.evidence)
    for bad, message in [(float("nan"), "row 0, column 0 is nan"), ([], "x is empty"), ("x", "must be a number"),
                         ([[1.0, 2.0]], "rows of 2 values, but this detector's data have 1 columns"),
                         ([[[1.0]]], "3 dimensions"), (-1.0, "model 'poisson': ")]:
        with pytest.raises(cusp.InputError, match=message):
            det.update(bad)
        assert (det.n, det.pending, det.evidence) == before

"""A small run of ``cusp bench load`` (bench/load.py) in the default test run: correctness only,
no timing assertions. API and worker run as threads of this process (the benchmark runs them as
processes) on an embedded redis-server; 8 clients post to 4 streams while 4 subscribers listen."""

import pytest

from bench.load import LoadConfig, load, report

# result_maxlen 10 with 10-entry stream nodes: 30 results per stream must be trimmed to at most 20
CONFIG = LoadConfig(clients=8, streams=4, chunks=30, rows=20, workers=1, model="gaussian", result_maxlen=10, node_entries=10,
                    time_limit=60, drain_limit=60, seed=3)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return load(CONFIG, tmp_path_factory.mktemp("load"), processes=False)


def test_load_no_errors_no_lost_or_duplicated_results(run):
    assert run.problems == []
    assert run.posted == {f"load{i:03d}": 30 for i in range(4)}  # every chunk acknowledged within the limits
    f = run.figures
    assert f["chunks"] == 120 and f["rows"] == 2400
    assert f["subscriber_connections_during"] == 4
    assert f["out_len_max"] <= 20  # result streams trimmed
    assert "**all passed**" in report(run, "pytest")


def test_load_inbox_trimmed(run):
    """Input entries go once every model applied them, except the detector's recent window, which
    it re-reads on restore: with 20 rows per chunk and the gaussian model's max_age of 200
    observations, at most 200 / 20 chunks plus the one being started."""
    assert run.figures["inbox_len_max"] <= 200 // 20 + 1, run.figures["inbox_len_max"]
    assert run.figures["inbox_trimmed"]

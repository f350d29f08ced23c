"""The yardstick of ``cusp bench speed`` (bench/plain.py) is a working SGAIS: on 2,000 rows of
linear regression its log-evidence is near the exact value, as a plain SGAIS's should be; and the
benchmark writes its section from real runs (tiny sizes here)."""

import numpy as np
import pytest
import torch

from bench import speed
from bench.plain import sgais
from models import build_model


def test_plain_sgais_is_near_the_exact_evidence():
    # measured over seeds 0-4 at n = 2,000 (chunks of 500): -11.0, -13.8, -29.9, -4.2, -10.4 nats
    # (mean -13.9, sd 9.5); a sign error or a wrong mini-batch scale is off by thousands
    errs = []
    for seed in range(3):
        r = np.random.default_rng(seed)
        x = r.standard_normal((2000, 5))
        y = x @ r.standard_normal(5) + 0.5 + r.standard_normal(2000)
        m = build_model("linear-regression", 6)
        exact = m.exact_log_evidence(m.featurize(torch.from_numpy(np.column_stack([x, y]))))
        errs.append(sgais(torch.from_numpy(x), torch.from_numpy(y), seed=seed) - exact)
    assert all(-60 < e < 5 for e in errs), errs


def test_bench_speed_writes_its_section(tmp_path):
    out = tmp_path / "b.md"
    import argparse

    p = argparse.ArgumentParser()
    speed.add_arguments(p)
    assert speed.run(p.parse_args(["--rows", "1500", "--repeats", "1", "--out", str(out)])) == 0
    text = out.read_text()
    assert "## Speed against a plain SGAIS" in text and "plain SGAIS" in text and "exact, the default" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "(s)" not in line and "---" not in line]
    assert len(rows) == 3
    errors = [float(r.split("|")[6]) for r in rows]
    assert errors[2] == pytest.approx(0.0)  # the exact row is the reference itself

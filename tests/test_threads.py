"""One BLAS thread per cusp process (service/cli.py, which every `cusp` command loads first): numpy's OpenBLAS otherwise starts a
thread per core, and their spinning beside another busy process made a mixture run 4x slower
(measured: the late clusters, seed 4, 1.3 -> 5.2 s a run with one other busy process on 2 cores).
Each check runs in a fresh interpreter, whose environment has none of the settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from service.cli import BLAS_THREAD_VARS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARS = BLAS_THREAD_VARS

# the BLAS thread count numpy's OpenBLAS will use, read from the library numpy loaded
_PROBE = r"""
import ctypes, json, os, sys
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "service":
    import service.cli  # noqa: F401 - what `cusp` imports first
import numpy as np
a = np.random.rand(300, 300); a @ a
threads = None
for line in open("/proc/self/maps"):
    path = line.split()[-1]
    if "openblas" in path.lower() and ".so" in path:
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads"):
            if hasattr(lib, name):
                threads = getattr(lib, name)()
                break
        if threads is not None:
            break
print(json.dumps({"threads": threads, "env": {v: os.environ.get(v) for v in %r}}))
""" % (VARS,)


def _probe(first: str, **env) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in VARS}
    done = subprocess.run([sys.executable, "-c", _PROBE, ROOT, first], env={**clean, **env}, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_cusp_runs_one_blas_thread_and_keeps_a_setting_given():
    got = _probe("service")
    assert got["env"] == dict.fromkeys(VARS, "1")
    if got["threads"] is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS whose thread count can be read")
    assert got["threads"] == 1
    if (os.cpu_count() or 1) > 1:  # the check can fail: without cusp first, OpenBLAS takes every core
        assert _probe("numpy")["threads"] > 1
    assert _probe("service", OPENBLAS_NUM_THREADS="2")["env"]["OPENBLAS_NUM_THREADS"] == "2"

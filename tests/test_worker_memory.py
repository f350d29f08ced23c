"""A worker's memory is bounded however many pairs it holds (issue 18 item 3): beyond
CUSP_WORKER_WARM_BYTES the least recently used pairs cool (state, reservoir and detector let go,
the lease kept) and are reloaded from Redis for their next chunk. A cooled pair's results are the
same bits as a pair kept warm throughout. Real Redis, real HTTP, real workers."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from service import metrics as M
from service.worker import Worker
from tests.service_fixtures import LiveServer

TIMES = ("id", "seconds", "time_start", "time_end", "location_time", "detected_time", "delay_seconds")


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url)
    yield server
    server.stop()


def entries(live, s: str) -> list[dict]:
    got = live.client.get(f"/v1/streams/{s}/evidence", params={"limit": 10_000}).json()["results"]
    # per model in apply order (the two workers interleave the models differently)
    return sorted(({k: v for k, v in e.items() if k not in TIMES} for e in got), key=lambda e: (e["model"], e["kind"]))


def run(redis_url: str, warm_bytes: int) -> Worker:
    w = Worker(redis_url, batch=2, warm_bytes=warm_bytes)
    try:
        w.run_until_idle()
    finally:
        w.release_all()
    return w


def test_cooled_pairs_give_the_same_bits_as_warm_ones(live, redis_url):
    """Two streams, the same data and seed, a mixture (SGAIS: particles, a random stream, a
    reservoir) and a Gaussian (exact), with the detector and a change at 200. One is processed by
    a worker without a limit; the other by one whose limit (1 byte) cools every pair after every
    poll of two chunks, so each of its pairs is reloaded from Redis about 10 times."""
    g = np.random.default_rng(3)
    x = np.r_[g.normal(0, 1, 200), g.normal(3, 1, 200)]
    names = [f"mem-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    for s in names:
        r = live.client.post("/v1/streams", json={"name": s, "columns": ["v"], "seed": 11,
                                                   "models": ["gaussian", "gmm:components=2"]})
        assert r.status_code == 201, r.text
    post = lambda s: [live.client.post(f"/v1/streams/{s}/chunks", json={"seq": q, "rows": x[20 * q:20 * q + 20, None].tolist()})  # noqa: E731
                      for q in range(20)]
    assert all(r.status_code == 202 for r in post(names[0]))
    run(redis_url, 0)
    # what its two warm pairs were counted as at its last poll: at least their reservoirs' first
    # buffers (1,024 rows of 1 value; the mixture's particles and the detector's data come on top)
    assert M.WORKER_WARM_BYTES._value.get() >= 2 * 1024 * 8
    reloads = M.WORKER_RELOADS._value.get()
    assert all(r.status_code == 202 for r in post(names[1]))
    w = run(redis_url, 1)
    assert M.WORKER_RELOADS._value.get() - reloads >= 2 * 8, "the limit did not cool the pairs"
    assert M.WORKER_WARM_BYTES._value.get() <= 1 and all(h.cold for h in w.hot.values())
    warm, cooled = entries(live, names[0]), entries(live, names[1])
    assert len(warm) >= 40 and any(e["kind"] == "changepoint" for e in warm)
    assert cooled == warm

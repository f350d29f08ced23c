"""``cusp feed-demo --loop`` (what ``cusp serve --demo`` runs) keeps the demo flowing: round after
round of the paper's data, with continuing seqs, over real HTTP; a restarted feeder resumes
where the stream is."""

import argparse
import time
import uuid
from datetime import datetime

import pytest

from service.commands import feed_demo
from tests.service_fixtures import LiveServer


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url)
    yield server
    server.stop()


def args(live, stream, **kw):
    base = dict(url=live.url, stream=stream, observations=1000, chunk_size=500, rate=0.0, max_lag=0, api_key=None,
                loop=True, rounds=3)
    return argparse.Namespace(**{**base, **kw})


def test_the_demo_loops_and_resumes(live, capsys):
    s = "demo" + uuid.uuid4().hex[:8]
    assert feed_demo(args(live, s)) == 0
    info = live.client.get(f"/v1/streams/{s}").json()
    assert info["next_seq"] == 6 and [m["name"] for m in info["models"]] == ["gmm3", "gmm5", "gmm7"]
    out = capsys.readouterr().out
    assert "round 2: change points at observations [2000" in out  # each new round starts a new regime
    before = time.time()
    assert feed_demo(args(live, s, rounds=4)) == 0  # a restarted feeder goes on from seq 6
    again = live.client.get(f"/v1/streams/{s}").json()
    assert again["next_seq"] == 8
    # the rows carry times: spread since the previous chunk, after the stream's last time, not ahead of the clock
    first, last, prev = (datetime.fromisoformat(t).timestamp() for t in (info["first_time"], again["last_time"], info["last_time"]))
    assert first < prev < last <= time.time() + 0.1 and last > before  # a chunk sent at once after another: 10 µs a row
    assert feed_demo(args(live, s, loop=False)) == 0  # without --loop: the round the stream is in, done

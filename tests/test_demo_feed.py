"""``cusp feed-demo --loop`` (what ``cusp serve --demo`` runs) keeps the demo flowing: round after
round of the paper's data, with continuing seqs, over real HTTP; a restarted feeder resumes
where the stream is."""

import argparse
import uuid

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
    assert feed_demo(args(live, s, rounds=4)) == 0  # a restarted feeder goes on from seq 6
    assert live.client.get(f"/v1/streams/{s}").json()["next_seq"] == 8
    assert feed_demo(args(live, s, loop=False)) == 0  # without --loop: the round the stream is in, done

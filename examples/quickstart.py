"""cusp in a notebook-sized example: in-process detection, then the same data through a running
service. Run: python examples/quickstart.py [URL]  (a service with a worker: `cusp serve`).
tests/test_quickstart.py runs it against a live API and worker."""

import asyncio
import contextlib
import sys
import uuid
from datetime import datetime, timedelta, timezone

import numpy as np

import cusp

# a latency metric, one value a minute, that jumps from 250 ms to 280 ms at observation 300
rng = np.random.default_rng(0)
ms = np.concatenate([rng.normal(250, 10, 300), rng.normal(280, 10, 300)]).round(2)
minutes = [datetime(2026, 11, 26, tzinfo=timezone.utc) + timedelta(minutes=i) for i in range(len(ms))]

# 1. in this process, river-style: feed values (here 20 at a time), read the answer
det = cusp.Detector(chunk_size=20, seed=1)
for lo in range(0, len(ms), 20):
    det.update(ms[lo : lo + 20])
print("in-process change points:", [c.location for c in det.changepoints])
print("model probabilities:", {m: round(p, 3) for m, p in det.probabilities.items()})

# 2. the same through the service: it gives the same numbers for the same data, seed and chunks
url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
with cusp.Client(url) as client:
    name = "quickstart-" + uuid.uuid4().hex[:6]
    client.create_stream(name, ["ms"], seed=1)          # the default models for one column
    for lo in range(0, len(ms), 20):
        client.post(name, ms[lo : lo + 20])             # seq 0, 1, 2...: kept by the client
    client.wait(name)                                   # until the workers have caught up
    stream = client.changepoints(name)["stream"]
    print("service change points:", [c["location"] for c in stream])
    assert [c["location"] for c in stream] == [c.location for c in det.changepoints]

    # live results, resumable: remember the last id and pass it as since= after a restart
    for n, entry in enumerate(client.results(name, follow=True)):
        if n == 2:
            print("resume after id", entry["id"])
            break
    client.delete_stream(name)

    # 3. one shot: a whole series in, its change points out, nothing stored
    one = client.detect(ms, chunk_size=20, seed=1)
    print("one-shot change points:", [c["index"] for c in one["changepoints"]])


# 4. asyncio: the same methods, awaited; results followed live over the WebSocket while posting
#    rows with their times (without times the service stamps their arrival)
async def watch_live(url: str) -> None:
    async with cusp.AsyncClient(url) as client:
        name = "quickstart-" + uuid.uuid4().hex[:6]
        await client.create_stream(name, ["ms"], models=["level"], seed=1)

        async def first_change() -> dict:
            feed = client.results(name, follow=True, transport="ws", kind="stream_changepoint")
            async with contextlib.aclosing(feed):          # closes the WebSocket when we leave
                async for entry in feed:
                    return entry

        watcher = asyncio.create_task(first_change())
        for lo in range(0, len(ms), 20):
            await client.post(name, ms[lo : lo + 20], times=minutes[lo : lo + 20])
        change = await asyncio.wait_for(watcher, 120)
        print("live change point:", change["location"], "at", cusp.parse_time(change["location_time"]),
              "found", change["delay_seconds"] / 60, "minutes later")
        await client.delete_stream(name)


asyncio.run(watch_live(url))

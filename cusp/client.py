"""``cusp.Client`` and ``cusp.AsyncClient``: a cusp service over HTTP and WebSocket.

    with cusp.Client("http://127.0.0.1:8000", api_key="KEY") as c:
        c.create_stream("latency", ["ms"], models=["level", "ar"])
        c.post("latency", [[12.1], [11.8]])           # seq 0; the next post sends seq 1
        for entry in c.results("latency", follow=True, transport="ws"):  # live, resumed after a drop
            ...
        c.changepoints("latency")

    async with cusp.AsyncClient("http://127.0.0.1:8000") as c:   # the same methods, awaited
        await c.post("latency", [12.1, 11.8], times=["2026-11-26T08:00:00Z", "2026-11-26T08:01:00Z"])
        async for entry in c.results("latency", follow=True):
            ...

Both have the methods of ``cusp._core.BaseClient``, which holds what they do (arguments, URLs,
errors, sequence numbers, retries, resume) as flows; this module only runs the flows' I/O:
``Client`` with httpx.Client and websockets' sync client, ``AsyncClient`` with httpx.AsyncClient
and websockets' asyncio client. Errors raise ``cusp.APIError`` subclasses carrying the server's
message and code; arguments the client can check itself raise ``cusp.InputError`` before
anything is sent; ``cusp.ServerUnavailable`` when retries run out.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import websockets.asyncio.client
import websockets.sync.client
from websockets.exceptions import ConnectionClosed

from cusp._core import (RETRY_STATUSES, THROWN, BaseClient, Emit, Flow, Open, Outcome, Receive, Request, Sleep,
                        SSEParser, Step, ws_closed, ws_entry)

__all__ = ["AsyncClient", "Client", "RETRY_STATUSES"]

#: a feed entry can be large (a result of many models); the WebSocket default is 1 MiB
WS_MAX_SIZE = 2**24


def _feed_timeout(timeout: float) -> httpx.Timeout:
    """An SSE feed waits as long as it takes for the next event (the server sends keep-alives)."""
    return httpx.Timeout(timeout, read=None)


class Client(BaseClient):
    """A cusp service, blocking. ``with cusp.Client(url) as c: ...`` closes its connections.
    Safe to share between threads; posts to one stream are sent one at a time. See ``BaseClient``
    for the arguments and the methods."""

    _HTTP = httpx.Client

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _drive(self, flow: Flow, lock: str | None = None) -> Any:
        step = Step(flow)
        with self._locks.setdefault(lock, threading.Lock()) if lock is not None else contextlib.nullcontext():
            for _ in self._run(step):
                pass
        return step.value

    def _iterate(self, flow: Flow) -> Iterator[dict]:
        return self._run(Step(flow))

    def _run(self, step: Step) -> Iterator[dict]:
        io = _SyncIO(self._http, self.timeout)
        try:
            while (effect := step.next()) is not Step.DONE:
                if isinstance(effect, Emit):
                    yield effect.entry
                else:
                    step.outcome = io.do(effect)
        finally:
            io.close()
            step.flow.close()


class AsyncClient(BaseClient):
    """A cusp service, for asyncio: the methods of ``Client``, awaited (``await c.post(...)``);
    ``results`` is an async iterator (``async for entry in c.results(...)``). ``async with
    cusp.AsyncClient(url) as c: ...`` closes its connections. Posts to one stream are sent one at
    a time, in the order they were called, also when gathered."""

    _HTTP = httpx.AsyncClient

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _drive(self, flow: Flow, lock: str | None = None) -> Any:
        step = Step(flow)
        async with self._locks.setdefault(lock, asyncio.Lock()) if lock is not None else contextlib.nullcontext():
            async for _ in self._run(step):
                pass
        return step.value

    def _iterate(self, flow: Flow) -> AsyncIterator[dict]:
        return self._run(Step(flow))

    async def _run(self, step: Step) -> AsyncIterator[dict]:
        io = _AsyncIO(self._http, self.timeout)
        try:
            while (effect := step.next()) is not Step.DONE:
                if isinstance(effect, Emit):
                    yield effect.entry
                else:
                    step.outcome = await io.do(effect)
        finally:
            await io.aclose()
            step.flow.close()


class _IO:
    """A flow's I/O, for one run: requests, sleeps, and the live feed it has open (one at a time).
    ``handler`` finds an effect's method; those here answer a value or, for ``_AsyncIO``, an
    awaitable (``http`` is an httpx.Client or an httpx.AsyncClient)."""

    sleep: Any

    def __init__(self, http: Any, timeout: float):
        self.http, self.timeout = http, timeout
        self._next: Any = None

    def handler(self, effect: Any) -> Any:
        return {Request: self._request, Sleep: self._sleep, Open: self._open, Receive: self._receive}[type(effect)]

    def _request(self, effect: Request) -> Any:
        return self.http.request(effect.method, effect.path, params=effect.params, json=effect.json)

    def _sleep(self, effect: Sleep) -> Any:
        return self.sleep(effect.seconds)

    def _receive(self, effect: Receive) -> Any:
        return self._next()

    def _open(self, effect: Open) -> Any:  # pragma: no cover - per flavour
        raise NotImplementedError


class _SyncIO(_IO):
    """A blocking flow's I/O."""

    sleep = staticmethod(time.sleep)

    def __init__(self, http: httpx.Client, timeout: float):
        super().__init__(http, timeout)
        self._stack = contextlib.ExitStack()

    def do(self, effect: Any) -> Outcome:
        try:
            return Outcome(self.handler(effect)(effect))
        except THROWN as exc:
            return Outcome(error=exc)

    def _open(self, effect: Open) -> httpx.Response | None:
        self.close()
        if effect.transport == "sse":
            r = self._stack.enter_context(self.http.stream("GET", effect.url, headers=effect.headers,
                                                           timeout=_feed_timeout(self.timeout)))
            if r.status_code >= 400:
                r.read()
                return r
            lines, parser = r.iter_lines(), SSEParser()

            def next_entry() -> dict | None:
                for line in lines:
                    if (entry := parser.feed(line)) is not None:
                        return entry
                return None
        else:
            ws = self._stack.enter_context(websockets.sync.client.connect(
                effect.url, additional_headers=effect.headers, open_timeout=self.timeout, max_size=WS_MAX_SIZE))

            def next_entry() -> dict | None:
                try:
                    return ws_entry(ws.recv())
                except ConnectionClosed as exc:
                    return ws_closed(exc)
        self._next = next_entry
        return None

    def close(self) -> None:
        self._next = None
        self._stack.close()


class _AsyncIO(_IO):
    """An asyncio flow's I/O."""

    sleep = staticmethod(asyncio.sleep)

    def __init__(self, http: httpx.AsyncClient, timeout: float):
        super().__init__(http, timeout)
        self._stack = contextlib.AsyncExitStack()

    async def do(self, effect: Any) -> Outcome:
        try:
            return Outcome(await self.handler(effect)(effect))
        except THROWN as exc:
            return Outcome(error=exc)

    async def _open(self, effect: Open) -> httpx.Response | None:
        await self.aclose()
        if effect.transport == "sse":
            r = await self._stack.enter_async_context(self.http.stream("GET", effect.url, headers=effect.headers,
                                                                       timeout=_feed_timeout(self.timeout)))
            if r.status_code >= 400:
                await r.aread()
                return r
            lines, parser = r.aiter_lines(), SSEParser()

            async def next_entry() -> dict | None:
                async for line in lines:
                    if (entry := parser.feed(line)) is not None:
                        return entry
                return None
        else:
            ws = await self._stack.enter_async_context(websockets.asyncio.client.connect(
                effect.url, additional_headers=effect.headers, open_timeout=self.timeout, max_size=WS_MAX_SIZE))

            async def next_entry() -> dict | None:
                try:
                    return ws_entry(await ws.recv())
                except ConnectionClosed as exc:
                    return ws_closed(exc)
        self._next = next_entry
        return None

    async def aclose(self) -> None:
        self._next = None
        await self._stack.aclose()

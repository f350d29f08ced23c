"""cusp: streaming change-point detection on online Bayesian evidence.

    import cusp

    det = cusp.Detector()                       # in this process, river-style
    det.update(values)
    det.changepoints

    client = cusp.Client("http://127.0.0.1:8000", api_key=None)   # a cusp service
    client.create_stream("latency", ["ms"])
    client.post("latency", [[12.1], [11.8]])   # seq kept for you; retried, resent idempotently
    for entry in client.results("latency", follow=True): ...         # over SSE; transport="ws": WebSocket

    async with cusp.AsyncClient("http://127.0.0.1:8000") as client:   # the same methods, awaited
        await client.post("latency", [12.1], times=[datetime.now(timezone.utc)])
        async for entry in client.results("latency", follow=True): ...

``Detector`` needs torch (it loads on first use); the clients need only httpx and websockets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cusp.errors import (APIError, AuthenticationError, ConflictError, CuspError, InputError, InvalidRequestError,
                         NotFoundError, ServerUnavailable)
from cusp.times import parse_time

if TYPE_CHECKING:  # pragma: no cover
    from cusp.client import AsyncClient, Client
    from cusp.detector import Detector

__all__ = ["APIError", "AsyncClient", "AuthenticationError", "Client", "ConflictError", "CuspError", "Detector",
           "InputError", "InvalidRequestError", "NotFoundError", "ServerUnavailable", "parse_time"]
__version__ = "0.1.0"

_LAZY = {"AsyncClient": "cusp.client", "Client": "cusp.client", "Detector": "cusp.detector"}


def __getattr__(name: str):
    """``Detector`` (torch) and the clients (httpx, websockets) are imported when first asked for."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cusp' has no attribute {name!r}")

"""What ``cusp.Client`` and ``cusp.AsyncClient`` share: every method, written once as a flow.

A flow is a generator that does no I/O itself. It yields the I/O it needs, an *effect*
(``Request``, ``Sleep``, ``Open`` a result feed, ``RECEIVE`` its next entry, ``Emit`` an entry to
the caller), and is sent the outcome back (an ``httpx.Response``, an entry, None) or has the
transport's exception thrown into it. ``Client`` runs flows with httpx's and websockets' blocking
clients, ``AsyncClient`` with their asyncio ones (``cusp/client.py``), so argument checks, URLs,
error mapping, sequence numbers, retries and resume exist once. (httpx's ``Auth.auth_flow`` serves
both of httpx's clients the same way.)

Sequence numbers: a client asks the server for a stream's ``next_seq`` on its first post and counts
from there; posts to one stream go one at a time (a lock per stream), in the order they were
called. A request that fails on the way (connection error, 5xx, 429) is sent again unchanged after
a backoff (429 and 503: the server's Retry-After); the server answers a resent chunk as a
``duplicate``, so a chunk is stored once however often it is sent.
"""

from __future__ import annotations

import json
import math
import numbers
import time
from collections.abc import Generator, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import quote, urlencode

import httpx
from websockets.exceptions import ConnectionClosed, WebSocketException

from cusp.errors import APIError, ConflictError, InputError, NotFoundError, ServerUnavailable, api_error
from cusp.times import wire_times

#: statuses answered again after a backoff: the request may not have been processed
RETRY_STATUSES = {429, 502, 503, 504}
#: the ways results can be followed live
TRANSPORTS = ("sse", "ws")
#: result entry kinds (``GET /v1/streams/{s}/evidence?kind=``)
KINDS = ("result", "changepoint", "stream_changepoint", "stream_changepoint_withdrawn", "dead_letter")


# --- effects: what a flow asks its driver to do ------------------------------------------------
class Request(NamedTuple):
    """An HTTP request; sent back: the ``httpx.Response`` (its body read)."""
    method: str
    path: str
    params: Mapping[str, Any] | None = None
    json: Any = None


class Sleep(NamedTuple):
    seconds: float


class Open(NamedTuple):
    """Connect a live result feed (closing the one open before); sent back: None, or for SSE an
    error answer (an ``httpx.Response``, its body read)."""
    transport: str  # 'sse' or 'ws'
    url: str  # SSE: the path; WebSocket: the whole ws:// or wss:// URL
    headers: Mapping[str, str]


class Receive(NamedTuple):
    """The open feed's next entry; sent back: the entry, or None when the server ended the feed."""


class Emit(NamedTuple):
    """An entry for the caller of ``results``."""
    entry: dict


RECEIVE = Receive()


class Refused(Exception):
    """A feed WebSocket the server closed with 1008 (policy violation): its reason."""


#: exceptions a driver throws into the flow instead of raising: the flow decides (retry, resume, raise)
THROWN = (httpx.TransportError, OSError, WebSocketException, Refused)

Flow = Generator[Any, Any, Any]


class Outcome(NamedTuple):
    """What the driver made of an effect: its value, or the exception (one of ``THROWN``) it raised."""
    value: Any = None
    error: BaseException | None = None


class Step:
    """A flow run one effect at a time by a driver: ``next()`` sends the last ``outcome`` in (or
    throws its error) and answers the next effect, or ``DONE`` once the flow has returned (its
    return value in ``value``)."""

    DONE = object()

    def __init__(self, flow: Flow):
        self.flow, self.outcome, self.value = flow, Outcome(), None

    def next(self) -> Any:
        outcome, self.outcome = self.outcome, Outcome()
        try:
            return self.flow.throw(outcome.error) if outcome.error is not None else self.flow.send(outcome.value)
        except StopIteration as stop:
            self.value = stop.value
            return Step.DONE


# --- what both clients answer -------------------------------------------------------------------
class BaseClient:
    """The methods of ``Client`` and ``AsyncClient``. Each hands a flow to the driver's ``_drive``
    (a value for ``Client``, an awaitable for ``AsyncClient``) or ``_iterate`` (an iterator or an
    async iterator of entries).

    url: the API's base URL; api_key: sent as ``Authorization: Bearer`` (on WebSockets too);
    timeout: seconds per request (and to open a WebSocket); retries: attempts after the first for
    connection errors, 5xx and 429 (and reconnections of a live feed in a row); backoff: the first
    wait in seconds, doubled per attempt up to ``max_backoff``."""

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 30.0, retries: int = 5,
                 backoff: float = 0.2, max_backoff: float = 10.0):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InputError(f"url must be an http:// or https:// URL, got {url!r}")
        for what, v in (("timeout", timeout), ("backoff", backoff), ("max_backoff", max_backoff)):
            if not isinstance(v, numbers.Real) or isinstance(v, bool) or not (0 <= v < math.inf):
                raise InputError(f"{what} must be a number >= 0, got {v!r}")
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise InputError(f"retries must be an integer >= 0, got {retries!r}")
        if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
            raise InputError("api_key must be a non-empty string (or None)")
        self.url, self.timeout = url.rstrip("/"), float(timeout)
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self._ws_url = "ws" + self.url[len("http"):]  # http -> ws, https -> wss
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._seq: dict[str, int] = {}
        self._locks: dict[str, Any] = {}
        self._http = self._HTTP(base_url=self.url, headers=self._auth, timeout=self.timeout)

    #: the driver: ``_HTTP`` (httpx.Client or httpx.AsyncClient), ``_drive`` and ``_iterate``
    _HTTP: Any = None

    def _drive(self, flow: Flow, lock: str | None = None) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _iterate(self, flow: Flow) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    # --- streams --------------------------------------------------------------------------------
    def create_stream(self, name: str, columns: Sequence[str], models: Sequence[str | Mapping] | None = None, *,
                      seed: int = 0, detector: Mapping[str, Any] | None = None,
                      sampler: Mapping[str, Any] | None = None):
        """Create a stream (``POST /v1/streams``) and answer it as ``stream`` does. models: specs
        or ``{"spec", "name", "target", "prior"}`` dicts; None: the default portfolio for the
        number of columns (``models.registry.default_portfolio``). A create retried after a lost
        answer that finds the stream already there answers that stream."""
        return self._drive(self._create_stream(name, columns, models, seed, detector, sampler))

    def delete_stream(self, name: str):
        """Delete a stream and everything it holds (``DELETE /v1/streams/{name}``)."""
        return self._drive(self._delete_stream(name))

    def stream(self, name: str):
        """The stream: columns, settings, ``next_seq`` and per model observations, log-evidence,
        posterior probability and lag (``GET /v1/streams/{name}``)."""
        _name(name)
        return self._drive(self._call_once("GET", f"/v1/streams/{name}"))

    def streams(self):
        """The streams' names."""
        return self._drive(self._call_once("GET", "/v1/streams", key="streams"))

    # --- ingest ---------------------------------------------------------------------------------
    def post(self, name: str, rows: Any, seq: int | None = None, *, times: Any = None):
        """Send one chunk: ``rows`` is rows of numbers (one per column), or for a one-column
        stream a list of values (or a numpy array of either). times: None (the service stamps
        the rows with their arrival), or one time per row, strictly increasing: timezone-aware
        datetimes, RFC 3339 strings, dates, epoch seconds, numpy datetime64 or a tz-aware pandas
        DatetimeIndex (``cusp.times``); checked here before anything is sent. seq None: the next
        of this stream's sequence (asked of the server on the first post). Answers the server's
        ack (``status`` 'accepted' or, for a resend of an accepted chunk, 'duplicate')."""
        _name(name)
        return self._drive(self._post(name, rows, seq, times), lock=name)

    def next_seq(self, name: str):
        """The seq the next ``post`` sends (asks the server the first time)."""
        _name(name)
        return self._drive(self._next_seq(name))

    # --- results --------------------------------------------------------------------------------
    def results(self, name: str, since: str | None = None, *, follow: bool = False, transport: str = "sse",
                model: str | None = None, kind: str | Sequence[str] | None = None):
        """The stream's result entries (kinds 'result', 'changepoint', 'stream_changepoint',
        'stream_changepoint_withdrawn', 'dead_letter') after the result id ``since`` (None: from the start), oldest first;
        ``model`` and ``kind`` (one kind or several) filter them.

        follow False: those stored now (``/evidence`` pages, filtered by the server), then stop.
        follow True: live, until the stream is deleted, over server-sent events (transport
        'sse') or the WebSocket (transport 'ws'); a dropped connection is reopened from the last
        entry received (SSE: ``Last-Event-ID``, WebSocket: ``?since=``), so no entry is lost or
        repeated. To resume in another process (or after leaving the loop), pass the last
        entry's ``id`` as ``since``."""
        _name(name)
        if since is not None and not isinstance(since, str):
            raise InputError(f"since must be a result id string like '1712345678901-0' (or None), got {since!r}")
        if transport not in TRANSPORTS:
            raise InputError(f"transport must be 'sse' or 'ws', got {transport!r}")
        kinds = [kind] if isinstance(kind, str) else list(kind) if kind is not None else None
        for k in kinds or ():
            if k not in KINDS:
                raise InputError(f"kind must be one of {', '.join(KINDS)}, got {k!r}")
        if follow:
            return self._iterate(self._follow(name, since, transport, model, kinds))
        return self._iterate(self._pages(name, since, model, kinds))

    def changepoints(self, name: str, model: str | None = None):
        """``{"changepoints": each model's events (only ``model``'s where given), "stream": the
        model-averaged change points, "withdrawn": those of them withdrawn since}``."""
        _name(name)
        if model is not None and not isinstance(model, str):
            raise InputError(f"model must be a model's name or spec (a string), got {model!r}")
        params = {"model": model} if model is not None else None
        return self._drive(self._call_once("GET", f"/v1/streams/{name}/changepoints", params=params))

    def wait(self, name: str, timeout: float = 60.0, poll: float = 0.2):
        """Wait until every model of the stream has processed every accepted chunk (no lag);
        answers the stream. TimeoutError after ``timeout`` seconds."""
        _name(name)
        return self._drive(self._wait_for(name, timeout, poll))

    def detect(self, values: Any, times: Any = None, models: Sequence[str] | None = None,
               chunk_size: int | None = None, **extra: Any):
        """One-shot detection over a whole series (``POST /v1/detect``); nothing is stored. times:
        one per value, as for ``post``."""
        body = {"values": _rows(values, flat=True), **extra}
        if times is not None:
            body["times"] = wire_times(times, len(body["values"]))
        if models is not None:
            body["models"] = list(models)
        if chunk_size is not None:
            body["chunk_size"] = chunk_size
        return self._drive(self._call_once("POST", "/v1/detect", json=_json(body)))

    # --- flows ----------------------------------------------------------------------------------
    def _create_stream(self, name, columns, models, seed, detector, sampler) -> Flow:
        _name(name)
        if isinstance(columns, str) or not isinstance(columns, Sequence) or not columns:
            raise InputError(f"columns must be a non-empty list of column names, got {columns!r}")
        if models is None:
            from models.registry import default_portfolio

            models = list(default_portfolio(len(columns)))
        elif isinstance(models, str) or not isinstance(models, Sequence) or not models:
            raise InputError(f"models must be a non-empty list of model specs (or None), got {models!r}")
        body = {"name": name, "columns": list(columns), "models": [m if isinstance(m, str) else dict(m) for m in models],
                "seed": seed, "detector": dict(detector or {})}
        if sampler is not None:
            body["sampler"] = dict(sampler)
        try:
            out = yield from self._call("POST", "/v1/streams", json=_json(body))
        except _Resent as again:  # the first attempt may have created it: same name and columns?
            if again.error.status != 409:
                raise again.error from None
            out = yield from self._call_once("GET", f"/v1/streams/{name}")
            if out["columns"] != list(columns):
                raise again.error from None
        self._seq[name] = out["next_seq"]
        return out

    def _delete_stream(self, name: str) -> Flow:
        _name(name)
        try:
            yield from self._call("DELETE", f"/v1/streams/{name}")
        except _Resent as again:  # deleted by the attempt whose answer was lost
            if again.error.status != 404:
                raise again.error from None
        self._seq.pop(name, None)

    def _post(self, name: str, rows: Any, seq: int | None, times: Any) -> Flow:
        _name(name)
        body: dict[str, Any] = {"rows": _rows(rows)}
        if times is not None:
            body["time"] = wire_times(times, len(body["rows"]))
        if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= 2**53):
            raise InputError(f"seq must be an integer in [0, 2**53], got {seq!r}")
        if seq is None:
            seq = yield from self._next_seq(name)
        try:
            ack = yield from self._call_once("POST", f"/v1/streams/{name}/chunks", json={"seq": seq, **body})
        except ConflictError:
            self._seq.pop(name, None)  # another writer, or a gap: the next post asks the server again
            raise
        self._seq[name] = max(self._seq.get(name, 0), seq + 1)  # an explicit resend of an old seq keeps the count
        return ack

    def _next_seq(self, name: str) -> Flow:
        if name not in self._seq:
            self._seq[name] = (yield from self._call_once("GET", f"/v1/streams/{name}"))["next_seq"]
        return self._seq[name]

    def _pages(self, name: str, since: str | None, model: str | None, kinds: list[str] | None) -> Flow:
        while True:
            params: dict[str, Any] = {"since": since} if since else {}
            if model is not None:
                params["model"] = model
            if kinds:
                params["kind"] = kinds
            page = yield from self._call_once("GET", f"/v1/streams/{name}/evidence", params=params)
            for entry in page["results"]:
                yield Emit(entry)
            more = page.get("has_more")
            if more is None:  # a server before has_more: an empty page ends it
                more = bool(page["results"])
            if not more or page.get("next") in (None, since):
                return
            since = page["next"]

    def _follow(self, name: str, since: str | None, transport: str, model: str | None, kinds: list[str] | None) -> Flow:
        """Live entries over SSE or the WebSocket, reconnected from the last entry's id after a
        drop, until the stream is deleted (also: refused as 404 after it had been open, the stream
        deleted while the client reconnected). The server filters by ``model`` (a name or a spec,
        resolved as the pages resolve it) and ``kinds``."""
        path = f"/v1/streams/{name}/evidence/{transport}"
        filters = ([("model", model)] if model is not None else []) + [("kind", k) for k in kinds or ()]
        last, attempt, opened = since, 0, False
        while True:
            try:
                if transport == "sse":
                    failed = yield Open("sse", path + _query(filters), {"Last-Event-ID": last} if last else {})
                else:
                    query = _query(filters + ([("since", last)] if last else []))
                    failed = yield Open("ws", self._ws_url + path + query, self._auth)
                if failed is not None:
                    raise _failure(failed)
                # a WebSocket is refused after its handshake: it was open at its first entry or its end
                attempt, opened = 0, opened or transport == "sse"
                while (entry := (yield RECEIVE)) is not None:
                    last, opened = entry.get("id", last), True
                    yield Emit(entry)
                # the server ends the feed when the stream is deleted; a proxy may end it any time
                opened = True
                yield from self._call_once("GET", f"/v1/streams/{name}")
            except Refused as refusal:
                error = yield from self._refusal(name, last, filters, str(refusal))
                if not (opened and isinstance(error, NotFoundError)):
                    raise error from None
                return
            except NotFoundError:
                if not opened:
                    raise
                return
            except (*THROWN, _Retry) as exc:
                if attempt >= self.retries:
                    raise ServerUnavailable(f"GET {path}: {_why(exc)} (after {attempt + 1} attempts)") from None
                yield Sleep(self._backoff(attempt, exc))
                attempt += 1

    def _refusal(self, name: str, since: str | None, filters: list[tuple[str, str]], reason: str) -> Flow:
        """The APIError of a feed WebSocket closed with 1008 and a reason: the same read over HTTP
        passes the same checks (key, stream, since, model, kind) and answers a problem document
        with its code."""
        path = f"/v1/streams/{name}/evidence"
        try:
            yield from self._call_once("GET", path, params=[("limit", 1)] + ([("since", since)] if since else []) + filters)
        except APIError as err:  # named by the feed the caller opened, not the read that explained it
            return api_error(err.status, err.detail, "GET", path + "/ws", err.code, err.problem)
        return api_error(403, f"the WebSocket was refused: {reason}", "GET", path + "/ws")

    def _wait_for(self, name: str, timeout: float, poll: float) -> Flow:
        deadline = time.monotonic() + timeout
        while True:
            s = yield from self._call_once("GET", f"/v1/streams/{name}")
            if all(m["last_seq"] >= s["last_seq"] or m["error"] for m in s["models"]):
                return s
            if time.monotonic() > deadline:
                raise TimeoutError(f"stream {name!r}: models still behind seq {s['last_seq']} after {timeout} s")
            yield Sleep(poll)

    # --- requests -------------------------------------------------------------------------------
    def _call_once(self, method: str, path: str, key: str | None = None, **kw) -> Flow:
        """A request whose resend is harmless (or answered as a duplicate), retried as ``_call``;
        its JSON (``key``: that field of it)."""
        try:
            out = yield from self._call(method, path, **kw)
        except _Resent as again:
            raise again.error from None
        return out[key] if key else out

    def _call(self, method: str, path: str, params: Mapping | None = None, json: Any = None) -> Flow:
        """The request, retried after connection errors and 429/5xx; the answer's JSON. An error
        answer raises its APIError, wrapped in ``_Resent`` when an earlier attempt may have
        been processed (its answer was lost), so that callers can tell."""
        attempt, uncertain = 0, False
        while True:
            try:
                r = yield Request(method, path, params, json)
            except httpx.TransportError as exc:
                failure: Exception = exc
                # a request that may have reached the server before the connection broke
                uncertain = uncertain or not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
            else:
                if r.status_code < 400:
                    return r.json() if r.content else None
                failure = _failure(r)
                if not isinstance(failure, _Retry):
                    raise (_Resent(failure) if uncertain else failure)
                uncertain = uncertain or r.status_code != 429
            if attempt >= self.retries:
                raise ServerUnavailable(f"{method} {path}: {_why(failure)} (after {attempt + 1} attempts)") from None
            yield Sleep(self._backoff(attempt, failure))
            attempt += 1

    def _backoff(self, attempt: int, failure: Exception) -> float:
        after = failure.retry_after if isinstance(failure, _Retry) else None
        return after if after is not None else min(self.max_backoff, self.backoff * 2**attempt)


class _Retry(Exception):
    def __init__(self, error: Exception, retry_after: float | None):
        self.error, self.retry_after = error, retry_after


class _Resent(Exception):
    """An error answer to a resent request whose earlier attempt may have been processed."""

    def __init__(self, error):
        self.error = error


# --- reading answers ----------------------------------------------------------------------------
def _failure(r: httpx.Response) -> Exception:
    """An error answer as what the flow does with it: ``_Retry`` (after a backoff) or the APIError."""
    err = _error(r)
    if r.status_code in RETRY_STATUSES or r.status_code >= 500:
        return _Retry(err, _retry_after(r))
    return err


def _why(exc: Exception) -> str:
    return str(exc.error) if isinstance(exc, _Retry) else f"{type(exc).__name__}: {exc}"


def _retry_after(r: httpx.Response) -> float | None:
    try:
        return min(60.0, max(0.0, float(r.headers["retry-after"])))
    except (KeyError, ValueError):
        return None


def _error(r: httpx.Response) -> APIError:
    """The APIError of an error answer: its RFC 9457 problem's code and detail (or the text)."""
    try:
        doc = r.json()
    except ValueError:
        doc = None
    problem = doc if isinstance(doc, dict) else {}
    detail = problem.get("detail", r.text or r.reason_phrase)
    code = problem.get("code") if isinstance(problem.get("code"), str) else None
    return api_error(r.status_code, str(detail), r.request.method, r.request.url.path, code, problem)


class SSEParser:
    """Server-sent events, a line at a time: ``feed`` answers the entry an event carries at the
    event's end (its ``data``, JSON, with the event's ``id``), else None; comments are skipped."""

    def __init__(self):
        self._event: dict[str, str] = {}

    def feed(self, line: str) -> dict | None:
        if not line:
            event, self._event = self._event, {}
            if "data" not in event:
                return None
            entry = json.loads(event["data"])
            if "id" in event:
                entry.setdefault("id", event["id"])
            return entry
        if not line.startswith(":"):
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            self._event[key] = self._event[key] + "\n" + value if key == "data" and key in self._event else value
        return None


def ws_entry(message: str | bytes) -> dict:
    """A feed WebSocket message: one entry, JSON."""
    return json.loads(message)


def ws_closed(exc: ConnectionClosed) -> None:
    """A feed WebSocket closed: by the server in order (1000: the stream was deleted), answers
    None; refused (1008: key, stream or since), raises ``Refused``; else (a drop) re-raises."""
    code = exc.rcvd.code if exc.rcvd is not None else None
    if code == 1000:
        return None
    if code == 1008:
        raise Refused(exc.rcvd.reason or "policy violation") from None
    raise exc


# --- arguments ----------------------------------------------------------------------------------
def _query(pairs: list[tuple[str, str]]) -> str:
    """``?k=v&...`` (values quoted), or "" without pairs."""
    return "?" + urlencode(pairs, quote_via=quote, safe="") if pairs else ""


def _name(name: Any) -> None:
    if not isinstance(name, str) or not name or len(name) > 64 or "/" in name:
        raise InputError(f"a stream name must be a string of 1-64 letters, digits, '_', '.' or '-', got {name!r}")


def _rows(rows: Any, flat: bool = False) -> list:
    """Rows as JSON lists of finite floats; a 1-D input is one column's values (``flat``: kept flat)."""
    if hasattr(rows, "tolist") and not isinstance(rows, list):
        rows = rows.tolist()
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
        raise InputError(f"rows must be a non-empty list of rows (or of one column's values), got {type(rows).__name__}")
    out = []
    width = None
    for i, row in enumerate(rows):
        row = row.tolist() if hasattr(row, "tolist") else row
        if isinstance(row, Sequence) and not isinstance(row, (str, bytes)):
            values = [_number(v, f"rows[{i}][{j}]") for j, v in enumerate(row)]
            if width is None:
                width = len(values)
            if len(values) != width or not values:
                raise InputError(f"rows[{i}] has {len(values)} values, rows[0] has {width}: every row needs one value per column")
            out.append(values)
        else:
            if width not in (None, 0):
                raise InputError(f"rows[{i}] is a number but rows[0] is a row: mix neither")
            width = 0
            out.append(_number(row, f"rows[{i}]") if flat else [_number(row, f"rows[{i}]")])
    return out


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise InputError(f"{where} must be a number, got {v!r}")
    v = float(v)
    if not math.isfinite(v):
        raise InputError(f"{where} is {v}; values must be finite numbers")
    return v


def _json(body: dict) -> dict:
    """``body`` if it is JSON without NaN or infinity (which the server could not read), else InputError."""
    try:
        json.dumps(body, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InputError(f"request is not valid JSON: {exc}") from None
    return body

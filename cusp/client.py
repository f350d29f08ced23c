"""``cusp.Client``: a cusp service over HTTP.

    c = cusp.Client("http://127.0.0.1:8000", api_key="KEY")
    c.create_stream("latency", ["ms"], models=["level", "ar"])
    c.post("latency", [[12.1], [11.8]])       # seq 0; the next post sends seq 1
    for entry in c.results("latency", follow=True):   # live over SSE, resumed after a disconnect
        ...
    c.changepoints("latency")

Sequence numbers: the client asks the server for a stream's ``next_seq`` on its first post and
counts from there. A post that fails on the way (connection error, 5xx, 429) is sent again with
the same seq and data, after a backoff (429 and 503: the server's Retry-After); the server
answers a resend of an accepted chunk as a ``duplicate``, so a chunk is stored once however
often it is sent. Errors raise ``cusp.APIError`` subclasses carrying the server's message;
arguments the client can check itself raise ``cusp.InputError`` before anything is sent.
"""

from __future__ import annotations

import json
import math
import numbers
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx

from cusp.errors import ConflictError, InputError, NotFoundError, ServerUnavailable, api_error

#: statuses answered again after a backoff: the request may not have been processed
RETRY_STATUSES = {429, 502, 503, 504}


class Client:
    """url: the API's base URL; api_key: sent as ``Authorization: Bearer``; timeout: seconds per
    request; retries: attempts after the first for connection errors, 5xx and 429; backoff:
    the first wait in seconds, doubled per attempt up to ``max_backoff``."""

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
        self.url, self.retries, self.backoff, self.max_backoff = url.rstrip("/"), retries, backoff, max_backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self._seq: dict[str, int] = {}

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- streams ------------------------------------------------------------------------------
    def create_stream(self, name: str, columns: Sequence[str], models: Sequence[str | Mapping] | None = None, *,
                      seed: int = 0, detector: Mapping[str, Any] | None = None,
                      sampler: Mapping[str, Any] | None = None) -> dict:
        """Create a stream (``POST /v1/streams``) and answer it as ``stream`` does. models: specs
        or ``{"spec", "name", "target", "prior"}`` dicts; None: the default portfolio for the
        number of columns (``models.registry.default_portfolio``). A create retried after a lost
        answer that finds the stream already there answers that stream."""
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
            out = self._call("POST", "/v1/streams", json=_json(body))
        except _Resent as again:  # the first attempt may have created it: same name, columns and models?
            if again.error.status != 409:
                raise again.error from None
            out = self.stream(name)
            if out["columns"] != list(columns):
                raise again.error from None
        self._seq[name] = out["next_seq"]
        return out

    def delete_stream(self, name: str) -> None:
        """Delete a stream and everything it holds (``DELETE /v1/streams/{name}``)."""
        _name(name)
        try:
            self._call("DELETE", f"/v1/streams/{name}")
        except _Resent as again:  # deleted by the attempt whose answer was lost
            if again.error.status != 404:
                raise again.error from None
        self._seq.pop(name, None)

    def stream(self, name: str) -> dict:
        """The stream: columns, settings, ``next_seq`` and per model observations, log-evidence,
        posterior probability and lag (``GET /v1/streams/{name}``)."""
        _name(name)
        return self._call_once("GET", f"/v1/streams/{name}")

    def streams(self) -> list[str]:
        return self._call_once("GET", "/v1/streams")["streams"]

    # --- ingest -------------------------------------------------------------------------------
    def post(self, name: str, rows: Any, seq: int | None = None) -> dict:
        """Send one chunk: ``rows`` is rows of numbers (one per column), or for a one-column
        stream a list of values (or a numpy array of either). seq None: the next of this
        stream's sequence (asked of the server on the first post). Answers the server's ack
        (``status`` 'accepted' or, for a resend of an accepted chunk, 'duplicate')."""
        _name(name)
        data = _rows(rows)
        if seq is None:
            if name not in self._seq:
                self._seq[name] = self.stream(name)["next_seq"]
            seq = self._seq[name]
        elif not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= 2**53:
            raise InputError(f"seq must be an integer in [0, 2**53], got {seq!r}")
        try:
            try:
                ack = self._call("POST", f"/v1/streams/{name}/chunks", json={"seq": seq, "rows": data})
            except _Resent as again:
                raise again.error from None
        except ConflictError:
            self._seq.pop(name, None)  # another writer, or a gap: the next post asks the server again
            raise
        self._seq[name] = max(self._seq.get(name, 0), seq + 1)  # an explicit resend of an old seq keeps the count
        return ack

    def next_seq(self, name: str) -> int:
        """The seq the next ``post`` sends (asks the server the first time)."""
        if name not in self._seq:
            self._seq[name] = self.stream(name)["next_seq"]
        return self._seq[name]

    # --- results ------------------------------------------------------------------------------
    def results(self, name: str, since: str | None = None, *, follow: bool = False,
                model: str | None = None, kind: str | Sequence[str] | None = None) -> Iterator[dict]:
        """The stream's result entries (kinds 'result', 'changepoint', 'dead_letter') after the
        result id ``since`` (None: from the start), oldest first; ``model`` and ``kind`` (one
        kind or several) filter them. follow False: those stored now (``/evidence`` pages, the
        server filtering), then stop. follow True: live over server-sent events, resumed with
        Last-Event-ID after a dropped connection, until the stream is deleted. To resume in
        another process, pass the last entry's ``id`` as ``since``."""
        _name(name)
        kinds = [kind] if isinstance(kind, str) else list(kind) if kind is not None else None
        if follow:
            for e in self._follow(name, since, model):
                if kinds is None or e.get("kind") in kinds:
                    yield e
            return
        while True:
            params: dict[str, Any] = {"since": since} if since else {}
            if model is not None:
                params["model"] = model
            if kinds:
                params["kind"] = kinds
            page = self._call_once("GET", f"/v1/streams/{name}/evidence", params=params)
            yield from page["results"]
            more = page.get("has_more")
            if more is None:  # a server before has_more: an empty page ends it
                more = bool(page["results"])
            if not more or page.get("next") in (None, since):
                return
            since = page["next"]

    def _follow(self, name: str, since: str | None, model: str | None) -> Iterator[dict]:
        last, attempt = since, 0
        while True:
            headers = {"Last-Event-ID": last} if last else {}
            try:
                with self._http.stream("GET", f"/v1/streams/{name}/evidence/sse", headers=headers,
                                       timeout=httpx.Timeout(self._http.timeout.connect, read=None)) as r:
                    if r.status_code >= 400:
                        r.read()
                        err = _error(r)
                        if r.status_code not in RETRY_STATUSES and r.status_code < 500:
                            raise err
                        raise _Retry(err, _retry_after(r))
                    attempt = 0
                    for event in _sse(r.iter_lines()):
                        entry = json.loads(event["data"])
                        last = event.get("id", last)
                        if model is None or entry.get("model") == model:
                            yield entry
                # the server ends the feed when the stream is deleted; a proxy may end it any time
                try:
                    self.stream(name)
                except NotFoundError:
                    return
                continue
            except (httpx.TransportError, _Retry) as exc:
                if attempt >= self.retries:
                    raise ServerUnavailable(f"GET /v1/streams/{name}/evidence/sse: {_why(exc)} "
                                            f"(after {attempt + 1} attempts)") from None
                time.sleep(self._wait(attempt, exc))
                attempt += 1

    def changepoints(self, name: str) -> dict:
        """``{"changepoints": each model's events, "stream": the model-averaged change points}``."""
        _name(name)
        return self._call_once("GET", f"/v1/streams/{name}/changepoints")

    def wait(self, name: str, timeout: float = 60.0, poll: float = 0.2) -> dict:
        """Wait until every model of the stream has processed every accepted chunk (no lag);
        answers the stream. TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.stream(name)
            if all(m["last_seq"] >= s["last_seq"] or m["error"] for m in s["models"]):
                return s
            if time.monotonic() > deadline:
                raise TimeoutError(f"stream {name!r}: models still behind seq {s['last_seq']} after {timeout} s")
            time.sleep(poll)

    def detect(self, values: Any, times: Sequence | None = None, models: Sequence[str] | None = None,
               chunk_size: int | None = None, **extra: Any) -> dict:
        """One-shot detection over a whole series (``POST /v1/detect``); nothing is stored."""
        body = {"values": _rows(values, flat=True), **extra}
        for key, v in (("times", times), ("models", models), ("chunk_size", chunk_size)):
            if v is not None:
                body[key] = list(v) if key != "chunk_size" else v
        return self._call_once("POST", "/v1/detect", json=_json(body))

    # --- transport ----------------------------------------------------------------------------
    def _call_once(self, method: str, path: str, **kw) -> Any:
        """A request that changes nothing (or whose resend is harmless), retried as ``_call``."""
        try:
            return self._call(method, path, **kw)
        except _Resent as again:
            raise again.error from None

    def _call(self, method: str, path: str, **kw) -> Any:
        """The request, retried after connection errors and 429/5xx; the answer's JSON. An error
        answer raises its APIError, wrapped in ``_Resent`` when an earlier attempt may have
        been processed (its answer was lost), so that callers can tell."""
        attempt, uncertain = 0, False
        while True:
            try:
                r = self._http.request(method, path, **kw)
            except httpx.TransportError as exc:
                failure: Exception = exc
                # a request that may have reached the server before the connection broke
                uncertain = uncertain or not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
            else:
                if r.status_code < 400:
                    return r.json() if r.content else None
                err = _error(r)
                if r.status_code not in RETRY_STATUSES and r.status_code < 500:
                    raise (_Resent(err) if uncertain else err)
                failure, uncertain = _Retry(err, _retry_after(r)), uncertain or r.status_code != 429
            if attempt >= self.retries:
                raise ServerUnavailable(f"{method} {path}: {_why(failure)} (after {attempt + 1} attempts)") from None
            time.sleep(self._wait(attempt, failure))
            attempt += 1

    def _wait(self, attempt: int, failure: Exception) -> float:
        after = failure.retry_after if isinstance(failure, _Retry) else None
        return after if after is not None else min(self.max_backoff, self.backoff * 2**attempt)


class _Retry(Exception):
    def __init__(self, error: Exception, retry_after: float | None):
        self.error, self.retry_after = error, retry_after


class _Resent(Exception):
    """An error answer to a resent request whose earlier attempt may have been processed."""

    def __init__(self, error):
        self.error = error


def _why(exc: Exception) -> str:
    return str(exc.error) if isinstance(exc, _Retry) else f"{type(exc).__name__}: {exc}"


def _retry_after(r: httpx.Response) -> float | None:
    try:
        return min(60.0, max(0.0, float(r.headers["retry-after"])))
    except (KeyError, ValueError):
        return None


def _error(r: httpx.Response):
    """The APIError of an error answer: its RFC 9457 problem's code and detail (or the text)."""
    try:
        doc = r.json()
    except ValueError:
        doc = None
    problem = doc if isinstance(doc, dict) else {}
    detail = problem.get("detail", r.text or r.reason_phrase)
    code = problem.get("code") if isinstance(problem.get("code"), str) else None
    return api_error(r.status_code, str(detail), r.request.method, r.request.url.path, code, problem)


def _sse(lines: Iterator[str]) -> Iterator[dict]:
    """Server-sent events: dicts of their fields (id, event, data), comments skipped."""
    event: dict[str, str] = {}
    for line in lines:
        if not line:
            if "data" in event:
                yield event
            event = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            event[key] = event[key] + "\n" + value if key == "data" and key in event else value


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

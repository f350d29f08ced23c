"""The exceptions ``cusp`` raises: every one says what went wrong in words.

``CuspError`` is the base. ``InputError`` (also a ValueError): an argument the client or the
detector refuses before anything is sent or computed. ``APIError``: the server answered an error;
``status`` is its HTTP status, ``code`` its stable error code (``seq_gap``, ``stream_not_found``, ...:
GET /v1/errors lists them) and ``detail`` its message (its 4xx subclasses name the common cases). ``ServerUnavailable``: connection failures or 5xx/429 answers outlasted the retries.
"""

from __future__ import annotations


class CuspError(Exception):
    """Base of cusp's exceptions."""


class InputError(CuspError, ValueError):
    """A bad argument (a model spec, a setting, a value): nothing was sent, stored or computed with
    it (``cusp.Detector`` with ``chunk_size``: chunks of the same update before a bad one were)."""


class APIError(CuspError):
    """The server refused a request: ``status`` (HTTP), ``code`` (the stable error code, e.g.
    'seq_gap'; None from a server that sends none), ``detail`` (the server's message) and
    ``problem`` (the whole RFC 9457 problem document, {} if the answer was not one)."""

    def __init__(self, status: int, detail: str, method: str = "", path: str = "", code: str | None = None,
                 problem: dict | None = None):
        self.status, self.detail, self.method, self.path, self.code = status, detail, method, path, code
        self.problem = problem or {}
        where = f"{method} {path}: " if method else ""
        super().__init__(f"{where}{status}: {detail}" + (f" [{code}]" if code else ""))


class AuthenticationError(APIError):
    """401 or 403: a missing, unknown or read-only API key."""


class NotFoundError(APIError):
    """404: no such stream (or model)."""


class ConflictError(APIError):
    """409: a sequence gap, a seq reused with other data, a name taken, the stream limit."""


class InvalidRequestError(APIError):
    """400, 413, 415 or 422: the server refused the request's content; the detail names the field."""


class ServerUnavailable(CuspError):
    """The server could not be reached, or kept answering 5xx / 429, through every retry."""


def api_error(status: int, detail: str, method: str = "", path: str = "", code: str | None = None,
              problem: dict | None = None) -> APIError:
    """The APIError subclass for an HTTP error status."""
    cls = {401: AuthenticationError, 403: AuthenticationError, 404: NotFoundError, 409: ConflictError}.get(
        status, InvalidRequestError if status in (400, 413, 415, 422) else APIError)
    return cls(status, detail, method, path, code, problem)

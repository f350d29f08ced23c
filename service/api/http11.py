"""uvicorn's HTTP/1.1 protocol (h11) with cusp's error shape for requests it cannot parse.

uvicorn answers a request h11 cannot parse (a Content-Length that is not a number, two that
disagree, a header line without a colon, a request line that is not HTTP) itself, before the
application sees it: a plain-text 400 "Invalid HTTP request received." that names nothing. Here
the same 400 is a problem+json body like every other error of the API (``service.api.errors``):
code ``invalid_content_length`` when the Content-Length header is at fault, else ``invalid_http``,
and the detail is h11's reason ("bad Content-Length", "illegal header line", ...). The connection
closes after it, as before.
"""

from __future__ import annotations

import json
import sys

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.api.errors import CODES, PROBLEM_JSON, problem_body


def unparsable(reason: str) -> tuple[int, bytes]:
    """(status, problem+json body) for a request h11 refused with ``reason``."""
    code = "invalid_content_length" if "content-length" in reason.lower() else "invalid_http"
    status = CODES[code][0]
    detail = f"the request is not valid HTTP/1.1: {reason}" if reason else "the request is not valid HTTP/1.1"
    return status, json.dumps(problem_body(status, code, detail)).encode()


class ProblemH11Protocol(H11Protocol):
    """uvicorn's ``H11Protocol``; only the answer to an unparsable request differs."""

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this inside its ``except h11.RemoteProtocolError`` block: the error at hand
        # is h11's reason
        exc = sys.exc_info()[1]
        reason = str(exc) if isinstance(exc, h11.RemoteProtocolError) else ""
        status, body = unparsable(reason)
        headers = [(b"content-type", PROBLEM_JSON.encode()), (b"connection", b"close"),
                   (b"content-length", str(len(body)).encode())]
        for event in (h11.Response(status_code=status, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

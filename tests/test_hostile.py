"""Hostile and bad input, by hand, over real HTTP, raw sockets and WebSockets.

Every case gets a clear 4xx (or, on the ingest WebSocket, an error message with the
connection kept), and afterwards the stream's state and results are exactly as before:
one stream, with one chunk ingested and applied, is snapshotted key by key in Redis (every
key of ``service.store.keys.stream_keys``) and through ``GET /v1/streams/{s}``, and every
case compares against that first snapshot. ``tests/test_service.py`` covers the plainer
bad chunks (NaN, Infinity, wrong widths, booleans, gaps); these are the rest.
"""

import json
import re
import select
import socket
import time

import numpy as np
import pytest
from websockets.sync.client import connect as ws_connect

from service.store import connect, keys
from tests.service_fixtures import LiveServer, drain

LIMIT = 64_000  # CUSP_MAX_BODY_BYTES here
ROWS = 100  # CUSP_MAX_CHUNK_ROWS here
S = "hostile"
MODELS = ["gaussian", "gmm_components2"]


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url, max_chunk_rows=ROWS, max_body_bytes=LIMIT)
    yield server
    server.stop()


FIRST = np.random.default_rng(1).normal(size=(40, 2)).round(5).tolist()


@pytest.fixture(scope="module")
def stream(live, redis_url):
    """The stream every case aims at: seq 0 ingested and applied by both models; next seq is 1."""
    r = live.client.post("/v1/streams", json={"name": S, "columns": ["a", "b"], "models": ["gaussian", "gmm:components=2"],
                                              "sampler": {"overrides": {"particles": 6, "sghmc_steps": 3}}})
    assert r.status_code == 201, r.text
    assert live.client.post(f"/v1/streams/{S}/chunks", json={"seq": 0, "rows": FIRST}).status_code == 202
    assert drain(redis_url) == 2
    return snapshot(live, redis_url)


def snapshot(live, redis_url) -> dict:
    """Every Redis key of the stream, read by type, plus the API's view of it."""
    r = connect(redis_url)
    out = {"_members": sorted(r.smembers(keys.STREAMS)), "_keys": sorted(r.scan_iter(match=f"cusp:{{{S}}}:*", count=1000))}
    for k in keys.stream_keys(S, MODELS):
        kind = r.type(k).decode()
        if kind == "string":
            out[k] = r.get(k)
        elif kind == "hash":
            out[k] = r.hgetall(k)
        elif kind == "stream":
            out[k] = r.xrange(k)
        else:
            assert kind == "none", (k, kind)
            out[k] = None
    out["_api"] = live.client.get(f"/v1/streams/{S}").json()
    out["_evidence"] = live.client.get(f"/v1/streams/{S}/evidence").json()
    assert out[keys.seq(S)] == b"0" and len(out["_evidence"]["results"]) == 2
    return out


def unchanged(live, redis_url, before: dict) -> None:
    after = snapshot(live, redis_url)
    for k in before:
        assert after[k] == before[k], f"{k} changed"


def post_raw(live, content, ctype="application/json", params=None, path=f"/v1/streams/{S}/chunks"):
    if isinstance(content, str):
        content = content.encode()
    return live.client.post(path, content=content, headers={"Content-Type": ctype}, params=params)


def rows_json(rows: str, seq: str = "1") -> str:
    return '{"seq": ' + seq + ', "rows": ' + rows + "}"


BIG_INT = "1" + "0" * 400  # an integer JSON number that no float can hold
JSON_CASES = [
    # non-finite and huge numbers
    (rows_json("[[1.0, NaN]]"), 422, "row 0 column 'b': NaN is not accepted"),
    (rows_json("[[1.0, 2.0], [-Infinity, 1.0]]"), 422, "row 1 column 'a': -Infinity is not accepted"),
    ('{"seq": 1, "columns": {"a": [1.0], "b": [NaN]}}', 422, "row 0 column 'b': NaN is not accepted"),
    (rows_json("[[1e309, 1.0]]"), 422, "is not finite"),  # parses to inf
    (rows_json("[[-1e309, 1.0]]"), 422, "is not finite"),
    (rows_json(f"[[{BIG_INT}, 1.0]]"), 422, "is too large"),  # int -> float overflow (was a 500)
    (rows_json("[[" + "9" * 5000 + ", 1.0]]"), 400, "not valid JSON: an integer has more than 4,300 digits"),  # Python's limit, said without its advice to call sys.set_int_max_str_digits
    (rows_json("[[1e308, 1.0]]"), 422, "too large"),  # finite, but its square overflows float64 in the models
    (rows_json("[[1.7976931348623157e308, -1.7976931348623157e308]]"), 422, "too large"),
    # strings, nulls and other non-numbers in numeric columns
    (rows_json('[[1.0, "2.0"]]'), 422, '"2.0" is not a number'),
    (rows_json("[[1.0, null]]"), 422, "null is not a number"),
    (rows_json("[[1.0, {}]]"), 422, "is not a number"),
    (rows_json("[[1.0, [2.0]]]"), 422, "is not a number"),
    ('{"seq": 1, "columns": {"a": [1.0], "b": ["x"]}}', 422, "is not a number"),
    # ragged and mis-shaped
    (rows_json("[[1.0, 2.0], [1.0]]"), 422, "row 1: has 1 values"),
    (rows_json("[[1.0, 2.0], []]"), 422, "row 1: has 0 values"),
    (rows_json("[1.0, 2.0]"), 422, "row 0: must be a list"),
    (rows_json('{"a": 1}'), 422, "'rows' must be a list"),
    ('{"seq": 1, "columns": {"a": [1.0, 2.0], "b": [1.0]}}', 422, "different lengths"),
    ('{"seq": 1, "columns": {"a": 1.0, "b": [1.0]}}', 422, "must be a list of numbers"),
    ('{"seq": 1, "columns": [[1.0, 2.0]]}', 422, "must be an object"),
    ('{"seq": 1, "rows": [[1.0, 2.0]], "columns": {"a": [1.0], "b": [2.0]}}', 422, "exactly one of"),
    # empty chunks
    (rows_json("[]"), 422, "empty chunk"),
    ('{"seq": 1, "columns": {"a": [], "b": []}}', 422, "empty chunk"),
    ("{}", 422, "seq must be"),
    # over the row limit (but under the byte limit)
    (rows_json(json.dumps([[1.0, 2.0]] * (ROWS + 1))), 413, "limit is CUSP_MAX_CHUNK_ROWS=100"),
    # deeply nested JSON (under the byte limit)
    ("[" * 20_000 + "]" * 20_000, 400, "nested too deeply"),
    (rows_json("[" * 20_000 + "]" * 20_000), 400, "nested too deeply"),
    ('{"a":' * 10_000 + "1" + "}" * 10_000, 400, "nested too deeply"),
    # not JSON at all
    ("\xff\xfe garbage", 400, "not valid JSON"),
    ('{"seq": 1, "rows": [[1.0, 2.0]]', 400, "not valid JSON"),
    ("null", 400, "must be a JSON object"),
    ('"just a string"', 400, "must be a JSON object"),
]

SEQ_CASES = ["-1", "1.5", "1.0", "1e3", '"1"', '"x"', "null", "true", "[]", "{}", str(2**53 + 1), "1" + "0" * 30, "-0.0"]


@pytest.mark.parametrize("body,status,message", JSON_CASES, ids=lambda v: v[:40] if isinstance(v, str) else None)
def test_bad_json_chunks_are_refused_and_change_nothing(live, redis_url, stream, body, status, message):
    r = post_raw(live, body)
    assert r.status_code == status, r.text
    assert message in r.json()["detail"], r.json()
    unchanged(live, redis_url, stream)


@pytest.mark.parametrize("seq", SEQ_CASES)
def test_invalid_sequence_numbers_are_refused(live, redis_url, stream, seq):
    r = post_raw(live, rows_json("[[1.0, 2.0]]", seq=seq))
    assert r.status_code == 422, r.text
    assert "seq must be a non-negative integer" in r.json()["detail"]
    unchanged(live, redis_url, stream)


@pytest.mark.parametrize("seq", ["-1", "abc", "1.5", "", str(2**53 + 1), "9" * 30])
def test_invalid_query_sequence_numbers_are_refused(live, redis_url, stream, seq):
    r = post_raw(live, "1.0,2.0\n", ctype="text/csv", params={"seq": seq})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] and r.json()["errors"][0]["loc"] == ["query", "seq"]
    unchanged(live, redis_url, stream)



def test_a_query_seq_that_differs_from_the_json_bodys_is_refused(live, redis_url, stream):
    """?seq=61 with a JSON body whose seq is 60: which one was meant is unknown, so nothing is stored
    (it was taken as 60 without a word); the same seq in both is fine."""
    r = post_raw(live, rows_json("[[1.0, 2.0]]", seq="60"), params={"seq": "61"})
    assert r.status_code == 422 and "?seq=61 and the body's seq 60 differ" in r.json()["detail"], r.text
    unchanged(live, redis_url, stream)


TEXT_CASES = [
    ("text/csv", "a,b\n1.0,nan\n", 422, "'nan' is not finite"),
    ("text/csv", "a,b\n1.0,-inf\n", 422, "is not finite"),
    ("text/csv", "a,b\n1e309,1.0\n", 422, "is not finite"),
    ("text/csv", "a,b\n1e308,1.0\n", 422, "too large"),
    ("text/csv", "a,b\n1.0,2.0\n1.0\n", 422, "row 1 (line 3): has 1 values"),
    # a blank line is no row; the body's line (1-based, the header's counted) goes with the row's index
    ("text/csv", "a,b\n1.0,2.0\n\n3.0,x\n", 422, "row 1 (line 4) column 'b': 'x' is not a number"),
    ("text/csv", "a,b\n", 422, "empty chunk"),
    # a header that is not the stream's: said so (it read "row 0 column 'a': 'x' is not a number")
    ("text/csv", "x,y\n1.0,2.0\n", 422, "the header ['x', 'y'] is not the stream's columns ['a', 'b']"),
    ("text/csv", "a,b\n1.0,\x002.0\n", 422, "is not a number"),  # a NUL byte
    ("text/csv", "a,b\n" + "1.0,2.0\n" * (ROWS + 1), 413, "limit is CUSP_MAX_CHUNK_ROWS"),
    ("text/csv", "\xff\xfe", 400, "not UTF-8"),
    ("application/x-ndjson", "[1.0, NaN]\n", 422, "row 0 column 'b': NaN is not accepted"),
    ("application/x-ndjson", '{"a": 1.0, "c": 2.0}\n', 422, "keys must be exactly"),
    ("application/x-ndjson", '[1.0, 2.0]\n"x"\n', 422, "row 1: must be a list"),
    ("application/x-ndjson", "\n\n\n", 422, "empty chunk"),
    # json's own "line 1 column 9" was the line within the line: the body's line is named (a new user)
    ("application/x-ndjson", '[1.0, 2.0]\n{"a": 1.0,}\n', 400, "line 2 is not valid JSON: Expecting property name enclosed in double quotes at column 11"),
    ("application/x-ndjson", "[1.0, 2.0]\n" * (ROWS + 1), 413, "limit is CUSP_MAX_CHUNK_ROWS"),
    ("application/x-ndjson", "[" * 20_000 + "]" * 20_000 + "\n", 400, "nested too deeply"),
    ("application/xml", "<rows/>", 415, "unsupported content type"),
]


@pytest.mark.parametrize("ctype,body,status,message", TEXT_CASES, ids=lambda v: v[:30] if isinstance(v, str) else None)
def test_bad_csv_and_ndjson_chunks_are_refused(live, redis_url, stream, ctype, body, status, message):
    r = post_raw(live, body.encode("latin-1") if "\xff" in body else body, ctype=ctype, params={"seq": 1})
    assert r.status_code == status, r.text
    assert message in r.json()["detail"], r.json()
    unchanged(live, redis_url, stream)


def test_csv_field_over_the_csv_module_limit(live, redis_url, stream):
    """A 200 KB CSV field (under the default 8 MiB body limit) made the csv module raise: a 500."""
    server = LiveServer(redis_url)  # default limits, same Redis
    try:
        r = server.client.post(f"/v1/streams/{S}/chunks", params={"seq": 1}, content="a,b\n" + "1" * 200_000 + ",1\n",
                               headers={"Content-Type": "text/csv"})
        assert r.status_code == 400 and "CSV body cannot be read: field larger than field limit" in r.json()["detail"], r.text
    finally:
        server.stop()
    unchanged(live, redis_url, stream)


def test_declared_oversize_body_is_refused_without_reading_it(live, redis_url, stream):
    body = rows_json(json.dumps([[1.0, 2.0]] * 8000))  # 96 KB, with its Content-Length: refused on the header alone
    assert len(body) > LIMIT
    r = post_raw(live, body)
    assert r.status_code == 413 and "exceeds the limit" in r.json()["detail"]
    assert r.headers["connection"] == "close"
    unchanged(live, redis_url, stream)


def raw_request(port: int, head: str, body: bytes = b"") -> tuple[int, dict, bytes]:
    """Send ``head`` (request line and header lines, without the blank line) and ``body`` over a
    raw socket; read until the server closes. Returns (status, headers in lower case, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + b"\r\n\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    top, _, rest = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, v in (h.split(":", 1) for h in lines[1:]))
    return int(lines[0].split()[1]), headers, rest


CREATE = json.dumps({"name": "never", "columns": ["a"], "models": ["gaussian"]}).encode()
UNPARSABLE = [
    (f"Content-Length: {len(CREATE)}x", "invalid_content_length", "bad Content-Length"),
    (f"Content-Length: {len(CREATE)}\r\nContent-Length: {len(CREATE) + 1}", "invalid_content_length", "conflicting Content-Length"),
    (f"Content-Length: {len(CREATE)}\r\nX-Header-Without-A-Colon", "invalid_http", "illegal header line"),
]


@pytest.mark.parametrize("headers,code,reason", UNPARSABLE, ids=["not-a-number", "two-lengths", "no-colon"])
@pytest.mark.parametrize("path", [f"/v1/streams/{S}/chunks", "/v1/streams"])
def test_a_request_that_is_not_http_gets_a_problem_answer_and_changes_nothing(live, redis_url, stream, path, headers, code, reason):
    """A Content-Length that is not a number (or two that disagree) or a header line without a
    colon fails HTTP/1.1 parsing, before any route: uvicorn answered a plain-text 400 "Invalid HTTP
    request received." that named nothing; now a problem+json 400 with the code and h11's reason,
    the connection closed, nothing stored."""
    body = CREATE if path == "/v1/streams" else rows_json("[[1.0, 2.0]]").encode()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}".replace(str(len(CREATE)), str(len(body)))
    status, got, answer = raw_request(live.port, head, body)
    assert status == 400 and got["content-type"] == "application/problem+json" and got["connection"] == "close", (status, got)
    problem = json.loads(answer)
    assert problem["code"] == code and problem["status"] == 400 and problem["type"] == f"/v1/errors#{code}", problem
    assert reason in problem["detail"], problem
    assert live.client.get("/v1/streams/never").status_code == 404
    unchanged(live, redis_url, stream)


def stream_chunked(port: int, path: str, total: int, *, ctype: str = "application/json") -> tuple[bytes, int, str]:
    """POST a chunked body (no Content-Length) of up to ``total`` bytes over a raw socket, reading
    the answer while sending. Returns (answer, bytes the server took before the answer, how it ended:
    'closed' when the server closed the connection, 'stalled' when it stopped reading, 'sent' when
    all of it went through)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
    piece = b"[1.0, 2.0], " * 1365  # 16 KB of a never-ending rows array
    frame = b"%x\r\n" % len(piece) + piece + b"\r\n"
    pending = b"%x\r\n" % 20 + b'{"seq": 1, "rows": [' + b"\r\n"
    sock.setblocking(False)
    answer, sent, sent_at_answer, ended = b"", 0, None, "sent"
    try:
        while sent < total:
            readable, writable, _ = select.select([sock], [sock], [], 3.0)
            if not readable and not writable:
                ended = "stalled"
                break
            if readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    ended = "closed"
                    break
                if not data:
                    ended = "closed"
                    break
                if not answer:
                    sent_at_answer = sent
                answer += data
            if writable:
                if not pending:
                    pending = frame
                try:
                    n = sock.send(pending)
                except (BrokenPipeError, ConnectionResetError):
                    ended = "closed"
                    break
                sent += n
                pending = pending[n:]
        if ended == "closed":  # collect what is left of the answer
            try:
                while data := sock.recv(65536):
                    answer += data
            except (BlockingIOError, ConnectionResetError):
                pass
    finally:
        sock.close()
    return answer, sent if sent_at_answer is None else sent_at_answer, ended


@pytest.mark.parametrize("path", [f"/v1/streams/{S}/chunks", "/v1/streams"])
def test_chunked_body_over_the_limit_gets_413_before_it_is_read_whole(live, redis_url, stream, path):
    total = 64 * 1024 * 1024  # 1,000 times the limit
    t0 = time.monotonic()
    answer, taken, ended = stream_chunked(live.port, path, total)
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 413"), answer[:300]
    assert b"connection: close" in head
    assert b"exceeds the limit of 64000 bytes" in answer
    # the server answered after about the limit (plus what the socket buffers hold), and then stopped
    # reading: it closed the connection instead of draining the remaining ~64 MB
    assert ended in ("closed", "stalled"), ended
    assert taken < 8 * 1024 * 1024, taken
    assert time.monotonic() - t0 < 20
    unchanged(live, redis_url, stream)


def test_unknown_stream_and_model(live, redis_url, stream):
    c = live.client
    for path in ["/v1/streams/nope", "/v1/streams/nope/evidence", "/v1/streams/nope/changepoints",
                 "/v1/streams/nope/dead-letters", "/v1/streams/nope/evidence/sse",
                 f"/v1/streams/{S}%0A", f"/v1/streams/{S}%0A/evidence",  # a trailing newline is not the same name
                 "/v1/streams/..", "/v1/streams/%7Bx%7D", "/v1/streams/" + "a" * 65]:
        r = c.get(path)
        assert r.status_code == 404, (path, r.status_code, r.text)
        assert r.json()["detail"]
    assert c.post("/v1/streams/nope/chunks", json={"seq": 0, "rows": [[1.0, 2.0]]}).status_code == 404
    assert c.post(f"/v1/streams/{S}%0A/chunks", json={"seq": 1, "rows": [[1.0, 2.0]]}).status_code == 404
    assert c.delete("/v1/streams/nope").status_code == 404
    assert c.delete(f"/v1/streams/{S}%0A").status_code == 404
    r = c.get(f"/v1/streams/{S}/evidence", params={"model": "nope"})
    assert r.status_code == 404 and "no model 'nope'" in r.json()["detail"]
    unchanged(live, redis_url, stream)


@pytest.mark.parametrize("since,status", [("abc", 422), ("\u0661\u0662", 422), ("1-2-3", 422), (str(2**64), 422),
                                          (f"1-{2**64}", 422), ("-1", 422), ("1" * 21, 422),
                                          (f"{2**64 - 1}-{2**64 - 1}", 200), (f"{2**64 - 1}", 200)])
def test_bad_result_ids(live, redis_url, stream, since, status):
    r = live.client.get(f"/v1/streams/{S}/evidence", params={"since": since})
    assert r.status_code == status, r.text
    if status == 200:
        assert r.json()["results"] == []
    else:
        assert "since must be a result id" in r.json()["detail"]
        assert live.client.get(f"/v1/streams/{S}/evidence/sse", params={"since": since}).status_code == 422
    unchanged(live, redis_url, stream)


CREATE_CASES = [
    ({"name": "fresh\n", "columns": ["a"], "models": ["gaussian"]}, 422, "stream name"),  # was accepted
    ({"name": "fresh", "columns": ["a"], "models": [{"spec": "gaussian", "name": "g\n"}]}, 422, "must be 1-64"),
    ({"name": "fresh", "columns": ["a"], "models": ["gaussian"], "sampler": {"overrides": {"control_variates": float("nan")}}},
     422, "sampler.overrides.control_variates: NaN and infinity are not accepted"),  # (the field named)
    ({"name": "fresh", "columns": ["a"], "models": ["gaussian"], "sampler": {"overrides": {"lr": float("-inf")}}},
     422, "sampler.overrides.lr: NaN and infinity are not accepted"),
    ('{"name": "fresh", "columns": ["a"], "models": [{"spec": "gaussian", "prior": 1e400}]}', 422, "finite number"),
    ({"name": "fresh", "columns": ["a"], "models": ["gaussian"], "sampler": {"overrides": {"particles": 100_000}}}, 201, ""),
    ({"name": "fresh", "columns": [f"c{i}" for i in range(256)], "models": ["gmm:components=64"],
      "sampler": {"overrides": {"particles": 1000}}}, 422, "exceeds 10,000,000 values"),
    ({"name": "fresh", "columns": ["a"], "models": ["gaussian"], "seed": 2**62 + 1}, 422, "seed"),
    ({"name": "fresh", "columns": ["a"], "models": ["gaussian"], "extra": 1}, 422, "extra"),
    ({"name": "fresh", "columns": [], "models": ["gaussian"]}, 422, "columns"),
    ('{"name": "fresh", ', 400, "body is not valid JSON: Expecting property name"),  # was "body.18: JSON decode error"
    ("[" * 20_000 + "]" * 20_000, 400, "JSON nested too deeply"),  # was "There was an error parsing the body"
    # read as chunks are (``StrictJson``): FastAPI took the last of two names (a stream "other" created),
    # skipped a byte-order mark, and had no reason for a body that is not UTF-8 (a new user's trial)
    ('{"name": "fresh", "name": "other", "columns": ["a"]}', 400, "JSON object has the key 'name' twice"),
    ('{"name": "fresh", "columns": ["a"], "detector": {"threshold": 0.9, "threshold": 0.999}}', 400, "the key 'threshold' twice"),
    (b"\xef\xbb\xbf" + b'{"name": "fresh", "columns": ["a"]}', 400, "byte-order mark"),
    ('{"name": "fresh", "columns": ["\u00e9"]}'.encode("latin-1"), 400, "body is not UTF-8"),
]


@pytest.mark.parametrize("body,status,message", CREATE_CASES, ids=lambda v: str(v)[:40])
def test_bad_stream_definitions(live, redis_url, stream, body, status, message):
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    r = live.client.post("/v1/streams", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    if status == 201:
        assert live.client.delete(f"/v1/streams/{body['name']}").status_code == 204
    else:
        assert message in r.json()["detail"], r.text
        assert (r.json()["code"] == "malformed_body") == (status == 400), r.text
        assert live.client.get("/v1/streams/fresh").status_code == 404
        assert live.client.get("/v1/streams/other").status_code == 404
    unchanged(live, redis_url, stream)


def test_extreme_model_priors_give_finite_probabilities(live, redis_url):
    """Priors of 1e308 and 5e-324 are valid; their normalisation overflowed and answered 500."""
    name = "priors"
    models = [{"spec": "gaussian", "name": "big", "prior": 1e308}, {"spec": "gaussian", "name": "big2", "prior": 1e308},
              {"spec": "gaussian:mu0=1", "name": "tiny", "prior": 5e-324}]
    r = live.client.post("/v1/streams", json={"name": name, "columns": ["a"], "models": models,
                                              "sampler": {"overrides": {"particles": 4, "sghmc_steps": 2}}})
    assert r.status_code == 201, r.text
    assert live.client.post(f"/v1/streams/{name}/chunks", json={"seq": 0, "rows": [[0.5], [0.1]]}).status_code == 202
    drain(redis_url)
    r = live.client.get(f"/v1/streams/{name}")
    assert r.status_code == 200, r.text
    probs = {m["name"]: m["posterior_probability"] for m in r.json()["models"]}
    assert sum(probs.values()) == pytest.approx(1.0) and min(probs["big"], probs["big2"]) > 0.1 and probs["tiny"] < 1e-300
    # the weights as given (they were not shown: a new user could not check them)
    assert {m["name"]: m["prior"] for m in r.json()["models"]} == {"big": 1e308, "big2": 1e308, "tiny": 5e-324}
    assert live.client.delete(f"/v1/streams/{name}").status_code == 204


def test_a_value_too_large_only_in_a_models_frame_is_refused_before_it_is_stored(live, redis_url):
    """1e150 is within the accepted magnitude, but against a warm-up with an sd of 1e-5 its square
    in ``level``'s frame overflows float64. It was accepted (202) and then dead-lettered by the
    worker (issue 20); once the frame is fixed the API refuses it (422 naming model, row and
    column) over HTTP and the WebSocket, and nothing is stored."""
    name = "framed"
    r = live.client.post("/v1/streams", json={"name": name, "columns": ["y"], "models": ["level", "gaussian"]})
    assert r.status_code == 201, r.text
    warm = [[1.0 + 1e-5 * (i % 3)] for i in range(20)]
    assert live.client.post(f"/v1/streams/{name}/chunks", json={"seq": 0, "rows": warm}).status_code == 202
    assert drain(redis_url) == 2
    frame = {m["name"]: m["frame"] for m in live.client.get(f"/v1/streams/{name}").json()["models"]}["level"]
    assert frame["scale"] < 1e-4, frame
    db = connect(redis_url)
    before = sorted(db.scan_iter(match=f"cusp:{{{name}}}:*", count=1000)), db.get(keys.seq(name))
    big = {"seq": 1, "rows": [[1.0], [1e150]]}
    r = live.client.post(f"/v1/streams/{name}/chunks", json=big)
    assert r.status_code == 422, r.text
    assert re.search(r"^model 'level': row 1 column 'y': 1e\+150 is too large for this model's frame \(centre 1\.00001, scale "
                     r"8\.3666e-06, from the stream's first 5 rows\): it takes values within 1e\+150 scales of the centre, "
                     r"where its arithmetic holds; nothing stored$", r.json()["detail"]), r.json()["detail"]
    with ws_connect(f"{live.ws_url}/v1/streams/{name}/ingest") as ws:
        ws.send(json.dumps(big))
        answer = json.loads(ws.recv(timeout=10))
    assert answer["status"] == "error" and answer["code"] == 422, answer
    assert answer["detail"] == r.json()["detail"], answer
    assert (sorted(db.scan_iter(match=f"cusp:{{{name}}}:*", count=1000)), db.get(keys.seq(name))) == before
    # 1e149: its square in the frame fits float64, but it overflowed student-t's statistics, and that
    # model alone dead-lettered it (a new user's trial, 2026-12-07): past 1e150 scales, refused
    for r in [live.client.post(f"/v1/streams/{name}/chunks", json={"seq": 1, "rows": [[1.0], [1e149]]})]:
        assert r.status_code == 422 and "1e+149 is too large for this model's frame" in r.json()["detail"], r.text
    # a value the frame can hold is taken as before
    assert live.client.post(f"/v1/streams/{name}/chunks", json={"seq": 1, "rows": [[1.0], [1e140]]}).status_code == 202
    assert live.client.delete(f"/v1/streams/{name}").status_code == 204
    # a mixture without a frame, in the data's units: its float32 kernels end at 3.4e38 (1e40 made
    # SGHMC diverge, dead-lettered as "lower lr"); refused past its value limit, 1e30, from the first chunk
    r = live.client.post("/v1/streams", json={"name": name, "columns": ["y"], "models": ["gaussian", "gmm:components=2"]})
    assert r.status_code == 201, r.text
    r = live.client.post(f"/v1/streams/{name}/chunks", json={"seq": 0, "rows": [[1.0], [-1e40]]})
    assert r.status_code == 422 and r.json()["detail"] == ("model 'gmm_components2': row 1 column 'y': -1e+40 is too large "
                                                           "for this model: it takes values within +-1e+30; nothing stored"), r.text
    assert db.get(keys.seq(name)) is None and live.client.get(f"/v1/streams/{name}").json()["next_seq"] == 0
    assert live.client.post(f"/v1/streams/{name}/chunks", json={"seq": 0, "rows": [[1.0], [-1e29]]}).status_code == 202
    assert live.client.delete(f"/v1/streams/{name}").status_code == 204


def test_a_resend_of_a_chunk_stored_before_its_frame_is_answered_as_a_resend(live, redis_url):
    """A chunk with 1e150 sent right after the warm-up, before the worker fixed the frame, is stored
    (202) and dead-lettered. Its resend was refused as too large, "nothing stored" (a review,
    2026-12-07): now answered as any resend, 200 for the same data and 409 for other data."""
    name = "framed-resend"
    assert live.client.post("/v1/streams", json={"name": name, "columns": ["y"], "models": ["level"]}).status_code == 201
    warm = [[1.0 + 1e-5 * (i % 3)] for i in range(20)]
    assert live.client.post(f"/v1/streams/{name}/chunks", json={"seq": 0, "rows": warm}).status_code == 202
    big = {"seq": 1, "rows": [[1.0], [1e150]]}
    assert live.client.post(f"/v1/streams/{name}/chunks", json=big).status_code == 202  # (no frame yet)
    drain(redis_url)
    assert live.client.get(f"/v1/streams/{name}").json()["dead_letters"] == 1
    r = live.client.post(f"/v1/streams/{name}/chunks", json=big)
    assert (r.status_code, r.json()["status"]) == (200, "duplicate"), r.text
    r = live.client.post(f"/v1/streams/{name}/chunks", json={"seq": 1, "rows": [[1.0], [9e149]]})
    assert r.status_code == 409, r.text
    r = live.client.post(f"/v1/streams/{name}/chunks", json={"seq": 2, "rows": [[1.0], [1e150]]})
    assert r.status_code == 422 and "too large for this model's frame" in r.json()["detail"], r.text
    assert live.client.delete(f"/v1/streams/{name}").status_code == 204


WS_CASES = [
    (b"\x00\x01\x02 binary", 400, "not valid JSON"),
    (b"", 400, "not valid JSON"),
    ("", 400, "not valid JSON"),
    ("not json", 400, "not valid JSON"),
    ("[1, 2]", 400, "must be a JSON object"),
    ('"seq"', 400, "must be a JSON object"),
    ("[" * 20_000 + "]" * 20_000, 400, "nested too deeply"),
    ('{"rows": [[1.0, 2.0]]}', 422, "seq must be"),
    ('{"seq": 1}', 422, "exactly one of"),
    ('{"seq": 1, "rows": [[1.0, 2.0]], "x": 1}', 422, "unknown field"),
    ('{"seq": -1, "rows": [[1.0, 2.0]]}', 422, "seq must be"),
    ('{"seq": 1.0, "rows": [[1.0, 2.0]]}', 422, "seq must be"),
    ('{"seq": "1", "rows": [[1.0, 2.0]]}', 422, "seq must be"),
    ('{"seq": 1e100, "rows": [[1.0, 2.0]]}', 422, "seq must be"),
    ('{"seq": ' + "9" * 40 + ', "rows": [[1.0, 2.0]]}', 422, "seq must be"),
    ('{"seq": 5, "rows": [[1.0, 2.0]]}', 409, "expected seq 1"),
    ('{"seq": 0, "rows": [[1.0, 2.0]]}', 409, "different data"),
    ('{"seq": 1, "rows": [[1.0, NaN]]}', 422, "NaN"),
    ('{"seq": 1, "rows": [[1e309, 1.0]]}', 422, "not finite"),
    ('{"seq": 1, "rows": [[1e308, 1.0]]}', 422, "too large"),
    ('{"seq": 1, "rows": [[1.0, "2"]]}', 422, "is not a number"),
    ('{"seq": 1, "rows": [[1.0, 2.0], [1.0]]}', 422, "has 1 values"),
    ('{"seq": 1, "rows": []}', 422, "empty chunk"),
    ('{"seq": 1, "rows": ' + json.dumps([[1.0, 2.0]] * (ROWS + 1)) + "}", 413, "CUSP_MAX_CHUNK_ROWS"),
    ('{"seq": 1, "rows": [' + "[1.0, 2.0], " * 6000 + "[1.0, 2.0]]}", 413, "exceeds the limit"),  # 72 KB message
]


def test_malformed_websocket_messages_get_errors_and_keep_the_connection(live, redis_url, stream):
    with ws_connect(f"{live.ws_url}/v1/streams/{S}/ingest", max_size=2**22) as ws:
        for message, code, text in WS_CASES:
            ws.send(message)
            reply = json.loads(ws.recv(timeout=10))
            assert reply["status"] == "error" and reply["code"] == code, (message[:60], reply)
            assert text in reply["detail"], (message[:60], reply)
            if code == 409:
                assert reply["seq"] in (0, 5)
        # still open: the first chunk again is a duplicate, which changes nothing
        ws.send(json.dumps({"seq": 0, "rows": FIRST}))
        assert json.loads(ws.recv(timeout=10)) == {"seq": 0, "status": "duplicate", "id": "chunk-0"}
    unchanged(live, redis_url, stream)


def test_websocket_message_past_the_protocol_limit_closes_1009_and_a_raised_limit_is_not_shadowed(live, redis_url, stream):
    """``server_options``: uvicorn closes a connection (1009, message too big) whose message is
    over twice CUSP_MAX_BODY_BYTES, and at least its own 16 MiB default, before the app
    buffers it; under that the app answers (413 above). A body limit raised past 16 MiB
    raises the protocol's too: a 17 MiB message then reaches the app."""
    from websockets.exceptions import ConnectionClosed

    from service.api.app import server_options

    big = server_options(live.settings)["ws_max_size"]
    assert big == 16 * 1024 * 1024
    with ws_connect(f"{live.ws_url}/v1/streams/{S}/ingest", max_size=2**22) as ws:
        ws.send(" " * (big + 1))
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=20)
        assert info.value.rcvd.code == 1009
    raised = LiveServer(redis_url, max_body_bytes=20 * 1024 * 1024)  # same Redis
    try:
        assert server_options(raised.settings)["ws_max_size"] == 40 * 1024 * 1024
        with ws_connect(f"{raised.ws_url}/v1/streams/{S}/ingest", max_size=2**22) as ws:
            ws.send(" " * (17 * 1024 * 1024))
            reply = json.loads(ws.recv(timeout=30))
            assert reply["status"] == "error" and reply["code"] == 400, reply  # the app read it all: not JSON
            assert "not valid JSON" in reply["detail"]
    finally:
        raised.stop()
    unchanged(live, redis_url, stream)


def test_websocket_to_unknown_stream_or_with_bad_since_is_closed_1008(live, redis_url, stream):
    from websockets.exceptions import ConnectionClosed

    for path in ["/v1/streams/nope/ingest", "/v1/streams/nope/evidence/ws", f"/v1/streams/{S}/evidence/ws?since=abc",
                 f"/v1/streams/{S}%0A/ingest"]:
        with ws_connect(f"{live.ws_url}{path}") as ws:
            with pytest.raises(ConnectionClosed) as info:
                ws.recv(timeout=5)
            assert info.value.rcvd.code == 1008, path
    unchanged(live, redis_url, stream)


ROUND2_CASES = [
    # (content type, raw body bytes, status, message): issue 19 item 7, each refused and nothing stored
    ("application/json", '{"seq": 1, "rows": [[1.0, 2.0]]}'.encode("utf-16"), 400, "not UTF-8"),
    ("application/json", '{"seq": 1, "rows": [[1.0, 2.0]]}'.encode("utf-32"), 400, "not UTF-8"),
    ("application/json", b"\xef\xbb\xbf" + b'{"seq": 1, "rows": [[1.0, 2.0]]}', 400, "byte-order mark"),
    ("application/json", b'{"seq": 1, "rows": [[1.0, 2.0]], "rows": [[3.0, 4.0]]}', 400, "key 'rows' twice"),
    ("application/json", b'{"seq": 1, "columns": {"a": [1.0], "a": [2.0], "b": [3.0]}}', 400, "key 'a' twice"),
    ("text/csv", b"1_000,2.0\n", 422, "'1_000' is not a number"),
    # U+2028 is no line break in NDJSON: the two rows are one line, which is not one JSON value
    ("application/x-ndjson", "[1.0, 2.0]\u2028[3.0, 4.0]\n".encode(), 400, "not valid JSON"),
    (";;;", b'{"seq": 1, "rows": [[1.0, 2.0]]}', 415, "unsupported content type"),
]


@pytest.mark.parametrize("ctype,body,status,message", ROUND2_CASES, ids=[c[0] + ":" + str(i) for i, c in enumerate(ROUND2_CASES)])
def test_round2_encodings_duplicates_separators_and_media_types(live, redis_url, stream, ctype, body, status, message):
    r = live.client.post(f"/v1/streams/{S}/chunks", content=body, headers={"Content-Type": ctype},
                         params={"seq": 1} if ctype in ("text/csv", "application/x-ndjson") else None)
    assert r.status_code == status and message in r.text, (r.status_code, r.text)
    unchanged(live, redis_url, stream)


def test_each_refused_chunk_is_counted_once_under_its_reason(live, stream, redis_url):
    """cusp_ingest_rejected_total{reason}: a sequence gap, an empty chunk and a NaN, over HTTP and
    the ingest WebSocket, each count once under their own reason (gap, empty, invalid); they were
    counted again under 'invalid' (a new user's trial: the panel showed twice the refusals)."""
    from service import metrics as M

    reasons = ("gap", "empty", "invalid", "too_large", "conflict", "gone", "time_order", "backlog", "too_many_rows")

    def counts() -> dict:
        return {r: M.REJECTED.labels(r)._value.get() for r in reasons}  # noqa: SLF001

    before = counts()
    bad = [{"seq": 7, "rows": FIRST[:2]}, {"seq": 1, "rows": []}, {"seq": 1, "rows": [[float("nan"), 1.0]]}]
    for body in bad:
        r = live.client.post(f"/v1/streams/{S}/chunks", content=json.dumps(body), headers={"content-type": "application/json"})
        assert r.status_code in (400, 409, 422), r.text
    with ws_connect(f"{live.ws_url}/v1/streams/{S}/ingest") as ws:
        for body in bad:
            ws.send(json.dumps(body))
            assert json.loads(ws.recv())["status"] == "error"
    after = counts()
    assert {r: after[r] - before[r] for r in reasons} == {**dict.fromkeys(reasons, 0), "gap": 2, "empty": 2, "invalid": 2}
    assert snapshot(live, redis_url) == stream  # (and nothing was stored)


def test_a_csv_row_that_is_both_numeric_column_names_and_numbers_is_refused(live, redis_url):
    """Columns named "0" and "1" (pandas' default): a CSV chunk "0,1 / 0.5,1.5 / 1,0" was taken as a
    header and two rows (202, rows 2: a row lost without a word, a new user's trial). Header or
    data cannot be told apart: 422 saying so, nothing stored; without that row, or as JSON, taken."""
    import uuid

    s = "num" + uuid.uuid4().hex[:8]
    assert live.client.post("/v1/streams", json={"name": s, "columns": ["0", "1"], "models": ["gaussian"]}).status_code == 201
    r = live.client.post(f"/v1/streams/{s}/chunks", params={"seq": 0}, content=b"0,1\n0.5,1.5\n1,0\n",
                         headers={"content-type": "text/csv"})
    assert r.status_code == 422 and "both the stream's column names and a row of numbers" in r.json()["detail"], r.text
    assert live.client.get(f"/v1/streams/{s}").json()["next_seq"] == 0
    r = live.client.post(f"/v1/streams/{s}/chunks", params={"seq": 0}, content=b"0.5,1.5\n1,0\n", headers={"content-type": "text/csv"})
    assert r.status_code == 202 and r.json()["rows"] == 2, r.text
    r = live.client.post(f"/v1/streams/{s}/chunks", json={"seq": 1, "rows": [[0, 1], [0.5, 1.5]]})
    assert r.status_code == 202 and r.json()["rows"] == 2, r.text
    assert live.client.delete(f"/v1/streams/{s}").status_code == 204

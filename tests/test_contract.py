"""The API's contract, over real HTTP against a live server on a real (embedded) Redis:
RFC 9457 problem details with stable codes for every error, 405s with a full ``Allow``, an
OpenAPI schema that admits nothing the API refuses, clients that hang up mid-body counted as
"client_closed" and not as server errors, filtered paging that says whether more exists,
ids that cannot be confused, the stream's effective settings, and per-stream backpressure."""

import logging
import re
import socket
import time

import httpx
import numpy as np
import pytest

import cusp
from service.api.errors import CODES
from service.worker import Worker
from tests.service_fixtures import LiveServer, drain

PROBLEM_FIELDS = {"type", "title", "status", "detail", "code"}


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url, max_chunk_rows=50, max_body_bytes=20_000)
    yield server
    server.stop()


_n = iter(range(10**6))


def new_stream(live, columns=("a", "b"), models=("gaussian",), **extra) -> str:
    s = f"contract{next(_n)}"
    r = live.client.post("/v1/streams", json={"name": s, "columns": list(columns), "models": list(models), **extra})
    assert r.status_code == 201, r.text
    return s


def assert_problem(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json", r.headers
    doc = r.json()
    assert PROBLEM_FIELDS <= set(doc), doc
    assert doc["status"] == status and doc["code"] == code and doc["type"] == f"/v1/errors#{code}", doc
    assert doc["title"] == CODES[code][1] and CODES[code][0] == status
    assert doc["instance"] == r.request.url.path
    assert isinstance(doc["detail"], str) and doc["detail"]
    return doc


# --- 1. problem details -------------------------------------------------------------------------
def test_every_kind_of_error_is_a_problem_with_its_code(live):
    c = live.client
    s = new_stream(live)
    rows = [[1.0, 2.0]]
    assert_problem(c.get("/v1/streams/nope"), 404, "stream_not_found")
    assert_problem(c.get("/no/such/path"), 404, "not_found")
    assert_problem(c.get(f"/v1/streams/{s}/evidence", params={"model": "zzz"}), 404, "model_not_found")
    doc = assert_problem(c.post(f"/v1/streams/{s}/chunks", json={"seq": 0, "rows": [[1.0, 2.0], [3.0, "x"]]}), 422, "invalid_rows")
    assert doc["detail"] == "row 1 column 'b': \"x\" is not a number"  # names the row and the column, as before
    assert_problem(c.post(f"/v1/streams/{s}/chunks", json={"seq": "0", "rows": rows}), 422, "invalid_seq")
    csv = {"content-type": "text/csv"}
    for bad in ("-1", "x", str(2**53 + 1)):  # a query seq is a seq too (was invalid_request)
        doc = assert_problem(c.post(f"/v1/streams/{s}/chunks?seq={bad}", content=b"1,2\n", headers=csv), 422, "invalid_seq")
        assert doc["errors"][0]["loc"] == ["query", "seq"], doc
    assert_problem(c.post(f"/v1/streams/{s}/chunks", content=b"{", headers={"content-type": "application/json"}), 400, "malformed_body")
    assert_problem(c.post(f"/v1/streams/{s}/chunks", content=b"", headers={"content-type": "application/json"}), 400, "empty_body")
    assert_problem(c.post(f"/v1/streams/{s}/chunks", content=b"1,2", headers={"content-type": "text/plain"}), 415, "unsupported_media_type")
    assert_problem(c.post(f"/v1/streams/{s}/chunks", json={"seq": 0, "rows": rows * 51}), 413, "chunk_too_large")
    assert_problem(c.post(f"/v1/streams/{s}/chunks", content=b"[" * 30_000, headers={"content-type": "application/json"}), 413,
                   "body_too_large")
    assert_problem(c.post(f"/v1/streams/{s}/chunks", json={"seq": 3, "rows": rows}), 409, "seq_gap")
    assert c.post(f"/v1/streams/{s}/chunks", json={"seq": 0, "rows": rows}).status_code == 202
    assert_problem(c.post(f"/v1/streams/{s}/chunks", json={"seq": 0, "rows": [[5.0, 6.0]]}), 409, "seq_conflict")
    assert_problem(c.post("/v1/streams", json={"name": s, "columns": ["a"], "models": ["gaussian"]}), 409, "stream_exists")
    assert_problem(c.post("/v1/streams", json={"name": "x y", "columns": ["a"]}), 422, "invalid_stream")
    for odd in ("a\nb", " x", "x\t", "x\x9b"):  # no CSV header could name them (a new user's trial); nothing created
        doc = assert_problem(c.post("/v1/streams", json={"name": "odd1", "columns": ["a", odd]}), 422, "invalid_stream")
        assert repr(odd) in doc["detail"] and "a CSV header could not name it" in doc["detail"], doc
    assert c.get("/v1/streams/odd1").status_code == 404
    assert_problem(c.post("/v1/streams", json={"name": "m1", "columns": ["a"], "models": ["nope"]}), 422, "invalid_model")
    assert_problem(c.get(f"/v1/streams/{s}/evidence", params={"since": "abc"}), 422, "invalid_since")
    assert_problem(c.post("/v1/detect", json={"values": []}), 422, "invalid_series")
    # a JSON endpoint sent a form (curl -d without a header): 415 naming the type, nothing created
    form = {"content-type": "application/x-www-form-urlencoded"}
    doc = assert_problem(c.post("/v1/streams", content=b'{"name":"form1","columns":["a"]}', headers=form), 415, "unsupported_media_type")
    assert "application/x-www-form-urlencoded" in doc["detail"] and "application/json" in doc["detail"]
    assert c.get("/v1/streams/form1").status_code == 404
    assert_problem(c.post("/v1/detect", content=b'{"values":[1,2,3]}', headers={"content-type": "text/plain"}), 415,
                   "unsupported_media_type")
    r = c.post("/v1/streams", content=b'{"name":"form2","columns":["a"],"models":["gaussian"]}')
    assert r.status_code == 201, r.text  # no header: JSON
    assert c.post("/v1/detect", content=b'{"values":[1,2,3,4,5,6,7,8,9,10,11,12]}',
                  headers={"content-type": "application/json; charset=utf-8"}).status_code == 200
    # no type from a page of another origin (a fetch with a Blob body: no CORS preflight): refused
    page = {"origin": "https://evil.example"}
    assert_problem(c.post("/v1/streams", content=b'{"name":"csrf1","columns":["a"]}', headers=page), 415, "unsupported_media_type")
    assert c.get("/v1/streams/csrf1").status_code == 404
    assert_problem(c.post(f"/v1/streams/{s}/chunks", content=b'{"seq":1,"rows":[[1,2]]}', headers=page), 415,
                   "unsupported_media_type")
    # FastAPI's own validation: the precise messages stay, each field listed in errors
    doc = assert_problem(c.post("/v1/streams", json={"name": "ok1", "columns": "a"}), 422, "invalid_request")
    assert doc["errors"][0]["loc"] == ["body", "columns"] and "columns" in doc["detail"]
    assert_problem(c.get(f"/v1/streams/{s}/evidence", params={"limit": 0}), 422, "invalid_request")


def test_405_is_a_problem_with_every_allowed_method(live):
    c = live.client
    for method, path, allow in [("PUT", "/v1/streams/x", "DELETE, GET"), ("PATCH", "/v1/streams", "GET, POST"),
                                ("GET", "/v1/streams/x/chunks", "POST"), ("POST", "/healthz", "GET")]:
        r = c.request(method, path)
        doc = assert_problem(r, 405, "method_not_allowed")
        assert r.headers["allow"] == allow, (method, path, r.headers)
        assert allow in doc["detail"]


def test_auth_errors_are_problems(redis_url):
    server = LiveServer(redis_url, api_keys="writer-key-1,reader-key-1:read")
    try:
        r = server.client.get("/v1/streams")
        assert_problem(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        r = server.client.post("/v1/streams", json={"name": "a", "columns": ["a"]}, headers={"Authorization": "Bearer reader-key-1"})
        assert_problem(r, 403, "read_only_key")
        codes = server.client.get("/v1/errors", headers={"Authorization": "Bearer reader-key-1"}).json()["errors"]
        assert {e["code"]: (e["status"], e["title"]) for e in codes} == CODES
    finally:
        server.stop()


def test_openapi_documents_every_error_as_a_problem_with_its_codes(live):
    schema = live.client.get("/openapi.json").json()
    problem = schema["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == PROBLEM_FIELDS
    assert problem["properties"]["code"]["enum"] == list(CODES)
    errors = 0
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            for status, resp in op["responses"].items():
                if status[0] in "45":
                    errors += 1
                    assert resp["content"] == {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}, \
                        (method, path, status)
    assert errors > 20
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    chunk_codes = schema["paths"]["/v1/streams/{stream}/chunks"]["post"]["responses"]["409"]["description"]
    assert all(f"`{c}`" in chunk_codes for c in ("seq_gap", "seq_conflict", "seq_too_old"))


def test_client_exceptions_carry_the_code(live):
    s = new_stream(live)
    with cusp.Client(live.url, retries=0) as c:
        with pytest.raises(cusp.ConflictError) as err:
            c.post(s, [[1.0, 2.0]], seq=5)
        assert err.value.code == "seq_gap" and err.value.status == 409 and "expected seq 0" in err.value.detail
        assert err.value.problem["instance"] == f"/v1/streams/{s}/chunks"
        with pytest.raises(cusp.NotFoundError) as err:
            c.stream("nope")
        assert err.value.code == "stream_not_found"
        with pytest.raises(cusp.InvalidRequestError) as err:
            c.post(s, [[1.0, 2.0, 3.0]])
        assert err.value.code == "invalid_rows" and "[invalid_rows]" in str(err.value)


# --- 7. the schema admits nothing the API refuses; clients that hang up ---------------------------
def test_openapi_admits_no_input_the_api_refuses(live):
    schema = live.client.get("/openapi.json").json()
    comps = schema["components"]["schemas"]
    name = comps["StreamIn"]["properties"]["name"]
    assert name["minLength"] == 1 and name["maxLength"] == 64
    pattern = re.compile(name["pattern"])
    for bad in ("", "-a", "a b", "ä"):
        assert not pattern.search(bad)
        r = live.client.post("/v1/streams", json={"name": bad, "columns": ["a"]})
        assert r.status_code == 422, (bad, r.text)
    assert comps["ModelIn"]["properties"]["name"]["minLength"] == 1
    r = live.client.post("/v1/streams", json={"name": "emptymodelname", "columns": ["a"], "models": [{"spec": "level", "name": ""}]})
    assert r.status_code == 422 and "name ''" in r.json()["detail"]
    assert comps["StreamIn"]["properties"]["columns"]["items"]["minLength"] == 1
    body = schema["paths"]["/v1/streams/{stream}/chunks"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    rows = next(alt for alt in body["oneOf"] if "rows" in alt["properties"])["properties"]["rows"]
    assert rows["minItems"] == 1 and rows["items"]["minItems"] == 1
    s = new_stream(live)
    assert live.client.post(f"/v1/streams/{s}/chunks", json={"seq": 0, "rows": [[]]}).status_code == 422
    for path in ("/v1/streams/{stream}/evidence", "/v1/streams/{stream}/evidence/sse"):
        since = next(p for p in schema["paths"][path]["get"]["parameters"] if p["name"] == "since")
        pattern = re.compile(since["schema"]["pattern"])
        for ok in ("", "0", "1712345678901-0", "1712345678901"):
            assert pattern.search(ok)
        for bad in ("abc", "1-2-3", "-1", "1-", "\u0661"):
            assert not pattern.search(bad)
            assert live.client.get(path.format(stream=s), params={"since": bad}).status_code == 422


def http_counts(live) -> dict:
    text = live.client.get("/metrics").text
    out = {}
    for m in re.finditer(r'^cusp_http_requests_total\{route="([^"]*)",status="([^"]*)"\} ([0-9.e+]+)$', text, re.M):
        out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.parametrize("path,ctype", [("/v1/streams/{s}/chunks", "application/json"), ("/v1/streams/{s}/chunks", "text/csv"),
                                        ("/v1/streams", "application/json"), ("/v1/detect", "application/json")])
def test_a_client_hanging_up_mid_body_is_no_server_error(live, path, ctype):
    s = new_stream(live)
    path = path.format(s=s) + ("?seq=0" if ctype == "text/csv" else "")
    route = {"/v1/streams": "/v1/streams", "/v1/detect": "/v1/detect"}.get(path, "/v1/streams/{stream}/chunks")
    logs = Records()
    for name in ("uvicorn.error", "uvicorn"):
        logging.getLogger(name).addHandler(logs)
    before = http_counts(live)
    try:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", live.port)) as sock:
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\nContent-Length: 5000\r\n\r\n".encode()
                             + b'{"seq": 0, "rows": [[1.0, 2.0], [3.')
                time.sleep(0.2)  # the app is reading the body when the client goes
        deadline = time.monotonic() + 10
        while http_counts(live).get((route, "client_closed"), 0) - before.get((route, "client_closed"), 0) < 3:
            assert time.monotonic() < deadline, http_counts(live)
            time.sleep(0.05)
    finally:
        for name in ("uvicorn.error", "uvicorn"):
            logging.getLogger(name).removeHandler(logs)
    after = http_counts(live)
    assert after.get((route, "5xx"), 0) == before.get((route, "5xx"), 0)
    assert after.get((route, "4xx"), 0) == before.get((route, "4xx"), 0)
    assert not [r for r in logs.records if r.levelno >= logging.ERROR or r.exc_info], [r.getMessage() for r in logs.records]
    assert live.client.get(f"/v1/streams/{s}").json()["next_seq"] == 0  # nothing stored


# --- 3. paging filters before it limits, and says whether more exists -----------------------------
def shifted(n=400, at=200, seed=0):
    x = np.random.default_rng(seed).normal(size=n)
    x[at:] += 6.0
    return x.round(5)


@pytest.fixture(scope="module")
def processed(live, redis_url):
    """A stream of two models, 20 chunks applied by both, with a change point."""
    s = new_stream(live, columns=["x"], models=["level", "ar"])
    x = shifted()
    for seq in range(20):
        r = live.client.post(f"/v1/streams/{s}/chunks", json={"seq": seq, "rows": [[v] for v in x[seq * 20:(seq + 1) * 20]]})
        assert r.status_code == 202, r.text
    assert drain(redis_url) >= 40
    everything = live.client.get(f"/v1/streams/{s}/evidence", params={"limit": 10_000}).json()
    assert everything["has_more"] is False
    return s, everything["results"]


def pages(live, s, **params):
    out, since = [], None
    while True:
        page = live.client.get(f"/v1/streams/{s}/evidence", params={**params, **({"since": since} if since else {})})
        assert page.status_code == 200, page.text
        page = page.json()
        out.append(page)
        if not page["has_more"]:
            return out
        since = page["next"]


def test_a_filtered_page_is_filtered_before_it_is_cut(live, processed):
    s, entries = processed
    ar = [e for e in entries if e["model"] == "ar"]
    assert len(ar) >= 20 and len(entries) > len(ar)
    page = live.client.get(f"/v1/streams/{s}/evidence", params={"model": "ar", "limit": 7}).json()
    assert [e["id"] for e in page["results"]] == [e["id"] for e in ar[:7]]  # 7 of ar's, not ar's among the first 7
    assert page["has_more"] is True and page["next"] == ar[6]["id"]
    got = pages(live, s, model="ar", limit=7)
    assert [e["id"] for p in got for e in p["results"]] == [e["id"] for e in ar]
    assert all(len(p["results"]) == 7 for p in got[:-1]) and 0 < len(got[-1]["results"]) <= 7  # no empty last page
    cps = [e for e in entries if e["kind"] == "changepoint"]
    assert cps, "the shifted series has a change"
    page = live.client.get(f"/v1/streams/{s}/evidence", params={"kind": "changepoint"}).json()
    assert [e["id"] for e in page["results"]] == [e["id"] for e in cps] and page["has_more"] is False
    page = live.client.get(f"/v1/streams/{s}/evidence", params={"kind": ["changepoint", "dead_letter"], "model": "level"}).json()
    assert [e["id"] for e in page["results"]] == [e["id"] for e in cps if e["model"] == "level"]
    assert_problem(live.client.get(f"/v1/streams/{s}/evidence", params={"kind": "nope"}), 422, "invalid_request")


def test_unfiltered_pages_say_whether_more_exists(live, processed):
    s, entries = processed
    exact = live.client.get(f"/v1/streams/{s}/evidence", params={"limit": len(entries)}).json()
    assert len(exact["results"]) == len(entries) and exact["has_more"] is False and exact["next"] == entries[-1]["id"]
    short = live.client.get(f"/v1/streams/{s}/evidence", params={"limit": len(entries) - 1}).json()
    assert short["has_more"] is True and short["next"] == entries[-2]["id"]
    got = pages(live, s, limit=9)
    assert [e["id"] for p in got for e in p["results"]] == [e["id"] for e in entries]
    last = live.client.get(f"/v1/streams/{s}/evidence", params={"since": entries[-1]["id"]}).json()
    assert last == {"results": [], "next": entries[-1]["id"], "has_more": False}
    with cusp.Client(live.url) as c:
        assert [e["id"] for e in c.results(s, model="ar", kind="result")] == \
            [e["id"] for e in entries if e["model"] == "ar" and e["kind"] == "result"]


# --- 4. ids that cannot be confused -----------------------------------------------------------------
def test_chunk_ack_ids_are_not_result_ids(live, processed):
    s, entries = processed
    s2 = new_stream(live)
    ack = live.client.post(f"/v1/streams/{s2}/chunks", json={"seq": 0, "rows": [[1.0, 2.0]]}).json()
    assert ack["id"] == "chunk-0"
    assert live.client.post(f"/v1/streams/{s2}/chunks", json={"seq": 0, "rows": [[1.0, 2.0]]}).json()["id"] == "chunk-0"
    for since in ("chunk-3", "4-0", "4", "1-0", "999999999999-0"):  # new and old ack ids: refused, not read from 0
        for path in ("evidence", "evidence/sse"):
            doc = assert_problem(live.client.get(f"/v1/streams/{s}/{path}", params={"since": since}), 422, "invalid_since")
            assert "not a result id" in doc["detail"] and "ack id" in doc["detail"]
        r = live.client.get(f"/v1/streams/{s}/evidence/sse", headers={"Last-Event-ID": since})
        assert_problem(r, 422, "invalid_since")
    for since in ("0", "0-0", "", entries[3]["id"]):
        assert live.client.get(f"/v1/streams/{s}/evidence", params={"since": since}).status_code == 200
    assert all(int(e["id"].split("-")[0]) >= 10**12 for e in entries)


# --- 6. the stream shows its effective settings and its models' names as given ----------------------
def test_a_stream_shows_its_effective_settings_and_model_names(live):
    from service.detect import DetectorConfig
    from service.sgais import SGAISConfig

    s = new_stream(live, columns=["x"], models=["gmm:components=2", {"spec": "level", "name": "lvl"}],
                   sampler={"preset": "accurate", "overrides": {"particles": 12}}, detector={"threshold": 0.95})
    got = live.client.get(f"/v1/streams/{s}").json()
    assert got["sampler"] == {"preset": "accurate", "overrides": {"particles": 12}} and got["detector"] == {"threshold": 0.95}
    assert got["sampler_settings"] == {**SGAISConfig.preset("accurate").__dict__, "particles": 12}
    assert got["sampler_settings"]["integrator"] == "baoab"  # from the preset, not given
    assert got["detector_settings"] == {**DetectorConfig().to_dict(), "threshold": 0.95}
    assert [(m["name"], m["spec"], m["method"]) for m in got["models"]] == [("gmm_components2", "gmm:components=2", "sgais"),
                                                                           ("lvl", "level", "exact")]
    schema = live.client.get("/openapi.json").json()["components"]["schemas"]
    assert {"sampler_settings", "detector_settings"} <= set(schema["StreamOut"]["properties"])


# --- 5. backpressure: a per-stream backlog, beyond it 429 with Retry-After and nothing stored -------------
def test_ingest_beyond_the_backlog_is_refused_with_429_and_stores_nothing(live, redis_url):
    from service.store import connect, keys

    s = new_stream(live, columns=["x"], models=["level", "ar"], max_backlog=3)
    assert live.client.get(f"/v1/streams/{s}").json()["max_backlog"] == 3
    post = lambda seq, v=1.0: live.client.post(f"/v1/streams/{s}/chunks", json={"seq": seq, "rows": [[v], [v + 1]]})  # noqa: E731
    for seq in range(3):
        assert post(seq).status_code == 202
    r = post(3)
    doc = assert_problem(r, 429, "backlog_full")
    assert r.headers["retry-after"] == "1" and "max_backlog=3" in doc["detail"] and "3 accepted chunks" in doc["detail"]
    redis = connect(redis_url)
    try:
        assert redis.xlen(keys.inbox(s)) == 3 and redis.get(keys.seq(s)) == b"2"  # nothing stored
        assert post(2).json()["status"] == "duplicate"  # resends, gaps and conflicts answer as before
        assert_problem(post(7), 409, "seq_gap")
        assert_problem(post(2, 5.0), 409, "seq_conflict")
        w = Worker(redis_url)
        try:
            w.run_until_idle()
            assert post(3).status_code == 202  # the workers caught up: room again
            for seq in range(4, 6):
                assert post(seq).status_code == 202
            assert_problem(post(6), 429, "backlog_full")
            with cusp.Client(live.url, retries=0) as c:  # the client resends a 429 after Retry-After; out of retries:
                with pytest.raises(cusp.ServerUnavailable, match="429: .*max_backlog=3"):
                    c.post(s, [1.0, 2.0], seq=6)
            w.run_until_idle()
        finally:
            w.release_all()
        assert post(6).status_code == 202
        assert redis.get(keys.seq(s)) == b"6"
    finally:
        redis.close()
    # 0: no limit
    s0 = new_stream(live, columns=["x"], models=["level"], max_backlog=0)
    assert all(live.client.post(f"/v1/streams/{s0}/chunks", json={"seq": q, "rows": [[1.0]]}).status_code == 202 for q in range(30))
    assert_problem(live.client.post("/v1/streams", json={"name": "neg", "columns": ["x"], "max_backlog": -1}), 422, "invalid_request")
    # a string, a boolean or a fraction is no count: refused, not coerced (a new user's "5" and true were taken)
    for bad in ("5", True, 5.5):
        doc = assert_problem(live.client.post("/v1/streams", json={"name": "lax", "columns": ["x"], "max_backlog": bad}),
                             422, "invalid_request")
        assert "max_backlog" in doc["detail"], doc
    doc = assert_problem(live.client.post("/v1/streams", json={"name": "lax", "columns": ["x"],
                                                               "models": [{"spec": "level", "prior": "2"}]}), 422, "invalid_request")
    assert "prior" in doc["detail"], doc
    assert live.client.get("/v1/streams/lax").status_code == 404


def test_the_backlog_holds_under_concurrent_writers(live, redis_url):
    """Eight writers racing to append the next chunk until refused: the check is one step with
    the append, so exactly max_backlog chunks get in."""
    import concurrent.futures

    s = new_stream(live, columns=["x"], models=["level"], max_backlog=5)

    def writer(_):
        seq = 0
        with httpx.Client(base_url=live.url, timeout=30) as c:
            for _ in range(500):
                r = c.post(f"/v1/streams/{s}/chunks", json={"seq": seq, "rows": [[float(seq)]]})
                if r.status_code in (200, 202):  # ours or another writer's (same data): the next one
                    seq += 1
                elif r.status_code == 409:
                    seq = int(re.search(r"expected seq (\d+)", r.json()["detail"]).group(1))
                else:
                    return r.status_code, r.json()["code"]
        return None

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        ends = list(pool.map(writer, range(8)))
    assert ends == [(429, "backlog_full")] * 8
    assert live.client.get(f"/v1/streams/{s}").json()["next_seq"] == 5


def test_docs_list_every_error_code():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    documented = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\| `([a-z_]+)` \| (\d{3}) \|", text, re.M)}
    assert documented == {c: s for c, (s, _) in CODES.items()}


def test_the_ingest_websocket_answers_errors_with_their_code(live, redis_url):
    import json

    from websockets.sync.client import connect as ws_connect

    s = new_stream(live, columns=["x"], models=["level"], max_backlog=1)
    with ws_connect(f"{live.ws_url}/v1/streams/{s}/ingest") as ws:
        ws.send(json.dumps({"seq": 0, "rows": [[1.0], ["x"]]}))
        assert json.loads(ws.recv(timeout=10)) == {"seq": 0, "status": "error", "code": 422, "error": "invalid_rows",
                                                   "detail": "row 1 column 'x': \"x\" is not a number"}
        ws.send(json.dumps({"seq": 0, "rows": [[1.0]]}))
        assert json.loads(ws.recv(timeout=10)) == {"seq": 0, "status": "accepted", "id": "chunk-0", "rows": 1}
        ws.send(json.dumps({"seq": 1, "rows": [[1.0]]}))
        got = json.loads(ws.recv(timeout=10))
        assert (got["code"], got["error"], got["retry_after"]) == (429, "backlog_full", 1) and "max_backlog=1" in got["detail"]
        ws.send(json.dumps({"seq": 5, "rows": [[1.0]]}))
        assert json.loads(ws.recv(timeout=10))["error"] == "seq_gap"
    assert live.client.get(f"/v1/streams/{s}").json()["next_seq"] == 1

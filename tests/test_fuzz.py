"""Property-based fuzz of the HTTP API from its own OpenAPI schema (schemathesis).

Every operation in ``/openapi.json`` gets generated requests, both valid per the schema
("positive") and invalid ("negative"), sent over real HTTP to the app served by uvicorn on
an embedded redis-server. Each response must be no 5xx, carry a status code, content type,
headers and body that the schema documents for that operation, and negative requests must
be rejected with a 4xx. Generation is derandomized (a fixed seed per test), so CI sees the
same requests on every run. The event-stream operation never ends on an existing stream,
so it is fuzzed through schemathesis's ASGI transport, which cuts a stream at its read
timeout, against a second instance of the app on the same Redis.
"""

import numpy as np
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.api.app import create_app
from service.store import EmbeddedRedis
from tests.service_fixtures import LiveServer, drain, routes_of

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
NEGATIVE_CHECKS = [*CHECKS, negative_data_rejection]
SSE = ("GET", "/v1/streams/{stream}/evidence/sse")
#: generated requests per operation and generation mode in the default run (default 140), 30-150 ms each on 2 shared
#: cores: about 1,070 requests in about a minute. Operations without inputs generate their one request only.
EXAMPLES = {("POST", "/v1/streams"): 100, ("POST", "/v1/streams/{stream}/chunks"): 60, ("GET", "/v1/streams/{stream}/evidence"): 50,
            ("DELETE", "/v1/streams/{stream}"): 100}
#: an invalid request may also be refused as too large (413: chunk over the row limit)
CONFIG = schemathesis.Config.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": ["400", "401", "403", "404", "409", "413", "415", "422"]}}})
#: a stream that exists, has results and is never deleted: operations on it reach past the 404
KEPT = "fuzzkept"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    redis = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    live = LiveServer(redis.url, max_chunk_rows=50, max_body_bytes=20_000, max_streams=60)
    r = live.client.post("/v1/streams", json={"name": KEPT, "columns": ["a", "b"], "models": ["gaussian"],
                                              "sampler": {"overrides": {"particles": 4, "sghmc_steps": 2}}})
    assert r.status_code == 201, r.text
    rows = np.random.default_rng(0).normal(size=(20, 2)).round(4).tolist()
    assert live.client.post(f"/v1/streams/{KEPT}/chunks", json={"seq": 0, "rows": rows}).status_code == 202
    assert drain(redis.url) == 1
    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json", config=CONFIG)
    asgi_schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(live.settings, redis.url), config=CONFIG)
    yield live, schema, asgi_schema
    live.stop()
    redis.close()


def operations(schema):
    return [result.ok() for result in schema.get_all_operations()]  # .ok() raises if the schema has an invalid operation


def fuzz(op, mode, send, path_parameters=None, examples=140) -> int:
    """Run ``examples`` generated cases of ``op`` through ``send``; returns how many were sent."""
    sent = []

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate, Phase.shrink],
              suppress_health_check=list(HealthCheck))
    @given(op.as_strategy(mode, path_parameters=path_parameters))
    def run(case):
        send(case, NEGATIVE_CHECKS if mode is GenerationMode.NEGATIVE else CHECKS)
        sent.append(1)

    try:
        run()
    except Unsatisfiable:
        # an operation whose only inputs are free strings (or that has none) has nothing to make invalid
        assert mode is GenerationMode.NEGATIVE, op.label
    return len(sent)


@pytest.mark.parametrize("scale", [1, pytest.param(10, marks=pytest.mark.slow)])
def test_fuzz_http_api_from_its_openapi_schema(env, scale):
    live, schema, asgi_schema = env
    session = requests.Session()

    def over_http(case, checks):
        case.call_and_validate(base_url=live.url, session=session, checks=checks, timeout=30)

    def over_asgi(case, checks):
        case.call_and_validate(checks=checks, timeout=1.0)

    ops = {(op.method.upper(), op.path): op for op in operations(schema)}
    routes = {(m, r.path) for r in routes_of(live.app) if getattr(r, "include_in_schema", False) for m in getattr(r, "methods", ())}
    assert set(ops) == routes, set(ops) ^ routes  # every HTTP route is in the schema, so every one is fuzzed
    sse = next(op for op in operations(asgi_schema) if (op.method.upper(), op.path) == SSE)
    total = 0
    for key, op in ops.items():
        if key == SSE:
            total += fuzz(sse, GenerationMode.POSITIVE, over_asgi, examples=10 * scale)
            total += fuzz(sse, GenerationMode.NEGATIVE, over_asgi, examples=10 * scale)
            continue
        examples = EXAMPLES.get(key, 140) * scale
        total += fuzz(op, GenerationMode.POSITIVE, over_http, examples=examples)
        if op.query or op.body:  # a free-string path parameter cannot be made invalid
            total += fuzz(op, GenerationMode.NEGATIVE, over_http, examples=examples)
        if "{stream}" in op.path and key[0] != "DELETE" and (op.query or op.body):
            # the same operation on a stream that exists, so that validation past the lookup is fuzzed too
            total += fuzz(op, GenerationMode.POSITIVE, over_http, path_parameters={"stream": KEPT}, examples=examples // 2)
            total += fuzz(op, GenerationMode.NEGATIVE, over_http, path_parameters={"stream": KEPT}, examples=examples // 2)
    # the default run sends at least 1,000 generated requests (the count is fixed: generation is derandomized)
    print(f"schemathesis sent {total} generated requests")
    assert total >= 1000 * scale, total
    # the kept stream is still there, with its one applied chunk
    info = live.client.get(f"/v1/streams/{KEPT}").json()
    assert info["models"][0]["last_seq"] == 0 and info["models"][0]["observations"] == 20

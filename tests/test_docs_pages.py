"""The API documentation pages (/docs: Swagger UI, /redoc: ReDoc) load everything from the
server itself (files vendored in service/api/static), so they work offline: their HTML names
only local URLs, those answer 200 (behind the key, which the page passes on as ?token=), and
in headless Chromium both pages render the API with every resource they fetched local."""

import re

import pytest

from tests.service_fixtures import LiveServer
from tests.test_live_page import Chromium, find_chromium

KEY = "reader-key-1"


@pytest.fixture(scope="module")
def live(redis_url):
    server = LiveServer(redis_url, api_keys=f"writer-key-1,{KEY}:read")
    yield server
    server.stop()


def referenced(html: str) -> list[str]:
    """Every URL the page's HTML makes the browser load: src, href, spec-url and the schema's url."""
    return re.findall(r'(?:src|href|spec-url)="([^"]+)"', html) + re.findall(r"url: '([^']+)'", html)


@pytest.mark.parametrize("page,kinds", [("/docs", {"text/javascript", "text/css", "image/png", "application/json"}),
                                        ("/redoc", {"text/javascript", "image/png", "application/json"})])
def test_doc_pages_reference_only_local_assets_that_load(live, page, kinds):
    r = live.client.get(page, params={"token": KEY})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert not re.search(r"https?:|//[a-z]", r.text), "the page names an outside URL"
    urls = referenced(r.text)
    assert len(urls) == len(kinds) and all(u.startswith("/") for u in urls), urls
    seen = set()
    for url in urls:
        assert url.endswith(f"?token={KEY}"), url
        got = live.client.get(url)
        assert got.status_code == 200, (url, got.status_code)
        seen.add(got.headers["content-type"].split(";")[0])
        assert len(got.content) > 500, url
        assert live.client.get(url.split("?")[0]).status_code == 401  # behind the key like the page itself
    assert seen == kinds
    assert live.client.get("/docs/assets/index.html", params={"token": KEY}).status_code == 404  # only the docs' files


def test_doc_pages_render_offline_in_chromium(live, tmp_path):
    exe = find_chromium()
    if exe is None:
        pytest.skip("no Chromium found (make test installs it when run as root)")
    browser = Chromium(exe, tmp_path / "chromium")
    try:
        local = f"{live.url}/"
        browser.call("Page.navigate", url=f"{live.url}/docs?token={KEY}")
        n = browser.wait_for("document.querySelectorAll('.opblock').length", timeout=60)
        assert n >= 10  # one block per operation: Swagger UI read the schema
        assert browser.eval("document.body.innerText").count("/v1/streams") >= 5
        resources = browser.eval("performance.getEntriesByType('resource').map(e => e.name)")
        assert resources and all(u.startswith(local) or u.startswith(("data:", "blob:")) for u in resources), resources
        browser.screenshot(tmp_path / "docs.png")
        browser.call("Page.navigate", url=f"{live.url}/redoc?token={KEY}")
        browser.wait_for("document.querySelectorAll('[data-section-id]').length > 10 && document.title === 'cusp API'", timeout=60)
        assert "/v1/streams/{stream}/chunks" in browser.eval("document.body.innerText")
        resources = browser.eval("performance.getEntriesByType('resource').map(e => e.name)")
        assert resources and all(u.startswith(local) or u.startswith(("data:", "blob:")) for u in resources), resources
        browser.screenshot(tmp_path / "redoc.png")
    finally:
        browser.close()

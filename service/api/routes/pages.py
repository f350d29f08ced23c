"""Pages for a browser: the live page and the API documentation, behind the API key like
everything but the probes (``?token=KEY`` works too). The pages load their scripts and styles
from this server, never from a CDN, so they work offline: the documentation pages (Swagger UI at
/docs, ReDoc at /redoc) from /docs/assets/, the live page (/) its charting library from
/assets/. The files are vendored in service/api/static (swagger-ui-dist, Apache-2.0; redoc, MIT;
uplot, MIT; versions and licences beside them, static/VENDORED.md)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, JSONResponse

from service.api.deps import Page
from service.api.errors import ApiError

STATIC = Path(__file__).resolve().parents[1] / "static"

router = APIRouter(include_in_schema=False, dependencies=[Page])


#: the documentation pages' files (in STATIC) and their media types
DOC_ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "redoc.standalone.js": "text/javascript",
              "docs-favicon.png": "image/png"}
#: the live page's files (in STATIC): uPlot, its charts
PAGE_ASSETS = {"uPlot.iife.min.js": "text/javascript", "uPlot.min.css": "text/css"}


def with_token(request: Request, url: str) -> str:
    """``url`` with the page's ``?token=`` (a browser sends no Authorization header for what a page loads)."""
    token = request.query_params.get("token")
    return url + (f"?token={quote(token, safe='')}" if token else "")


def schema_url(request: Request) -> str:
    return with_token(request, "/openapi.json")


@router.get("/")
async def index():
    return FileResponse(STATIC / "index.html", media_type="text/html")


@router.get("/openapi.json")
async def openapi_json(request: Request):
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def docs(request: Request):
    return get_swagger_ui_html(openapi_url=schema_url(request), title="cusp API",
                               swagger_js_url=with_token(request, "/docs/assets/swagger-ui-bundle.js"),
                               swagger_css_url=with_token(request, "/docs/assets/swagger-ui.css"),
                               swagger_favicon_url=with_token(request, "/docs/assets/docs-favicon.png"),
                               swagger_ui_parameters={"validatorUrl": None})  # no badge fetched from swagger.io


@router.get("/redoc")
async def redoc(request: Request):
    return get_redoc_html(openapi_url=schema_url(request), title="cusp API",
                          redoc_js_url=with_token(request, "/docs/assets/redoc.standalone.js"),
                          redoc_favicon_url=with_token(request, "/docs/assets/docs-favicon.png"), with_google_fonts=False)


@router.get("/docs/assets/{name}")
async def doc_asset(name: str):
    if name not in DOC_ASSETS:
        raise ApiError(404, "not_found", f"no documentation asset named {name!r}")
    return FileResponse(STATIC / name, media_type=DOC_ASSETS[name], headers={"Cache-Control": "private, max-age=86400"})


@router.get("/assets/{name}")
async def page_asset(name: str):
    if name not in PAGE_ASSETS:
        raise ApiError(404, "not_found", f"no live page asset named {name!r}")
    return FileResponse(STATIC / name, media_type=PAGE_ASSETS[name], headers={"Cache-Control": "private, max-age=86400"})

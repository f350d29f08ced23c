"""Pages for a browser: the live page and the API documentation, behind the API key like
everything but the probes (``?token=KEY`` works too)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, JSONResponse

from service.api.deps import Page

STATIC = Path(__file__).resolve().parents[1] / "static"

router = APIRouter(include_in_schema=False, dependencies=[Page])


def schema_url(request: Request) -> str:
    token = request.query_params.get("token")
    return "/openapi.json" + (f"?token={quote(token, safe='')}" if token else "")


@router.get("/")
async def index():
    return FileResponse(STATIC / "index.html", media_type="text/html")


@router.get("/openapi.json")
async def openapi_json(request: Request):
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def docs(request: Request):
    return get_swagger_ui_html(openapi_url=schema_url(request), title="cusp API")


@router.get("/redoc")
async def redoc(request: Request):
    return get_redoc_html(openapi_url=schema_url(request), title="cusp API")

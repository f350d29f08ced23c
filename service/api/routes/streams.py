"""Streams: create, list, inspect, delete."""

from __future__ import annotations

from fastapi import APIRouter

from service.api import crud
from service.api.deps import Json, Read, SettingsDep, StoreDep, Write
from service.api.errors import READ, WRITE, errors
from service.api.schemas import StreamIn, StreamList, StreamOut

router = APIRouter(prefix="/v1/streams", tags=["streams"], strict_content_type=False)  # no Content-Type: JSON (``Json``)


@router.post("", status_code=201, response_model=StreamOut, dependencies=[Write, Json], responses=errors(400, *WRITE, 409, 413, 415, 422))
async def create_stream(body: StreamIn, store: StoreDep, settings: SettingsDep):
    return await crud.create_stream(store, settings, body)


@router.get("", dependencies=[Read], response_model=StreamList, responses=errors(*READ))
async def list_streams(store: StoreDep) -> dict:
    return {"streams": await store.stream_names()}


@router.get("/{stream}", response_model=StreamOut, dependencies=[Read], responses=errors(*READ, 404, 422))
async def get_stream(stream: str, store: StoreDep):
    return await crud.stream_out(store, await crud.stream_config(store, stream))


@router.delete("/{stream}", status_code=204, dependencies=[Write], responses=errors(*WRITE, 404, 422))
async def delete_stream(stream: str, store: StoreDep):
    await crud.delete_stream(store, await crud.stream_config(store, stream))
    return None

"""Named volumes (docs/volumes.md): ``POST|GET /v1/volumes``, ``GET|DELETE /v1/volumes/{id}``.

A volume is a directory of the tenant under the API's ``volumes_dir``; an Environment mounts it with
``volumes: [{name, path}]`` in its spec. Deleting a volume that an Environment (running or paused) mounts is
refused with 409 naming those Environments.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from adx.gateway import (
    ERRORS,
    Credentials,
    OpenApiResponses,
    delete_volume,
    error_answer,
    json_body,
    plane,
    read_json,
    volume_store,
)
from adx.model import Volume, VolumeList, VolumeRequest, parse_wire

__all__ = ["volume_router"]

volume_router = APIRouter(tags=["volumes"], responses=ERRORS)

#: A volume request is a tiny document: no reason to read more.
MAX_VOLUME_BODY_BYTES = 4096

_CONFLICT: OpenApiResponses = {
    409: error_answer("the name is taken (create), or Environments mount the volume (delete)")
}


@volume_router.post(
    "/v1/volumes",
    response_model=Volume,
    status_code=201,
    responses={**_CONFLICT},
    openapi_extra=json_body(VolumeRequest),
    summary="Create a named volume",
)
async def create_volume(request: Request, credentials: Credentials) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    body = parse_wire(VolumeRequest, await read_json(request, MAX_VOLUME_BODY_BYTES))
    volume = await asyncio.to_thread(volume_store(p).create, tenant, body.name)
    return JSONResponse(volume.to_wire(), status_code=201)


@volume_router.get("/v1/volumes", response_model=VolumeList, summary="List volumes")
async def list_volumes(request: Request, credentials: Credentials) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    volumes = await asyncio.to_thread(volume_store(p).list, tenant)
    return JSONResponse(VolumeList(volumes=volumes).to_wire())


@volume_router.get("/v1/volumes/{volume_id}", response_model=Volume, summary="Get a volume")
async def get_volume(request: Request, volume_id: str, credentials: Credentials) -> JSONResponse:
    p = plane(request)
    tenant = await p.tenant(credentials)
    return JSONResponse((await asyncio.to_thread(volume_store(p).get, tenant, volume_id)).to_wire())


@volume_router.delete(
    "/v1/volumes/{volume_id}",
    response_model=Volume,
    responses={**_CONFLICT},
    summary="Delete a volume and its files",
)
async def delete_volume_route(request: Request, volume_id: str, credentials: Credentials) -> JSONResponse:
    p = plane(request)
    volume = await delete_volume(p, await p.tenant(credentials), volume_id)
    return JSONResponse(volume.to_wire())

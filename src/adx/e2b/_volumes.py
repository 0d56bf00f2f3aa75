"""E2B's volumes on ADX named volumes (docs/e2b.md "Volumes", docs/volumes.md).

| E2B | ADX |
|---|---|
| ``POST /volumes`` ``{name}`` (``X-API-KEY``) | a named volume of the key's tenant: 201 ``{volumeID, name, token}`` |
| ``GET /volumes``, ``GET|DELETE /volumes/{id}`` | list, get (with its token), delete (409 while mounted) |
| ``/volumecontent/{id}/dir|path|file`` (``Authorization: Bearer <token>``) | the volume's files |
| ``volumeMounts: [{name, path}]`` of ``POST /v2/sandboxes`` | ``EnvironmentSpec.volumes`` |

The content API is served by the API server itself, so ``E2B_VOLUME_API_URL`` is the API's URL. A volume's
token is ``vol1.<tenant, base64url>.<MAC(tenant, volume ID)>``, made with the API's key like envd access tokens:
it names the tenant and proves the API minted it for that volume, so checking it needs no lookup; the same
token comes back from create and get.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Iterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from adx.e2b._bodies import NewVolume, PatchVolumecontentVolumeIdPathBody, body_of
from adx.e2b._control import E2bRoute, _iso, _tenant
from adx.e2b._envd import tokens_for
from adx.e2b._tokens import TokenForm
from adx.e2b._views import VolumeAndToken, VolumeEntryStat, wire
from adx.errors import AuthenticationError, InvalidInputError
from adx.gateway import delete_volume, plane, volume_store
from adx.model import Volume
from adx.volumes import EntryStat, VolumeFiles

volume_router = APIRouter(include_in_schema=False, route_class=E2bRoute)

VOLUME_TOKEN = TokenForm("vol1")


def volume_token(request: Request, volume: Volume) -> str:
    mac = tokens_for(request.app).proof("volume", volume.tenant, volume.id)
    return VOLUME_TOKEN.make(volume.tenant, mac)


def _token_tenant(request: Request, volume_id: str) -> str:
    """The tenant a valid ``Authorization: Bearer`` volume token acts for (401 otherwise)."""
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationError("authorization", "a volume token (Authorization: Bearer <token>) is required")
    read = VOLUME_TOKEN.read(token.strip())
    if read is None:
        raise AuthenticationError("authorization", "invalid volume token")
    tenant, mac = read
    if not hmac.compare_digest(mac, tokens_for(request.app).proof("volume", tenant, volume_id)):
        raise AuthenticationError("authorization", "invalid volume token for this volume")
    return tenant


def _with_token(request: Request, volume: Volume) -> dict[str, object]:
    return wire(VolumeAndToken(volume_id=volume.id, name=volume.name, token=volume_token(request, volume)))


@volume_router.post("/volumes")
async def create_volume(request: Request) -> Response:
    p = plane(request)
    tenant = await _tenant(request)
    name = (await body_of(request, NewVolume)).name
    volume = await asyncio.to_thread(volume_store(p).create, tenant, name)
    return JSONResponse(_with_token(request, volume), status_code=201)


@volume_router.get("/volumes")
async def list_volumes(request: Request) -> Response:
    p = plane(request)
    tenant = await _tenant(request)
    volumes = await asyncio.to_thread(volume_store(p).list, tenant)
    return JSONResponse([{"volumeID": v.id, "name": v.name} for v in volumes])


@volume_router.get("/volumes/{volume_id}")
async def get_volume(request: Request, volume_id: str) -> Response:
    p = plane(request)
    tenant = await _tenant(request)
    volume = await asyncio.to_thread(volume_store(p).get, tenant, volume_id)
    return JSONResponse(_with_token(request, volume))


@volume_router.delete("/volumes/{volume_id}")
async def delete_volume_route(request: Request, volume_id: str) -> Response:
    p = plane(request)
    await delete_volume(p, await _tenant(request), volume_id)
    return Response(status_code=204)


# == the volume content API ========================================================================


async def _files(request: Request, volume_id: str) -> VolumeFiles:
    tenant = _token_tenant(request, volume_id)
    store = volume_store(plane(request))
    volume = await asyncio.to_thread(store.get, tenant, volume_id)
    return VolumeFiles(store.data_dir(volume))


def _stat_view(entry: EntryStat) -> dict[str, object]:
    stat = VolumeEntryStat(
        name=entry.name,
        type=entry.type,
        path=entry.path,
        size=entry.size,
        mode=entry.mode,
        uid=entry.uid,
        gid=entry.gid,
        atime=_iso(entry.atime),
        mtime=_iso(entry.mtime),
        ctime=_iso(entry.ctime),
    )
    return wire(stat if entry.target is None else stat.model_copy(update={"target": entry.target}))


def _path(request: Request) -> str:
    path = request.query_params.get("path")
    if path is None:
        raise InvalidInputError("path", "required")
    return path


def _int(request: Request, name: str, *, low: int = 0, high: int = 2**32 - 2) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise InvalidInputError(name, f"must be an integer, got {text[:40]!r}") from None
    if not low <= value <= high:
        raise InvalidInputError(name, f"must be {low} to {high}")
    return value


def _bool(request: Request, name: str) -> bool:
    text = (request.query_params.get(name) or "false").lower()
    if text not in ("true", "false", "1", "0"):
        raise InvalidInputError(name, f"must be true or false, got {text[:40]!r}")
    return text in ("true", "1")


def _owner(request: Request) -> tuple[int | None, int | None, int | None]:
    return _int(request, "uid"), _int(request, "gid"), _int(request, "mode", high=0o7777)


@volume_router.get("/volumecontent/{volume_id}/dir")
async def list_dir(request: Request, volume_id: str) -> Response:
    files = await _files(request, volume_id)
    depth = _int(request, "depth", low=1, high=32) or 1
    entries = await asyncio.to_thread(files.list_dir, _path(request), depth)
    return JSONResponse([_stat_view(e) for e in entries])


@volume_router.post("/volumecontent/{volume_id}/dir")
async def make_dir(request: Request, volume_id: str) -> Response:
    files = await _files(request, volume_id)
    uid, gid, mode = _owner(request)
    entry = await asyncio.to_thread(files.make_dir, _path(request), uid, gid, mode, _bool(request, "force"))
    return JSONResponse(_stat_view(entry), status_code=201)


@volume_router.get("/volumecontent/{volume_id}/path")
async def stat_path(request: Request, volume_id: str) -> Response:
    files = await _files(request, volume_id)
    return JSONResponse(_stat_view(await asyncio.to_thread(files.stat, _path(request))))


@volume_router.patch("/volumecontent/{volume_id}/path")
async def patch_path(request: Request, volume_id: str) -> Response:
    files = await _files(request, volume_id)
    body = await body_of(request, PatchVolumecontentVolumeIdPathBody)
    entry = await asyncio.to_thread(files.set_metadata, _path(request), body.uid, body.gid, body.mode)
    return JSONResponse(_stat_view(entry))


@volume_router.delete("/volumecontent/{volume_id}/path")
async def remove_path(request: Request, volume_id: str) -> Response:
    files = await _files(request, volume_id)
    await asyncio.to_thread(files.remove, _path(request))
    return Response(status_code=204)


@volume_router.get("/volumecontent/{volume_id}/file")
async def read_file(request: Request, volume_id: str) -> Response:
    files = await _files(request, volume_id)
    chunks = await asyncio.to_thread(files.read, _path(request))
    # A sync iterator: Starlette reads each chunk in its thread pool, never on the event loop.
    return StreamingResponse(chunks, media_type="application/octet-stream")


@volume_router.put("/volumecontent/{volume_id}/file")
async def write_file(request: Request, volume_id: str) -> Response:
    files = await _files(request, volume_id)
    path = _path(request)
    uid, gid, mode = _owner(request)
    force = _bool(request, "force")
    loop = asyncio.get_running_loop()
    stream = request.stream().__aiter__()

    def body() -> Iterator[bytes]:
        """The request body, read on the event loop chunk by chunk for the writing thread."""
        while (chunk := asyncio.run_coroutine_threadsafe(_next(stream), loop).result()) is not None:
            yield chunk

    entry = await asyncio.to_thread(files.write, path, body(), uid, gid, mode, force)
    return JSONResponse(_stat_view(entry), status_code=201)


async def _next(stream: AsyncIterator[bytes]) -> bytes | None:
    """The next chunk, None at the end (StopAsyncIteration cannot cross into the thread's future)."""
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None

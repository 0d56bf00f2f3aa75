"""Images reaching other nodes (issue 13): a node whose image store lacks an image a create names pulls it from a
node that has it, over the node-to-node gRPC channel (mutual TLS, ``node:<name>`` certificates).

Which node: the Coordinator answers every node's InspectNode with the cluster's other live nodes; each is asked
for the image's manifest (GetImage) in turn, and the first that has it serves the layers this store lacks
(PullLayer: one tar stream each, verified by its sha256 before it is committed, ``adx.images._transfer``). The
manifest is written last, so the image exists here only once all its layers do.

Within one node a layer is pulled once however many creates need it at the same time (they wait for the same
pull), and so is an image. A pull that fails or is killed leaves no layer and no manifest: the next one starts
over (removing a killed pull's staging debris first).

The serving side (GetImage, PullLayer) is here too: both are read-only views of the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from adx._grpc_errors import from_rpc_error
from adx.errors import InvalidInputError, NotFoundError, UnavailableError
from adx.images import ImageManifest, ImageStore, LayerInfo
from adx.images._transfer import LayerReceiver, check_digest, layer_stream, remove_dead_pull_staging
from adx.proto import node_pb2 as pb
from adx.proto import node_pb2_grpc as pb_grpc

__all__ = ["ImagePuller", "Peer", "PullReport", "image_reply", "layer_chunks"]

log = logging.getLogger("adx.node.images")

#: Bound of a GetImage call (a manifest is small); a layer's stream is bounded by its progress instead.
MANIFEST_TIMEOUT_SECONDS = 10.0
#: A layer stream that delivers nothing for this long is given up (the serving node is gone or stuck).
STALL_SECONDS = 60.0

#: Fault injection for tests (the serving side): called with each chunk's index and bytes *after* they were
#: hashed, its result is what is sent. ``None`` in production.
send_fault: Callable[[int, bytes], Awaitable[bytes]] | None = None


@dataclass(frozen=True)
class Peer:
    name: str
    address: str  # host:port of its gRPC API


@dataclass
class PullReport:
    """What one pull did: from where, which layers it fetched itself (not those another pull here fetched at the
    same time, nor those the store had), how many bytes, how long."""

    image: str
    source: str
    layers_pulled: list[str] = field(default_factory=list)
    layers_present: int = 0
    bytes: int = 0
    seconds: float = 0.0


# -- serving ------------------------------------------------------------------------------------------------


def image_reply(store: ImageStore, name: str) -> pb.GetImageResponse:
    """GetImage: the manifest and layer records of ``name`` (NotFoundError when this store lacks it)."""
    manifest = store.get(name)
    infos = [store.layer_info(digest) for digest in manifest.layers]
    return pb.GetImageResponse(
        manifest_json=manifest.model_dump_json(), layer_json=[info.model_dump_json() for info in infos]
    )


async def layer_chunks(store: ImageStore, digest: str) -> AsyncGenerator[pb.LayerChunk, None]:
    """PullLayer: the layer's tar stream in chunks, then the trailer with its sha256 and size."""
    h = hashlib.sha256()
    size = 0
    index = 0
    # aclosing: a caller gone mid-stream (a cancelled call) stops tar now, not whenever the generator is collected.
    async with contextlib.aclosing(layer_stream(store, digest)) as stream:
        async for chunk in stream:
            await asyncio.to_thread(h.update, chunk)  # hashlib drops the GIL: the loop serves on meanwhile
            size += len(chunk)
            sent = chunk if send_fault is None else await send_fault(index, chunk)
            index += 1
            yield pb.LayerChunk(data=sent)
    yield pb.LayerChunk(sha256=h.hexdigest(), size=size)


# -- pulling ------------------------------------------------------------------------------------------------


class ImagePuller:
    """Pulls images into this node's store from its peers. ``store_path`` is asked once (sandboxd's health names
    its store), ``peers`` at each pull that must find a source (the Coordinator's answer: name -> address)."""

    def __init__(
        self,
        node: str,
        credentials: grpc.ChannelCredentials,
        store_path: Callable[[], Awaitable[Path | None]],
        peers: Callable[[], Awaitable[dict[str, str]]],
    ) -> None:
        self.node = node
        self.credentials = credentials
        self._store_path = store_path
        self._peer_map = peers
        self._store: ImageStore | None = None
        self._images: dict[str, asyncio.Future[PullReport | None]] = {}
        self._layers: dict[str, asyncio.Future[int]] = {}

    async def ensure(self, name: str) -> PullReport | None:
        """Make image ``name`` present in this node's store, pulling it when it is not: None when it was there
        already. Concurrent calls for one image share one pull. (The node's own images, ``NODE_IMAGES``, are
        never asked for: the driver skips them.)"""
        store = await self.store()
        if await asyncio.to_thread(_complete, store, name):
            return None
        running = self._images.get(name)
        if running is None:
            running = asyncio.ensure_future(self._pull_once(store, name, None))
            self._images[name] = running
            running.add_done_callback(lambda _: self._images.pop(name, None))
        return await asyncio.shield(running)

    async def pull(self, name: str, source: Peer | None = None) -> PullReport | None:
        """Pull ``name`` from ``source`` (None: whichever peer has it) whether or not a create needs it."""
        return await self._pull_once(await self.store(), name, source)

    async def store(self) -> ImageStore:
        """This node's image store (sandboxd's)."""
        if self._store is None:
            path = await self._store_path()
            if path is None:
                raise UnavailableError("this node's sandboxd names no image store (a sandboxd older than the node)")
            self._store = ImageStore(path)
        return self._store

    async def _peers(self) -> list[Peer]:
        return [Peer(name, address) for name, address in sorted((await self._peer_map()).items())]

    async def _pull_once(self, store: ImageStore, name: str, source: Peer | None) -> PullReport | None:
        removed = await asyncio.to_thread(remove_dead_pull_staging, store)
        if removed:
            log.info("removed the staging of %d interrupted pulls", len(removed), extra={"node": self.node})
        started = time.monotonic()
        peer, manifest, infos = await self._find(name, source)
        report = PullReport(image=name, source=peer.name)
        missing = [info for info in infos if not store.has_layer(info.digest)]
        report.layers_present = len(infos) - len(missing)
        log.info(
            "pulling image %s from node %s: %d of %d layers to fetch",
            name,
            peer.name,
            len(missing),
            len(infos),
            extra={"node": self.node, "image": name, "source": peer.name},
        )
        async with grpc.aio.secure_channel(peer.address, self.credentials) as channel:
            stub = pb_grpc.NodeStub(channel)
            for i, info in enumerate(missing, 1):
                fetched = await self._layer_once(store, stub, peer, info)
                if fetched is not None:
                    report.bytes += fetched
                    report.layers_pulled.append(info.digest)
                log.info(
                    "image %s: layer %d/%d (%s) in, %.1f MiB so far",
                    name,
                    i,
                    len(missing),
                    info.digest[:12],
                    report.bytes / 2**20,
                    extra={"node": self.node, "image": name},
                )
        # Last: the name appears only once every layer it names is here.
        await asyncio.to_thread(store.put, manifest)
        report.seconds = time.monotonic() - started
        log.info(
            "image %s pulled from node %s: %d layers, %.1f MiB in %.1fs",
            name,
            peer.name,
            len(report.layers_pulled),
            report.bytes / 2**20,
            report.seconds,
            extra={"node": self.node, "image": name, "source": peer.name},
        )
        return report

    async def _find(self, name: str, source: Peer | None) -> tuple[Peer, ImageManifest, list[LayerInfo]]:
        """The first peer that has ``name``, with its manifest and layer records (checked to agree)."""
        peers = [source] if source is not None else await self._peers()
        asked: list[str] = []
        failures: list[str] = []
        for peer in peers:
            asked.append(peer.name)
            try:
                async with grpc.aio.secure_channel(peer.address, self.credentials) as channel:
                    reply = await pb_grpc.NodeStub(channel).GetImage(
                        pb.GetImageRequest(name=name), timeout=MANIFEST_TIMEOUT_SECONDS
                    )
            except grpc.aio.AioRpcError as exc:
                error = from_rpc_error(exc, f"image {name} on node {peer.name}")
                if not isinstance(error, NotFoundError):
                    failures.append(f"{peer.name}: {error}")
                continue
            return (peer, *_checked(name, peer, reply))
        where = f"asked {', '.join(asked)}" if asked else "no other node is up"
        if failures:
            raise UnavailableError(
                f"image {name!r}: no node could serve it ({where}; {'; '.join(failures)})",
                details={"field": "image", "image": name},
            )
        raise NotFoundError(
            f"image {name!r} is on no node of the cluster ({where}); build or import it on one (adx image)",
            details={"field": "image", "image": name},
        )

    async def _layer_once(
        self, store: ImageStore, stub: pb_grpc.NodeAsyncStub, peer: Peer, info: LayerInfo
    ) -> int | None:
        """Pull one layer unless another pull of it is running here (then wait for that one, and None): the
        bytes fetched."""
        running = self._layers.get(info.digest)
        if running is not None:
            await asyncio.shield(running)
            return None
        future = asyncio.ensure_future(self._fetch_layer(store, stub, peer, info))
        self._layers[info.digest] = future
        future.add_done_callback(lambda _: self._layers.pop(info.digest, None))
        return await asyncio.shield(future)

    async def _fetch_layer(self, store: ImageStore, stub: pb_grpc.NodeAsyncStub, peer: Peer, info: LayerInfo) -> int:
        if store.has_layer(info.digest):
            return 0
        receiver = await LayerReceiver(store, info).open()
        call = stub.PullLayer(pb.PullLayerRequest(digest=info.digest))
        try:
            stream = call.__aiter__()
            while True:
                try:
                    chunk = await asyncio.wait_for(stream.__anext__(), STALL_SECONDS)
                except StopAsyncIteration:
                    raise UnavailableError(
                        f"layer {info.digest} from node {peer.name}: the stream ended without its digest",
                        details={"layer": info.digest, "node": peer.name},
                    ) from None
                except TimeoutError:
                    raise UnavailableError(
                        f"layer {info.digest} from node {peer.name}: nothing arrived for {STALL_SECONDS:g}s",
                        details={"layer": info.digest, "node": peer.name},
                    ) from None
                if chunk.sha256:
                    await receiver.finish(chunk.sha256, chunk.size, peer.name)
                    return receiver.received
                await receiver.feed(chunk.data)
        except grpc.aio.AioRpcError as exc:
            await receiver.abort()
            raise from_rpc_error(exc, f"layer {info.digest} from node {peer.name}") from None
        except BaseException:
            call.cancel()
            await receiver.abort()
            raise


def _complete(store: ImageStore, name: str) -> bool:
    manifest = store.find(name)
    return manifest is not None and all(store.has_layer(d) for d in manifest.layers)


def _checked(name: str, peer: Peer, reply: pb.GetImageResponse) -> tuple[ImageManifest, list[LayerInfo]]:
    """The peer's manifest and layer records, refused unless they describe the image asked for, layer by layer."""
    try:
        manifest = ImageManifest.model_validate_json(reply.manifest_json)
        infos = [LayerInfo.model_validate_json(doc) for doc in reply.layer_json]
    except ValueError as exc:
        raise InvalidInputError("manifest", f"node {peer.name} sent a malformed image {name!r}: {exc}") from None
    for info in infos:
        check_digest(info.digest, "layer.digest")  # a peer's digest becomes a path here: hex digits only
    if manifest.name != name or [i.digest for i in infos] != manifest.layers:
        raise InvalidInputError(
            "manifest", f"node {peer.name} answered for image {name!r} with records that do not match it"
        )
    return manifest, infos

"""The server's own decoder, downloaded once and cached by its digest: `decoder="auto"`.

A server started with `--decoder-artifact DIR` offers the decoder artifacts of the checkpoint it
serves (ListDecoderArtifacts). The client picks the one it can run best (a lossless stateful
artifact in the format of the first installed runtime, in open_decoder's order), downloads its file
(DownloadDecoderArtifact), resuming where a broken download stopped, checks the file against the
manifest's sha256 and keeps it in the client's cache (cache.py) under

    decoders/sha256-<decoder digest>/<format>-<mode>-<dtype>/{manifest.json, decoder.<format>}

so every later process, and every server with the same decoder weights, opens it from there
without a download.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import pathlib

import grpc
from codecstream.client.cache import cache_root, digest_folder_name
from codecstream.client.errors import from_rpc_error
from codecstream.client.runtimes import runnable_formats
from codecstream.client.runtimes.errors import DecoderLoadError
from codecstream.protocol.errors import ManifestError
from codecstream.protocol.manifest import MANIFEST_FILE, Manifest, file_sha256, write_manifest
from codecstream.v1 import codec_pb2
from codecstream.v1 import synthesis_pb2 as pb

log = logging.getLogger(__name__)

#: The `decoder` value that asks the server for its decoder.
AUTO = "auto"
#: Statuses after which a download is retried from where it stopped.
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
DOWNLOAD_ATTEMPTS = 5
_FIRST_RETRY_S = 0.2


@dataclasses.dataclass(frozen=True)
class Offer:
    """One format of one artifact the server offers."""

    manifest: Manifest
    format: str

    @property
    def name(self) -> str:
        return f"{self.format}-{self.manifest.mode}-{self.manifest.dtype}"


def choose(offers: list[Offer], backend: str) -> Offer | None:
    """The offer to run: one the backend asked for can open (or any installed runtime, in
    open_decoder's order), a lossless fp32 graph before a lossy one, a stateful (exact) graph
    before a windowed one."""
    formats = runnable_formats(backend)
    runnable = [o for o in offers if o.format in formats]
    ranked = sorted(
        runnable,
        key=lambda o: (o.manifest.dtype != "fp32", o.manifest.mode != "stateful", formats.index(o.format)),
    )
    return ranked[0] if ranked else None


async def fetch_decoder(
    stub,
    metadata,
    codec: codec_pb2.CodecSpec,
    target: str,
    backend: str = "auto",
    cache_dir: pathlib.Path | None = None,
) -> pathlib.Path:
    """The directory of the server's decoder for `codec`, downloaded into the cache unless it is there."""
    try:
        listing = await stub.ListDecoderArtifacts(pb.ListDecoderArtifactsRequest(), metadata=metadata, timeout=30)
    except grpc.RpcError as error:
        if error.code() is grpc.StatusCode.UNIMPLEMENTED:
            listing = pb.ListDecoderArtifactsResponse()  # a server older than the download
        else:
            raise from_rpc_error(error) from None
    offers = []
    for artifact in listing.artifacts:
        try:
            manifest = Manifest.from_json(json.loads(artifact.manifest_json), f"the manifest {target} sent")
        except (ManifestError, json.JSONDecodeError) as error:
            raise DecoderLoadError(f"{target} offers a decoder artifact this client cannot read: {error}") from None
        if manifest.codec_spec() == codec:
            offers.extend(Offer(manifest, fmt) for fmt in manifest.artifacts)
    if not offers:
        raise DecoderLoadError(
            f"the server at {target} offers no decoder artifact for its codes: pass decoder=PATH "
            "(codecstream export-decoder), or start the server with --decoder-artifact DIR"
        )
    offer = choose(offers, backend)
    if offer is None:
        held = ", ".join(sorted({o.format for o in offers}))
        raise DecoderLoadError(
            f"the server at {target} offers {held} decoder artifacts, none of which this client can run "
            f"with backend {backend!r}: pip install 'codecstream-client[onnx]' (or the extra for {held})"
        )
    directory = (cache_root() if cache_dir is None else cache_dir) / "decoders" / _digest_name(codec) / offer.name
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    entry = offer.manifest.artifacts[offer.format]
    path = directory / entry.file
    # One download per directory at a time, across processes too (agents start several workers).
    async with _directory_lock(directory):
        if not path.is_file() or path.stat().st_size != entry.size_bytes:
            await _download(stub, metadata, entry.sha256, entry.size_bytes, path, target)
        if not (directory / MANIFEST_FILE).is_file():
            only_this_format = dataclasses.replace(offer.manifest, artifacts={offer.format: entry})
            await asyncio.to_thread(write_manifest, directory, only_this_format)
    return directory


@contextlib.asynccontextmanager
async def _directory_lock(directory: pathlib.Path):
    try:
        import fcntl
    except ImportError:  # not POSIX: concurrent downloads into one cache are not guarded
        yield
        return
    with open(directory / ".lock", "w") as handle:
        await asyncio.to_thread(fcntl.flock, handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _digest_name(codec: codec_pb2.CodecSpec) -> str:
    name = digest_folder_name(codec.decoder_digest)
    if name is None:
        raise DecoderLoadError(f"the server's decoder digest {codec.decoder_digest[:80]!r} is not a hash")
    return name


async def _download(stub, metadata, sha256: str, size: int, path: pathlib.Path, target: str) -> None:
    """Fetch the file into `path` (through `path.part`, which a later call resumes) and check its sha256."""
    partial = path.with_name(path.name + ".part")
    delay = _FIRST_RETRY_S
    for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
        offset = partial.stat().st_size if partial.exists() else 0
        if offset > size:
            partial.unlink()
            offset = 0
        try:
            if offset < size:
                await _receive(stub, metadata, sha256, offset, partial)
            break
        except grpc.RpcError as error:
            if error.code() not in _RETRYABLE or attempt == DOWNLOAD_ATTEMPTS:
                raise from_rpc_error(error) from None
            log.info("decoder download from %s broke at attempt %d (%s); resuming", target, attempt, error.code().name)
            await asyncio.sleep(delay)
            delay *= 2
    actual = await asyncio.to_thread(file_sha256, partial)
    if actual != sha256:
        partial.unlink()
        raise DecoderLoadError(
            f"the decoder downloaded from {target} has {actual}, its manifest says {sha256}: download discarded"
        )
    partial.replace(path)


async def _receive(stub, metadata, sha256: str, offset: int, partial: pathlib.Path) -> None:
    call = stub.DownloadDecoderArtifact(
        pb.DownloadDecoderArtifactRequest(sha256=sha256, offset=offset), metadata=metadata
    )
    try:
        with open(partial, "ab") as handle:
            async for part in call:
                if part.offset != offset:
                    raise DecoderLoadError(f"the server sent bytes from {part.offset}, expected {offset}")
                await asyncio.to_thread(handle.write, part.data)
                offset += len(part.data)
    finally:
        with contextlib.suppress(Exception):
            call.cancel()

"""The server's own decoder, downloaded once and cached by its sha256: `decoder="auto"`.

A server started with `--decoder-artifact DIR` offers the decoder artifacts of the checkpoint it
serves (ListDecoderArtifacts). The client picks the one it can run best (a lossless stateful
artifact in the format of the first installed runtime, in open_decoder's order), downloads its file
(DownloadDecoderArtifact), resuming where a broken download stopped, checks the file against the
manifest's sha256 and keeps it in the client's cache (cache.py) under

    decoders/sha256-<the file's sha256>/{manifest.json, decoder.<format>}

so every later process, and every server that offers the same file, opens it from there without a
download, and another export of the same weights is another file.

What a server sends is data from the network, trusted for nothing but the codes it streams:
the manifest's file name must be a plain name (Manifest refuses any other), nothing is written past
the size the manifest lists nor above MAX_ARTIFACT_BYTES, and only formats whose runtimes read data
and run their own kernels are fetched (NETWORK_FORMATS): a .pt2 is never, since torch.export.load
unpickles what the archive marks as pickled, and a pickle can run any code. A file is opened in a
child process before the client opens it (artifact_trial.py): one that does not open there, or
crashes its runtime, is not kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import pathlib

import grpc
from codecstream.client import artifact_trial
from codecstream.client.cache import cache_root, digest_folder_name
from codecstream.client.errors import CONNECTION_LOST, from_rpc_error
from codecstream.client.runtimes import runnable_formats, runtime_for
from codecstream.client.runtimes.errors import DecoderLoadError
from codecstream.protocol.errors import ManifestError
from codecstream.protocol.manifest import Manifest, file_sha256, read_manifest, write_manifest
from codecstream.v1 import codec_pb2
from codecstream.v1 import synthesis_pb2 as pb

log = logging.getLogger(__name__)

#: The `decoder` value that asks the server for its decoder.
AUTO = "auto"
#: Formats the client loads from a server. ONNX (protobuf) and .pte (flatbuffer) hold a graph of
#: their runtime's own operators and weights; a .pt2 can hold pickles (see the module docstring).
NETWORK_FORMATS = ("onnx", "pte")
#: The largest file the client downloads: ONNX's protobuf cannot exceed 2 GiB, and the real-size
#: fp32 decoder is under a quarter of it; a manifest listing more is refused before any byte.
MAX_ARTIFACT_BYTES = 2 << 30
#: The most decoder="auto" may take by default, listing, download and check together
#: (AsyncClient's decoder_timeout_s): the real-size fp32 decoder over a slow link (a megabyte a second), and its check.
DEFAULT_DECODER_TIMEOUT_S = 600.0
#: The longest manifest the client parses: an exported one is a few kB.
MAX_MANIFEST_CHARS = 1 << 20
#: Longest wait for the next part of a download: a server that stops sending fails the download.
PART_TIMEOUT_S = 60.0
#: Longest wait for the child process that opens a downloaded file first (artifact_trial.py); the
#: real-size decoder opens and warms up in seconds.
TRIAL_TIMEOUT_S = 300.0
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
    formats = [fmt for fmt in runnable_formats(backend) if fmt in NETWORK_FORMATS]
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
        manifest = _offered_manifest(artifact.manifest_json, target)
        if manifest.codec_spec() == codec:
            offers.extend(Offer(manifest, fmt) for fmt in manifest.artifacts)
    if not offers:
        raise DecoderLoadError(
            f"the server at {target} offers no decoder artifact for its codes: pass decoder=PATH "
            "(codecstream export-decoder), or start the server with --decoder-artifact DIR"
        )
    offer = choose(offers, backend)
    if offer is None and not any(o.format in NETWORK_FORMATS for o in offers):
        held = ", ".join(sorted({o.format for o in offers}))
        raise DecoderLoadError(
            f"the server at {target} offers only {held} decoder artifacts, which this client does not load "
            "from a server: torch.export.load unpickles parts of a .pt2, and a pickle can run code. "
            "Ask its operator for an ONNX or .pte export, or pass decoder=PATH"
        )
    if offer is None:
        held = ", ".join(sorted({o.format for o in offers}))
        raise DecoderLoadError(
            f"the server at {target} offers {held} decoder artifacts, none of which this client can run "
            f"with backend {backend!r}: pip install 'codecstream-client[onnx]' (or the extra for {held})"
        )
    entry = offer.manifest.artifacts[offer.format]
    if entry.size_bytes > MAX_ARTIFACT_BYTES:
        raise DecoderLoadError(
            f"the server at {target} lists size_bytes {entry.size_bytes} for its {offer.format} decoder, "
            f"which is over the {MAX_ARTIFACT_BYTES} bytes a client downloads"
        )
    root = cache_root() if cache_dir is None else cache_dir
    directory = root / "decoders" / digest_folder_name(entry.sha256)  # the manifest checked the sha256's form
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    path = directory / entry.file  # a plain name: the manifest refused any other
    manifest = dataclasses.replace(offer.manifest, artifacts={offer.format: entry})
    # One download per directory at a time, across processes too (agents start several workers).
    async with _directory_lock(directory):
        if not path.is_file():  # only a file whose sha256 was checked is ever renamed to `path`
            await _download(stub, metadata, entry.sha256, entry.size_bytes, path, target)
        await asyncio.to_thread(_keep_manifest, directory, manifest)
        try:
            await artifact_trial.try_open(directory, runtime_for(directory, backend), TRIAL_TIMEOUT_S)
        except (DecoderLoadError, asyncio.TimeoutError) as error:
            await asyncio.to_thread(_discard, directory, entry.file)
            why = str(error) if isinstance(error, DecoderLoadError) else f"it did not open within {TRIAL_TIMEOUT_S:g} s"
            raise DecoderLoadError(
                f"the {offer.format} decoder the server at {target} offers cannot be used, {why}; "
                "not kept (a later call downloads it again)"
            ) from None
    return directory


def _offered_manifest(text: str, target: str) -> Manifest:
    """A manifest from the listing, parsed within bounds: the server chose every byte of it."""
    where = f"the manifest {target} sent"
    if len(text) > MAX_MANIFEST_CHARS:
        raise DecoderLoadError(
            f"{target} offers a decoder artifact this client cannot read: {where} is {len(text)} characters, "
            f"over the {MAX_MANIFEST_CHARS} a client parses"
        )
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        why = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise DecoderLoadError(f"{target} offers a decoder artifact this client cannot read: {where}: {why}") from None
    if not isinstance(data, dict):
        raise DecoderLoadError(f"{target} offers a decoder artifact this client cannot read: {where} is not an object")
    try:
        return Manifest.from_json(data, where)
    except ManifestError as error:
        raise DecoderLoadError(f"{target} offers a decoder artifact this client cannot read: {error}") from None


def _discard(directory: pathlib.Path, file: str) -> None:
    """Remove an artifact that did not open, and what was kept about it, from the cache."""
    for path in (directory / file, *directory.glob(".opened-by-*")):
        path.unlink(missing_ok=True)


def _keep_manifest(directory: pathlib.Path, manifest: Manifest) -> None:
    """Write the offered manifest unless the one kept is the same: two servers may offer one file
    under different manifests (a newer exporter's fields), and the latest offer describes it."""
    try:
        if read_manifest(directory) == manifest:
            return
    except ManifestError:
        pass  # none yet, or one that no longer parses: replaced
    write_manifest(directory, manifest)


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
                await _receive(stub, metadata, sha256, offset, size, partial, target)
            break
        except grpc.RpcError as error:
            # ABORTED: the server dropped a download it found stalled (its message says so); resumed.
            resumable = error.code() in CONNECTION_LOST or error.code() is grpc.StatusCode.ABORTED
            if not resumable or attempt == DOWNLOAD_ATTEMPTS:
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


async def _receive(stub, metadata, sha256: str, offset: int, size: int, partial: pathlib.Path, target: str) -> None:
    call = stub.DownloadDecoderArtifact(
        pb.DownloadDecoderArtifactRequest(sha256=sha256, offset=offset), metadata=metadata
    )
    parts = aiter(call)
    try:
        with open(partial, "ab") as handle:
            while True:
                try:
                    part = await asyncio.wait_for(anext(parts), PART_TIMEOUT_S)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise DecoderLoadError(
                        f"the decoder download from {target} sent nothing for {PART_TIMEOUT_S:.0f} s at byte {offset}"
                    ) from None
                if part.offset != offset:
                    raise DecoderLoadError(f"the server sent bytes from {part.offset}, expected {offset}")
                if offset + len(part.data) > size:
                    handle.close()
                    partial.unlink()
                    raise DecoderLoadError(
                        f"the server at {target} sent more than the {size} bytes its manifest lists: download discarded"
                    )
                await asyncio.to_thread(handle.write, part.data)
                offset += len(part.data)
    finally:
        with contextlib.suppress(Exception):
            call.cancel()

"""The decoder-download RPCs: ListDecoderArtifacts and DownloadDecoderArtifact.

A server started with --decoder-artifact offers its decoder (decoder_artifacts.py). Downloads are
a shared resource: one client holds at most `max_downloads_per_client` (admission.DownloadShare),
the server sends at most `max_concurrent_downloads` at once (the rest wait), each part is read and
serialized in a thread, and a client that takes no part for the stall timeout is dropped with a
status it reads once it reads again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from codecstream.server.admission import DownloadShare
from codecstream.server.calls import ClientGone, refuse_unary, set_status, write_within
from codecstream.server.decoder_artifacts import (
    PART_BYTES,
    ArtifactNotOffered,
    DecoderArtifacts,
    OffsetOutOfRange,
    serialized_parts,
)
from codecstream.server.errors import Refusal, invalid
from codecstream.server.handlers import UnreadableMessage
from codecstream.server.heap import release_free_heap
from codecstream.server.limits import ServerLimits
from codecstream.server.metrics import Metrics
from codecstream.v1 import synthesis_pb2 as pb

log = logging.getLogger(__name__)


class DecoderDownloads:
    """The artifacts a server offers (`artifacts`, set at its start) and their downloads.
    `caller(context)` names the client a call comes from."""

    def __init__(self, limits: ServerLimits, metrics: Metrics, caller: Callable[[object], str]) -> None:
        self.limits = limits
        self.metrics = metrics
        self.artifacts = DecoderArtifacts()
        self._caller = caller
        self._share = DownloadShare(limits.max_downloads_per_client)
        self._slots = asyncio.Semaphore(limits.max_concurrent_downloads)
        #: Heap releases under way (the loop keeps only weak references to tasks).
        self._releases: set[asyncio.Task] = set()

    async def ListDecoderArtifacts(self, request, context) -> pb.ListDecoderArtifactsResponse:
        if isinstance(request, UnreadableMessage):
            return refuse_unary(self.metrics, context, invalid(request.reason))
        return pb.ListDecoderArtifactsResponse(
            artifacts=[pb.DecoderArtifact(manifest_json=manifest) for manifest in self.artifacts.manifests_json]
        )

    async def DownloadDecoderArtifact(self, request, context) -> None:
        if isinstance(request, UnreadableMessage):
            return refuse_unary(self.metrics, context, invalid(request.reason))
        try:
            offered = self.artifacts.open(request.sha256, request.offset)
        except ArtifactNotOffered as error:
            return refuse_unary(self.metrics, context, Refusal("NOT_FOUND", str(error)))
        except OffsetOutOfRange as error:
            return refuse_unary(self.metrics, context, Refusal("OUT_OF_RANGE", str(error)))
        except ValueError as error:
            return refuse_unary(self.metrics, context, invalid(str(error)))
        downloaded = False
        try:
            with self._share.hold(self._caller(context)):
                downloaded = True
                async with self._slots:
                    self.metrics.artifact_downloads.inc()
                    self.metrics.downloads_running.inc()
                    try:
                        await self._send_parts(offered, request.offset, context)
                    finally:
                        self.metrics.downloads_running.dec()
        except Refusal as refusal:
            return refuse_unary(self.metrics, context, refusal)
        finally:
            if downloaded and not self._share.held:  # the last download ended: give its buffers back
                release = asyncio.ensure_future(asyncio.to_thread(release_free_heap))
                self._releases.add(release)
                release.add_done_callback(self._releases.discard)

    async def _send_parts(self, offered, offset: int, context) -> None:
        """Send the file from `offset` on. The parts are read and serialized in a thread, a read's
        worth at a time (the handler's serializer passes bytes through), so the event loop only
        hands finished messages to gRPC. A client that takes no part for the stall timeout is
        dropped with a status it reads once it reads again; a slow one that keeps taking parts is
        not (the rule counts bytes taken, PART_BYTES at a time)."""
        reads = serialized_parts(offered, offset)
        while (parts := await asyncio.to_thread(next, reads, None)) is not None:
            for size, message in parts:
                try:
                    sent = await write_within(context, message, self.limits.stalled_client_timeout_s)
                except ClientGone:
                    raise asyncio.CancelledError("the client went away during a write") from None
                if not sent:
                    self._drop_stalled(context)
                    return
                self.metrics.artifact_bytes.inc(size)

    def _drop_stalled(self, context) -> None:
        self.metrics.stalled_clients.inc()
        timeout = self.limits.stalled_client_timeout_s
        log.info("dropped a decoder download whose client took nothing for %g s", timeout)
        # Unlike a stalled stream's (stream_rpcs), this status reaches the client once it reads
        # again; cancelling the call instead left the client waiting to its own deadline.
        set_status(
            context,
            "ABORTED",
            f"download dropped: the client took no part ({PART_BYTES} bytes) for {timeout:g} s "
            "(stalled_client_timeout_s); resume from the offset received",
        )

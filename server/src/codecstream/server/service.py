"""The codecstream.v1 SynthesisService over any CodeSource (grpc.aio): the one servicer gRPC
registers, assembled from one class per family of RPCs that share nothing but the server:

- info_rpcs.ServerInfo: GetCodecInfo, ListVoices;
- download_rpcs.DecoderDownloads: ListDecoderArtifacts, DownloadDecoderArtifact;
- stream_rpcs.StreamRpcs: Synthesize, and the sessions it runs.

What they share is made here: the limits, the metrics, the admission of streams, the segmenter
every stream goes through, and who a call's client is.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from codecstream.server.admission import Admission
from codecstream.server.auth import principal
from codecstream.server.decoder_artifacts import DecoderArtifacts
from codecstream.server.download_rpcs import DecoderDownloads
from codecstream.server.info_rpcs import ServerInfo
from codecstream.server.limits import ServerLimits
from codecstream.server.metrics import Metrics
from codecstream.server.request import TaskType
from codecstream.server.segmenting import SegmentingSource
from codecstream.server.session import StreamSession
from codecstream.server.source import CodeSource
from codecstream.server.stream_rpcs import StreamRpcs
from codecstream.v1 import synthesis_pb2_grpc


class SynthesisService(synthesis_pb2_grpc.SynthesisServiceServicer):
    def __init__(
        self,
        source: CodeSource,
        limits: ServerLimits | None = None,
        metrics: Metrics | None = None,
        tokens_checked: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        #: Whether the transport checks bearer tokens (auth.BearerTokenInterceptor): only then is a
        #: token a client's identity.
        self.tokens_checked = tokens_checked
        self.limits = limits = limits or ServerLimits()
        self.metrics = metrics = metrics or Metrics()
        self.admission = Admission(limits, lambda: source.engine_slots, clock)
        # Streamed text reaches every source through the segmenter (segmenting.py).
        generator = SegmentingSource(source, limits)
        self.streams = StreamRpcs(generator, limits, metrics, self.admission, self._caller)
        self.info = ServerInfo(
            generator, limits, self.admission, metrics, self.max_request_bytes, lambda: self.streams.unavailable
        )
        self.downloads = DecoderDownloads(limits, metrics, self._caller)

    # -- the RPCs, each answered by its family --------------------------------------------------

    async def GetCodecInfo(self, request, context):
        return await self.info.GetCodecInfo(request, context)

    async def ListVoices(self, request, context):
        return await self.info.ListVoices(request, context)

    async def ListDecoderArtifacts(self, request, context):
        return await self.downloads.ListDecoderArtifacts(request, context)

    async def DownloadDecoderArtifact(self, request, context) -> None:
        await self.downloads.DownloadDecoderArtifact(request, context)

    async def Synthesize(self, request_iterator, context) -> None:
        await self.streams.Synthesize(request_iterator, context)

    # -- what the server's assembly asks of it --------------------------------------------------

    def _caller(self, context) -> str:
        """The client a call comes from (auth.principal), for per-client limits and Resume."""
        return principal(context.invocation_metadata(), context.peer(), self.tokens_checked)

    @property
    def takes_reference_audio(self) -> bool:
        return TaskType.BASE in self.source.offering.task_types

    @property
    def max_request_bytes(self) -> int:
        return self.limits.max_request_bytes(reference_audio=self.takes_reference_audio)

    @property
    def artifacts(self) -> DecoderArtifacts:
        """The decoder artifacts offered for download (the server's --decoder-artifact directories)."""
        return self.downloads.artifacts

    @artifacts.setter
    def artifacts(self, artifacts: DecoderArtifacts) -> None:
        self.downloads.artifacts = artifacts

    @property
    def sessions(self) -> dict[str, StreamSession]:
        return self.streams.sessions

    def set_unavailable(self, reason: str | None) -> None:
        """Refuse new streams with UNAVAILABLE and `reason`; None: serve them."""
        self.streams.set_unavailable(reason)

    async def stop_streams(self, reason: int, message: str) -> None:
        """End every running stream with `reason` (engine failure, shutdown)."""
        await self.streams.stop_streams(reason, message)

    async def drain(self, grace_s: float) -> None:
        """Refuse new streams, let running ones finish for `grace_s`, then end them with ERROR."""
        await self.streams.drain(grace_s)

"""The RPCs that describe the server: GetCodecInfo (the codec, the model, the limits a client is
held to, whether it takes streams now) and ListVoices."""

from __future__ import annotations

from collections.abc import Callable

from codecstream.server import __version__
from codecstream.server.admission import Admission
from codecstream.server.calls import refuse_unary
from codecstream.server.errors import invalid
from codecstream.server.handlers import UnreadableMessage
from codecstream.server.limits import ServerLimits, announced_limits
from codecstream.server.metrics import Metrics
from codecstream.server.request_parsing import TASK_TYPE_ENUMS
from codecstream.server.segmenting import SegmentingSource
from codecstream.v1 import synthesis_pb2 as pb


class ServerInfo:
    """What the server states about itself: from its source (as the segmenter every stream goes
    through wraps it), its limits and its admission."""

    def __init__(
        self,
        generator: SegmentingSource,
        limits: ServerLimits,
        admission: Admission,
        metrics: Metrics,
        max_request_bytes: int,
        not_serving: Callable[[], str | None],
    ) -> None:
        self._generator = generator
        #: Why new streams are refused now (None while they are served): the server answers
        #: GetCodecInfo while its engine starts, restarts or drains.
        self._not_serving = not_serving
        self._limits = limits
        self._admission = admission
        self._metrics = metrics
        self._max_request_bytes = max_request_bytes

    async def GetCodecInfo(self, request, context) -> pb.GetCodecInfoResponse:
        if isinstance(request, UnreadableMessage):
            return refuse_unary(self._metrics, context, invalid(request.reason))
        source = self._generator
        not_serving = self._not_serving()
        return pb.GetCodecInfoResponse(
            codec=source.codec,
            model=source.model_name,
            server_version=__version__,
            languages=source.offering.languages,
            task_types=[TASK_TYPE_ENUMS[t] for t in source.offering.task_types],
            **announced_limits(self._limits),
            max_request_bytes=self._max_request_bytes,
            streamed_text_grows=self._generator.grows_streamed_text,
            max_streams_per_client=self._admission.streams_per_client,
            serving_state=pb.SERVING_STATE_NOT_SERVING if not_serving else pb.SERVING_STATE_SERVING,
            not_serving_reason=not_serving or "",
        )

    async def ListVoices(self, request, context) -> pb.ListVoicesResponse:
        if isinstance(request, UnreadableMessage):
            return refuse_unary(self._metrics, context, invalid(request.reason))
        offering = self._generator.offering
        return pb.ListVoicesResponse(
            voices=[pb.Voice(name=v.name, description=v.description, languages=v.languages) for v in offering.voices],
            default_voice=offering.default_voice,
        )

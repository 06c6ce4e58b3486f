"""Where codes come from: the seam between the gRPC service and a code generator.

The service speaks the codecstream.v1 contract; a `CodeSource` turns one checked request into a
`Generation`: what its Header announces, then a sequence of typed events — `Frames` (codes and the
text they speak), `SegmentEnd`, and last `Finished` with the generator's reason. Sources report
what happened; the session alone decides the stream's End from it (session.py). Two sources
exist: the vLLM-Omni talker (production) and a replay of a codes file (deterministic QA, load
tests); segmenting.py is a source that wraps another. None of them knows about gRPC.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import types
from collections.abc import AsyncIterator, Mapping

import numpy as np
from codecstream.protocol.decoding import NUM_CODEBOOKS
from codecstream.server.limits import ServerLimits
from codecstream.server.request import ModelOffering, SynthesisRequest
from codecstream.v1 import codec_pb2

#: No frames: an empty (0, 16) int16 array.
NO_CODES = np.zeros((0, NUM_CODEBOOKS), dtype=np.int16)


@dataclasses.dataclass(frozen=True)
class Frames:
    """Codes the generator produced, shape (k, 16) int16 with k >= 1, and the characters
    [text_start, text_end) of the request's text it was conditioned on while producing them.
    `ends_text_span`: these frames are the last to speak that span (a growing request's frame
    speaks its own token); otherwise the span goes on until SegmentEnd or Finished."""

    codes: np.ndarray
    text_start: int
    text_end: int
    ends_text_span: bool = False


@dataclasses.dataclass(frozen=True)
class SegmentEnd:
    """A segment of streamed text is complete: frames on either side never share a chunk."""


class FinishReason(enum.Enum):
    #: The talker sampled codec EOS: the utterance is complete.
    EOS = "eos"
    #: The generator stopped at the frame limit it was given.
    LENGTH = "length"
    #: The generator stopped because abort() asked it to.
    ABORTED = "aborted"


@dataclasses.dataclass(frozen=True)
class Finished:
    """The last event of every generation."""

    reason: FinishReason


Event = Frames | SegmentEnd | Finished


class Generation(abc.ABC):
    """One request being generated. `reference_codes` and `max_frames` are known when the source
    returns it (they go into the Header); iterating it yields Events until Finished."""

    def __init__(self, max_frames: int, reference_codes: np.ndarray = NO_CODES) -> None:
        #: The most frames this generation can yield (the request's limit, or less if the
        #: generator's context cannot hold more): what Header.max_frames announces.
        self.max_frames = max_frames
        #: Codes that prime the client's decoder and are never played (voice clone); (n, 16) int16.
        self.reference_codes = reference_codes

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[Event]:
        """Yield Frames as soon as the generator has them, then Finished; raise GenerationFailed
        when generation fails. After abort() the frames still in flight may follow, then
        Finished(ABORTED)."""

    @abc.abstractmethod
    async def abort(self) -> None:
        """Stop generating now and release everything the request holds; safe to call twice, never raises."""


class CodeSource(abc.ABC):
    """A generator of code streams for one loaded model."""

    #: What the codes mean: codec spec plus the digest of the decoder weights that go with them.
    codec: codec_pb2.CodecSpec
    #: Name of the loaded model (path or hub id), reported by GetCodecInfo.
    model_name: str = ""
    #: Task types, voices and languages of the model.
    offering: ModelOffering
    #: Whether `open_streamed` speaks a streamed text as one request that grows as the text
    #: arrives; a source without it gets streamed text cut into segments (segmenting.py).
    grows_streamed_text: bool = False
    #: Requests the engine generates at once (vLLM's max_num_seqs), once started; None for a source
    #: without such a bound (replay). A stream holds one from its Start to its End.
    engine_slots: int | None = None
    #: Seconds each phase of the last start took (the engine's own, then each warm-up); empty for
    #: a source that starts at once.
    start_timeline: Mapping[str, float] = types.MappingProxyType({})

    @abc.abstractmethod
    async def open(self, request: SynthesisRequest, stream_id: str) -> Generation:
        """Start generating; return once the generator has accepted the request (the Header may be
        sent then). Raise Refusal for a request it cannot serve, SourceUnavailable when it cannot
        serve at all."""

    async def open_streamed(self, request: SynthesisRequest, stream_id: str, limits: ServerLimits) -> Generation:
        """Like `open`, for a request with streamed text, where `grows_streamed_text` is set: returns
        at once (the Header goes out before the text is complete)."""
        raise NotImplementedError(f"{type(self).__name__} does not grow requests")

    async def start(self) -> None:
        """Load the model and warm up; called before serving, and again to restart after a failure."""
        return None

    async def check_health(self) -> None:
        """Raise SourceUnavailable if the source can no longer serve (cheap: called a few times a second)."""
        return None

    async def live_requests(self) -> int:
        """Requests still holding generator resources (for leak checks and metrics)."""
        return 0

    async def close(self) -> None:
        """Release the generator (engine shutdown); safe on a source that failed or never started."""
        return None

"""Where codes come from: the seam between the gRPC service and a code generator.

The service speaks the codecstream.v1 contract; a `CodeSource` turns one validated request into a
`CodeStream` of code frames. Two sources exist: the vLLM-Omni talker (production) and a replay of a
codes file (deterministic QA, load tests). Neither knows about gRPC.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import AsyncIterator

import numpy as np
from codecstream.protocol.decoding import NUM_CODEBOOKS
from codecstream.server.reference_audio import ReferenceAudio
from codecstream.v1 import codec_pb2


class TaskType(enum.Enum):
    """Qwen3-TTS task types, spelled as vLLM-Omni and qwen-tts spell them."""

    CUSTOM_VOICE = "CustomVoice"
    VOICE_DESIGN = "VoiceDesign"
    BASE = "Base"


@dataclasses.dataclass(frozen=True)
class SamplingOverrides:
    """Sampling settings a request may override; None keeps the model's default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None


@dataclasses.dataclass(frozen=True)
class SynthesisRequest:
    """One synthesis request after the service has checked it against the contract, the limits and
    what the model offers (its voice and language are the model's own spelling)."""

    text: str
    task_type: TaskType = TaskType.CUSTOM_VOICE
    voice: str = ""
    language: str = "Auto"
    instructions: str = ""
    #: Decoded reference speech (BASE only).
    reference: ReferenceAudio | None = None
    reference_text: str = ""
    seed: int | None = None
    sampling: SamplingOverrides = dataclasses.field(default_factory=SamplingOverrides)
    max_frames: int = 0


@dataclasses.dataclass(frozen=True)
class VoiceInfo:
    name: str
    description: str = ""
    languages: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ModelOffering:
    """What a loaded model serves, as GetCodecInfo and ListVoices report it."""

    task_types: tuple[TaskType, ...]
    #: Preset voices in the checkpoint's order.
    voices: tuple[VoiceInfo, ...] = ()
    #: Languages as users write them ("English"), "Auto" first.
    languages: tuple[str, ...] = ("Auto",)

    @property
    def default_voice(self) -> str:
        """The voice an empty Start.voice gets: the first preset, as vLLM-Omni's speech API picks it."""
        return self.voices[0].name if self.voices else ""


class RequestRejected(Exception):
    """A request the source cannot serve; `status` names the gRPC status code (e.g. 'INVALID_ARGUMENT')."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class GenerationFailed(Exception):
    """Generation stopped on a failure; the message is one line a client may read (End.message)."""


class SourceUnavailable(Exception):
    """The source cannot serve at all (its engine died); the message says why, in one line."""


class StopReason(enum.Enum):
    EOS = "eos"
    MAX_FRAMES = "max_frames"


class CodeStream(abc.ABC):
    """Code frames of one request, in order, as the generator produces them."""

    #: Codes that prime the client's decoder and are never played (voice clone); shape (n, 16) int16.
    reference_codes: np.ndarray = np.zeros((0, NUM_CODEBOOKS), dtype=np.int16)
    #: The most frames this stream can yield (the request's limit, or less if the generator's
    #: context cannot hold more): what Header.max_frames announces.
    max_frames: int = 0
    #: Set once iteration ends normally.
    stop_reason: StopReason | None = None
    #: Frames the generator produced after abort() that were never yielded (measured, not sent).
    frames_after_abort: int = 0

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[np.ndarray]:
        """Yield int16 arrays of shape (k, 16), k >= 1, as soon as the generator has them; raise
        GenerationFailed when generation fails. A stream of streamed text also yields empty
        arrays, each marking the end of a segment: frames on either side never share a chunk."""

    @abc.abstractmethod
    async def abort(self) -> None:
        """Stop generating now and release everything the request holds; safe to call twice, never raises."""

    def text_span(self) -> tuple[int, int] | None:
        """Characters [start, end) of the text the frames being yielded speak; None: the whole
        request text (a stream of streamed text names its current segment)."""
        return None


class CodeSource(abc.ABC):
    """A generator of code streams for one loaded model."""

    #: What the codes mean: codec spec plus the digest of the decoder weights that go with them.
    codec: codec_pb2.CodecSpec
    #: Name of the loaded model (path or hub id), reported by GetCodecInfo.
    model_name: str = ""
    #: Task types, voices and languages of the model.
    offering: ModelOffering

    @abc.abstractmethod
    async def open(self, request: SynthesisRequest, stream_id: str) -> CodeStream:
        """Start generating; return once the generator has accepted the request (the Header may be
        sent then). Raise RequestRejected for a request it cannot serve, SourceUnavailable when it
        cannot serve at all."""

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

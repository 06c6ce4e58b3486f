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
    """One synthesis request after the service has checked its shape (not its voice or language)."""

    text: str
    task_type: TaskType = TaskType.CUSTOM_VOICE
    voice: str = ""
    language: str = "Auto"
    instructions: str = ""
    reference_audio: bytes = b""
    reference_text: str = ""
    seed: int | None = None
    sampling: SamplingOverrides = SamplingOverrides()
    max_frames: int = 0


@dataclasses.dataclass(frozen=True)
class VoiceInfo:
    name: str
    description: str = ""
    languages: tuple[str, ...] = ()


class RequestRejected(Exception):
    """A request the source cannot serve; `status` names the gRPC status code (e.g. 'INVALID_ARGUMENT')."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class StopReason(enum.Enum):
    EOS = "eos"
    MAX_FRAMES = "max_frames"


class CodeStream(abc.ABC):
    """Code frames of one request, in order, as the generator produces them."""

    #: Codes that prime the client's decoder and are never played (voice clone); shape (n, 16) int16.
    reference_codes: np.ndarray = np.zeros((0, 16), dtype=np.int16)
    #: Set once iteration ends normally.
    stop_reason: StopReason | None = None

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[np.ndarray]:
        """Yield int16 arrays of shape (k, 16), k >= 1, as soon as the generator has them."""

    @abc.abstractmethod
    async def abort(self) -> None:
        """Stop generating now and release everything the request holds; safe to call twice."""


class CodeSource(abc.ABC):
    """A generator of code streams for one loaded model."""

    #: What the codes mean: codec spec plus the digest of the decoder weights that go with them.
    codec: codec_pb2.CodecSpec
    #: Name of the loaded model (path or hub id), reported by GetCodecInfo.
    model_name: str = ""

    @abc.abstractmethod
    def voices(self) -> list[VoiceInfo]: ...

    @abc.abstractmethod
    def languages(self) -> list[str]: ...

    @abc.abstractmethod
    def supported_task_types(self) -> list[TaskType]: ...

    @abc.abstractmethod
    async def open(self, request: SynthesisRequest, stream_id: str) -> CodeStream:
        """Start generating; raise RequestRejected for a voice, language or task it cannot serve."""

    async def start(self) -> None:
        """Load the model and warm up; called once before serving."""
        return None

    async def live_requests(self) -> int:
        """Requests still holding generator resources (for leak checks and metrics)."""
        return 0

    async def close(self) -> None:
        """Release the generator (engine shutdown)."""
        return None

"""One synthesis request as the server's layers pass it on, and what a loaded model offers.

`parse_start` (request_parsing.py) builds a SynthesisRequest from a Start and checks it against the
contract, the limits and the ModelOffering; every value in it is then canonical (the voice and the
language spelled as the model spells them), and the code sources trust it as it is.
"""

from __future__ import annotations

import dataclasses
import enum

from codecstream.server.reference_audio import ReferenceAudio
from codecstream.server.text_input import StreamedText

#: The language a request gets when it names none: the talker detects it.
AUTO_LANGUAGE = "Auto"


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
    """One synthesis request, checked and canonical (see the module docstring)."""

    #: The whole text; empty when `streamed_text` brings it.
    text: str
    task_type: TaskType = TaskType.CUSTOM_VOICE
    #: A preset voice of the model (CUSTOM_VOICE), as ModelOffering.voices names it.
    voice: str = ""
    #: One of ModelOffering.languages.
    language: str = AUTO_LANGUAGE
    instructions: str = ""
    #: Decoded reference speech (BASE only).
    reference: ReferenceAudio | None = None
    reference_text: str = ""
    seed: int | None = None
    sampling: SamplingOverrides = dataclasses.field(default_factory=SamplingOverrides)
    max_frames: int = 0
    #: The text of a Start with streaming_text, growing as TextInput messages arrive; None: `text`
    #: is all there is.
    streamed_text: StreamedText | None = None

    @property
    def text_so_far(self) -> str:
        """The text received so far: offsets in Chunks and End refer to it."""
        return self.streamed_text.text if self.streamed_text is not None else self.text


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
    #: Languages as users write them ("English"), AUTO_LANGUAGE first.
    languages: tuple[str, ...] = (AUTO_LANGUAGE,)

    @property
    def default_voice(self) -> str:
        """The voice an empty Start.voice gets: the first preset, as vLLM-Omni's speech API picks it."""
        return self.voices[0].name if self.voices else ""

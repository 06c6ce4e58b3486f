"""Replay a recorded codes file as if a model generated it: deterministic streams for QA and load tests."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import numpy as np
from codecstream.protocol.codec_spec import qwen3_tts_12hz_spec
from codecstream.protocol.codes_file import CodesFile, load_codes_file
from codecstream.protocol.digest import decoder_digest
from codecstream.server.source import (
    CodeSource,
    CodeStream,
    StopReason,
    SynthesisRequest,
    TaskType,
    VoiceInfo,
)

#: Speakers and languages of the released Qwen3-TTS CustomVoice models, so that replay accepts the
#: requests a real server would.
QWEN3_TTS_SPEAKERS = ("vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee")
QWEN3_TTS_LANGUAGES = (
    "Chinese", "English", "Japanese", "Korean", "German", "French", "Russian", "Portuguese", "Spanish", "Italian",
)  # fmt: skip
#: The codec's own frame rate: replay at real-time pace by default.
FRAMES_PER_SECOND = 12.5
#: Stands in for a decoder digest when replay is not told which checkpoint the codes came from.
UNKNOWN_DECODER_DIGEST = "sha256:" + "0" * 64


class ReplayStream(CodeStream):
    def __init__(
        self, codes: np.ndarray, reference_codes: np.ndarray, frames_per_second: float, owner: ReplaySource
    ) -> None:
        self._codes = codes
        self.reference_codes = reference_codes
        self._interval = 1.0 / frames_per_second if frames_per_second > 0 else 0.0
        self._owner = owner
        self._live = True

    async def _frames(self) -> AsyncIterator[np.ndarray]:
        try:
            loop = asyncio.get_running_loop()
            due = loop.time()
            for index in range(len(self._codes)):
                # Sleep to an absolute schedule so pace does not drift with the consumer's speed.
                due += self._interval
                await asyncio.sleep(max(0.0, due - loop.time()))
                yield self._codes[index : index + 1]
            self.stop_reason = StopReason.EOS
        finally:
            self._release()

    def __aiter__(self) -> AsyncIterator[np.ndarray]:
        return self._frames()

    async def abort(self) -> None:
        self._release()

    def _release(self) -> None:
        if self._live:
            self._live = False
            self._owner._live -= 1


class ReplaySource(CodeSource):
    """Serves every request with the same recorded codes, paced like a model (12.5 frames/s)."""

    def __init__(
        self,
        recording: CodesFile,
        frames_per_second: float = FRAMES_PER_SECOND,
        decoder_digest_value: str = UNKNOWN_DECODER_DIGEST,
        model_name: str = "replay",
    ) -> None:
        self.recording = recording
        self.frames_per_second = frames_per_second
        self.codec = qwen3_tts_12hz_spec(decoder_digest_value)
        self.model_name = model_name
        self._live = 0

    @classmethod
    def from_file(
        cls,
        path: pathlib.Path | str,
        frames_per_second: float = FRAMES_PER_SECOND,
        checkpoint: pathlib.Path | str | None = None,
    ) -> ReplaySource:
        """Replay `path`; with `checkpoint`, announce that checkpoint's decoder digest."""
        digest = decoder_digest(checkpoint) if checkpoint else UNKNOWN_DECODER_DIGEST
        return cls(load_codes_file(path), frames_per_second, digest, model_name=f"replay:{pathlib.Path(path).name}")

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(name) for name in QWEN3_TTS_SPEAKERS]

    def languages(self) -> list[str]:
        return list(QWEN3_TTS_LANGUAGES)

    def supported_task_types(self) -> list[TaskType]:
        types = [TaskType.CUSTOM_VOICE, TaskType.VOICE_DESIGN]
        if len(self.recording.reference_codes):
            types.append(TaskType.BASE)
        return types

    async def open(self, request: SynthesisRequest, stream_id: str) -> CodeStream:
        self._live += 1
        reference = (
            self.recording.reference_codes if request.task_type is TaskType.BASE else self.recording.reference_codes[:0]
        )
        return ReplayStream(self.recording.codes, reference, self.frames_per_second, self)

    async def live_requests(self) -> int:
        return self._live

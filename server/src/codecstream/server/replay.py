"""Replay a recorded codes file as if a model generated it: deterministic streams for QA and load tests."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import numpy as np
from codecstream.protocol.codec_spec import qwen3_tts_12hz_spec
from codecstream.protocol.codes_file import CodesFile, load_codes_file
from codecstream.protocol.decoding import FRAMES_PER_SECOND
from codecstream.protocol.digest import decoder_digest
from codecstream.protocol.release import DIALECT_IDS, LANGUAGE_IDS, SPEAKER_DIALECTS, SPEAKER_IDS
from codecstream.server.checkpoint_info import offering_of, read_checkpoint_info
from codecstream.server.limits import check_ranges
from codecstream.server.request import ModelOffering, SynthesisRequest, TaskType
from codecstream.server.source import CodeSource, Event, Finished, FinishReason, Frames, Generation

#: Stands in for a decoder digest when replay is not told which checkpoint the codes came from.
UNKNOWN_DECODER_DIGEST = "sha256:" + "0" * 64


class ReplayGeneration(Generation):
    def __init__(
        self,
        codes: np.ndarray,
        reference_codes: np.ndarray,
        request: SynthesisRequest,
        frames_per_second: float,
        owner: ReplaySource,
    ) -> None:
        super().__init__(request.max_frames, reference_codes)
        self._codes = codes[: request.max_frames]
        self._text_end = len(request.text)
        self._interval = 1.0 / frames_per_second if frames_per_second > 0 else 0.0
        self._owner = owner
        self._live = True
        self._aborted = asyncio.Event()

    async def _events(self) -> AsyncIterator[Event]:
        try:
            loop = asyncio.get_running_loop()
            due = loop.time()
            for index in range(len(self._codes)):
                # Sleep to an absolute schedule so pace does not drift with the consumer's speed;
                # an abort ends the wait at once, as an engine's abort ends the step.
                due += self._interval
                if self._aborted.is_set() or await self._abort_within(due - loop.time()):
                    yield Finished(FinishReason.ABORTED)
                    return
                yield Frames(self._codes[index : index + 1], 0, self._text_end)
            yield Finished(FinishReason.LENGTH if len(self._codes) == self.max_frames else FinishReason.EOS)
        finally:
            self._release()

    async def _abort_within(self, seconds: float) -> bool:
        if seconds <= 0:
            await asyncio.sleep(0)
            return self._aborted.is_set()
        try:
            await asyncio.wait_for(self._aborted.wait(), seconds)
        except asyncio.TimeoutError:
            return False
        return True

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def abort(self) -> None:
        self._aborted.set()
        self._release()

    def _release(self) -> None:
        if self._live:
            self._live = False
            self._owner._live -= 1


class ReplaySource(CodeSource):
    """Serves every request with the same recorded codes, paced like a model: by default at the
    codec's own frame rate (real time)."""

    def __init__(
        self,
        recording: CodesFile,
        frames_per_second: float = FRAMES_PER_SECOND,
        decoder_digest_value: str = UNKNOWN_DECODER_DIGEST,
        model_name: str = "replay",
        offering: ModelOffering | None = None,
    ) -> None:
        self.recording = recording
        self.frames_per_second = frames_per_second
        check_ranges(self, {"frames_per_second": (">= 0", lambda value: value >= 0)})  # 0: as fast as possible
        self.codec = qwen3_tts_12hz_spec(decoder_digest_value)
        self.model_name = model_name
        self.offering = offering or released_offering(with_base=len(recording.reference_codes) > 0)
        self._live = 0

    @classmethod
    def from_file(
        cls,
        path: pathlib.Path | str,
        frames_per_second: float = FRAMES_PER_SECOND,
        checkpoint: pathlib.Path | str | None = None,
    ) -> ReplaySource:
        """Replay `path`; with `checkpoint`, announce that checkpoint's decoder digest and offer what a
        server of that checkpoint offers (GetCodecInfo and ListVoices answer as the engine would)."""
        recording = load_codes_file(path)
        name = f"replay:{pathlib.Path(path).name}"
        if checkpoint is None:
            return cls(recording, frames_per_second, model_name=name)
        info = read_checkpoint_info(pathlib.Path(checkpoint))
        return cls(recording, frames_per_second, decoder_digest(checkpoint), name, info.offering())

    async def open(self, request: SynthesisRequest, stream_id: str) -> Generation:
        self._live += 1
        reference = self.recording.reference_codes
        if request.task_type is not TaskType.BASE:
            reference = reference[:0]
        return ReplayGeneration(self.recording.codes, reference, request, self.frames_per_second, self)

    async def live_requests(self) -> int:
        return self._live


def released_offering(with_base: bool) -> ModelOffering:
    """What a server of the released Qwen3-TTS-12Hz-0.6B-CustomVoice checkpoint offers, so that
    replay without a checkpoint accepts the requests a real server would; replay serves
    VoiceDesign too, and Base when the recording carries reference codes."""
    task_types = (TaskType.CUSTOM_VOICE, TaskType.VOICE_DESIGN, *((TaskType.BASE,) if with_base else ()))
    return offering_of(task_types, SPEAKER_IDS, {**LANGUAGE_IDS, **DIALECT_IDS}, SPEAKER_DIALECTS)

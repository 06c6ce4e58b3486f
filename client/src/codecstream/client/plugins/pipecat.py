"""codecstream as a Pipecat TTS service: codes over gRPC, decoded to PCM here, on the device.

    pip install './client[pipecat,onnx]'

    from codecstream.client.plugins.pipecat import CodecstreamTTSService

    tts = CodecstreamTTSService(server="tts.example.com:50051", decoder="artifacts/decoder-onnx", voice="ryan")
    pipeline = Pipeline([transport.input(), stt, user_aggregator, llm, tts, transport.output(), ...])

One codecstream stream per Pipecat audio context (one bot turn). By default the LLM's tokens go
straight to the server as they arrive (TextAggregationMode.TOKEN) and the server cuts its own
segments (synthesis.proto, TextInput), so audio starts with the first clause; with
TextAggregationMode.SENTENCE each of Pipecat's sentences is flushed as it comes. The end of the
LLM reply ends the stream's input. An interruption cancels the stream on the server at once,
reporting the frames handed to Pipecat as played. Word timestamps (a segment's characters spread
over its frames, from the talker's conditioning, not a forced alignment) reach Pipecat as each
segment's audio completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncGenerator

from codecstream.client.client import AsyncClient
from codecstream.client.decoders import shared_decoder
from codecstream.client.errors import CodecStreamError
from codecstream.client.text_stream import AsyncTextStream, CompletedWords
from codecstream.protocol.decoding import SAMPLE_RATE_HZ, FrameDecoder
from codecstream.protocol.pcm import FRAME_SECONDS, to_pcm16
from codecstream.protocol.text_timing import WordTiming
from loguru import logger
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, TTSService


class CodecstreamTTSService(TTSService):
    """Pipecat TTS service backed by a codecstream server, decoding on this machine."""

    def __init__(
        self,
        *,
        server: str,
        decoder: FrameDecoder | str | pathlib.Path,
        voice: str = "",
        language: str = "",
        instructions: str = "",
        token: str | None = None,
        tls: bool | str | pathlib.Path = False,
        backend: str = "auto",
        text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
        **kwargs,
    ) -> None:
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            push_text_frames=False,  # words come from the stream's word timestamps
            push_start_frame=True,
            settings=TTSSettings(model=None, voice=voice or None, language=language or None),
            pause_frame_processing=False,
            sample_rate=SAMPLE_RATE_HZ,
            **kwargs,
        )
        self._target = server
        self._client_options = {"token": token, "tls": tls}
        self._decoder_source = decoder
        self._backend = backend
        self._request = {"voice": voice, "language": language, "instructions": instructions}
        self._client: AsyncClient | None = None
        self._decoder = None
        self._streams: dict[str, AsyncTextStream] = {}
        self._readers: dict[str, asyncio.Task] = {}
        self._frames_out: dict[str, int] = {}
        #: Turns whose stream could not be opened: their later text has nowhere to go.
        self._refused: set[str] = set()
        #: Why the decoder could not be loaded (every turn would fail the same way), once it is known.
        self._decoder_error: CodecStreamError | None = None

    def can_generate_metrics(self) -> bool:
        return True

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        self._client = AsyncClient(self._target, **self._client_options)
        # Loads the decoder once (weights, runtime sessions); every turn decodes with its own state.
        try:
            self._decoder = await asyncio.to_thread(shared_decoder, self._decoder_source, self._backend)
        except CodecStreamError as error:
            self._decoder_error = error
            await self.push_error(error_msg=f"codecstream: {error}", exception=error)

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)
        await self._close()

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._close()

    async def _close(self) -> None:
        for context_id in list(self._streams):
            await self._cancel_stream(context_id)
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send `text` to the turn's stream (opened on its first text); audio arrives through the
        stream's reader task."""
        if context_id in self._refused:
            yield None  # the turn already said why it cannot be spoken, once
            return
        stream = self._streams.get(context_id)
        try:
            if stream is None:
                if self._decoder_error is not None:
                    raise self._decoder_error
                stream = await self._open_stream(context_id)
            stream.push_text(text)
            if self._text_aggregation_mode is TextAggregationMode.SENTENCE:
                stream.flush()  # Pipecat cut the sentence already
            await self.start_tts_usage_metrics(text)
        except CodecStreamError as error:
            self._refused.add(context_id)
            yield ErrorFrame(error=f"codecstream: {error}")
            yield TTSStoppedFrame(context_id=context_id)
            return
        yield None

    async def _open_stream(self, context_id: str) -> AsyncTextStream:
        await self.start_ttfb_metrics()
        stream = self._client.stream_text(decoder=self._decoder, **self._request)
        await stream.open()
        self._streams[context_id] = stream
        self._frames_out[context_id] = 0
        self._readers[context_id] = self.create_task(self._read(context_id, stream), f"codecstream-{context_id}")
        return stream

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The LLM's reply is complete: the stream ends once the rest is spoken."""
        context_id = context_id or self.get_active_audio_context_id() or ""
        self._refused.discard(context_id)
        stream = self._streams.get(context_id)
        if stream is not None:
            stream.end_input()

    async def _read(self, context_id: str, stream: AsyncTextStream) -> None:
        words = CompletedWords()
        try:
            async for chunk in stream:
                if self._frames_out[context_id] == 0:
                    await self.stop_ttfb_metrics()
                self._frames_out[context_id] += chunk.num_frames
                await self._send_words(context_id, words.add(chunk, stream.text))
                await self.append_to_audio_context(
                    context_id,
                    TTSAudioRawFrame(
                        audio=to_pcm16(chunk.samples).tobytes(),
                        sample_rate=SAMPLE_RATE_HZ,
                        num_channels=1,
                        context_id=context_id,
                    ),
                )
            await self._send_words(context_id, words.rest(stream.text))
        except CodecStreamError as error:
            await self.push_error(error_msg=f"codecstream: {error}")
        finally:
            self._streams.pop(context_id, None)
            self._readers.pop(context_id, None)
            self._frames_out.pop(context_id, None)
            if self.audio_context_available(context_id):
                await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
                await self.remove_audio_context(context_id)

    async def _send_words(self, context_id: str, timings: list[WordTiming]) -> None:
        if timings:
            await self.add_word_timestamps([(w.word, w.start_s) for w in timings], context_id)

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: stop the server's stream now, reporting what was handed out as played."""
        await self.stop_all_metrics()
        self._refused.discard(context_id)
        await self._cancel_stream(context_id)
        await super().on_audio_context_interrupted(context_id)

    async def _cancel_stream(self, context_id: str) -> None:
        stream = self._streams.pop(context_id, None)
        reader = self._readers.pop(context_id, None)
        if stream is not None:
            played = self._frames_out.pop(context_id, 0)
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, CodecStreamError):
                    await reader
            with contextlib.suppress(CodecStreamError):
                end = await stream.cancel(played)
                if end is not None:
                    logger.debug(
                        f"{self}: stream {stream.codes.stream_id} cancelled after {played * FRAME_SECONDS:.2f} s; "
                        f"heard {end.text_offset_played} of {len(stream.text)} characters"
                    )

"""codecstream as a LiveKit Agents TTS: codes over gRPC, decoded to PCM here, on the device.

    pip install './client[livekit,onnx]'

    from codecstream.client.plugins.livekit import CodecstreamTTS

    session = AgentSession(stt=..., llm=..., tts=CodecstreamTTS(server="tts.example.com:50051",
                                                                 decoder="artifacts/decoder-onnx", voice="ryan"))

`stream()` gives a SynthesizeStream fed by push_text / flush / end_input: the text goes to the
server as it arrives (one codecstream stream_text stream), LiveKit's flush speaks what has
arrived, and `aclose()` (LiveKit's interruption) cancels the stream on the server at once with the
frames handed to LiveKit as played. Word timings (each segment's characters spread over its
frames: the talker's conditioning, not a forced alignment) go out through
`push_timed_transcript` as each segment's audio completes. `synthesize()` speaks a whole text.
"""

from __future__ import annotations

import asyncio
import pathlib
import uuid

from codecstream.client.client import AsyncClient
from codecstream.client.decoders import shared_decoder
from codecstream.client.errors import CodecStreamError, InvalidRequest
from codecstream.client.synthesis import AsyncAudioStream
from codecstream.client.text_stream import CompletedWords
from codecstream.protocol.decoding import SAMPLE_RATE_HZ, FrameDecoder
from codecstream.protocol.pcm import to_pcm16
from codecstream.protocol.text_timing import WordTiming
from livekit.agents import APIConnectionError, APIConnectOptions, APIStatusError, tts
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, TimedString

MIME_TYPE = "audio/pcm"


class CodecstreamTTS(tts.TTS):
    """LiveKit Agents TTS backed by a codecstream server, decoding on this machine."""

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
    ) -> None:
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=SAMPLE_RATE_HZ,
            num_channels=1,
        )
        self._target = server
        self._client_options = {"token": token, "tls": tls}
        self._decoder_source = decoder
        self._backend = backend
        self._request = {"voice": voice, "language": language, "instructions": instructions}
        self._client: AsyncClient | None = None
        self._decoder = None

    @property
    def provider(self) -> str:
        return "codecstream"

    @property
    def model(self) -> str:
        return "qwen3-tts (codec tokens, decoded on the device)"

    async def _ready(self) -> tuple[AsyncClient, object]:
        """The client and the loaded decoder, made on first use on the running loop."""
        if self._client is None:
            self._client = AsyncClient(self._target, **self._client_options)
        if self._decoder is None:
            self._decoder = await asyncio.to_thread(shared_decoder, self._decoder_source, self._backend)
        return self._client, self._decoder

    def prewarm(self) -> None:
        self._decoder = shared_decoder(self._decoder_source, self._backend)

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def _api_error(error: CodecStreamError) -> Exception:
    # A request the server refuses will be refused again: not retryable; anything else may pass.
    if isinstance(error, InvalidRequest):
        return APIStatusError(str(error), status_code=400, retryable=False)
    return APIConnectionError(str(error))


async def _emit(stream: AsyncAudioStream, text_of, output_emitter: tts.AudioEmitter, pushed: list[int]) -> None:
    """Push the stream's audio and word timings to LiveKit, counting the frames in `pushed[0]`."""
    words = CompletedWords()
    async for chunk in stream:
        _push_words(output_emitter, words.add(chunk, text_of()))
        output_emitter.push(to_pcm16(chunk.samples).tobytes())
        pushed[0] += chunk.num_frames
    _push_words(output_emitter, words.rest(text_of()))


def _push_words(output_emitter: tts.AudioEmitter, timings: list[WordTiming]) -> None:
    if timings:
        output_emitter.push_timed_transcript(
            [TimedString(w.word + " ", start_time=w.start_s, end_time=w.end_s) for w in timings]
        )


class ChunkedStream(tts.ChunkedStream):
    """One whole text (`TTS.synthesize`)."""

    def __init__(self, *, tts: CodecstreamTTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._codecstream = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        client, decoder = await self._codecstream._ready()
        output_emitter.initialize(
            request_id=uuid.uuid4().hex, sample_rate=SAMPLE_RATE_HZ, num_channels=1, mime_type=MIME_TYPE
        )
        stream = client.synthesize(self.input_text, decoder=decoder, **self._codecstream._request)
        pushed = [0]
        try:
            await _emit(stream, lambda: self.input_text, output_emitter, pushed)
        except CodecStreamError as error:
            raise _api_error(error) from None
        finally:
            if stream.end is None:  # closed early (interruption): stop the server now
                await asyncio.shield(stream.cancel(pushed[0]))


class SynthesizeStream(tts.SynthesizeStream):
    """Text as the LLM writes it (`TTS.stream`): one codecstream stream for the whole input."""

    def __init__(self, *, tts: CodecstreamTTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._codecstream = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        client, decoder = await self._codecstream._ready()
        request_id = uuid.uuid4().hex
        output_emitter.initialize(
            request_id=request_id, sample_rate=SAMPLE_RATE_HZ, num_channels=1, mime_type=MIME_TYPE, stream=True
        )
        output_emitter.start_segment(segment_id=request_id)
        stream = client.stream_text(decoder=decoder, **self._codecstream._request)
        pushed = [0]

        async def send_text() -> None:
            async for item in self._input_ch:
                if isinstance(item, self._FlushSentinel):
                    stream.flush()
                else:
                    # LiveKit times TTFB and emits TTSMetrics from the first text sent to the provider.
                    self._mark_started()
                    stream.push_text(item)
            stream.end_input()

        sender = asyncio.create_task(send_text(), name="codecstream-send-text")
        try:
            await stream.open()
            await _emit(stream, lambda: stream.text, output_emitter, pushed)
            output_emitter.end_segment()
        except CodecStreamError as error:
            raise _api_error(error) from None
        finally:
            sender.cancel()
            if stream.end is None:  # aclose() (an interruption) or a failure: stop the server now
                await asyncio.shield(stream.cancel(pushed[0]))

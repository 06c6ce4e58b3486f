"""codecstream as a LiveKit Agents TTS: codes over gRPC, decoded to PCM here, on the device.

    pip install './client[livekit,onnx]'

    from codecstream.client.plugins.livekit import CodecstreamTTS

    session = AgentSession(stt=..., llm=..., tts=CodecstreamTTS(server="tts.example.com:50051", voice="ryan"),
                           use_tts_aligned_transcript=True)

`stream()` gives a SynthesizeStream fed by push_text / flush / end_input: the text goes to the
server as it arrives (one codecstream stream_text stream, which the server grows as one talker
request), LiveKit's flush speaks what has arrived, and `aclose()` (LiveKit's interruption) cancels
the stream on the server at once, reporting the frames played so far (estimated from when the
audio was handed to LiveKit, which plays it in real time). Word timings go out through
`push_timed_transcript` with the audio that completes them (a stream's characters spread over the
frames that speak them: the talker's conditioning, not a forced alignment). `synthesize()` speaks
a whole text. The decoder is the server's own (`decoder="auto"`, downloaded once and cached)
unless a path is given; `update_options()` changes the voice and the rest for the next stream.

`text_transforms=[fn]` (each `text -> text`, plain or async) change what is spoken, not the
transcript: applied here to whole words, and the timed words LiveKit gets are the text as written,
timed where their spoken form is heard (plugins/spoken_text.py). A session's own
`tts_text_transforms` run before the TTS, so its transcript is the text they made.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import pathlib
import uuid
from collections.abc import Awaitable, Sequence

from codecstream.client.client import AsyncClient
from codecstream.client.decoder_download import AUTO
from codecstream.client.errors import (
    CodecMismatch,
    CodecStreamError,
    InvalidRequest,
    ResourceExhausted,
    Unauthenticated,
)
from codecstream.client.plugins.speech import Speech, SpeechOptions
from codecstream.client.plugins.spoken_text import SpokenText, TextTransform
from codecstream.client.resample import StreamResampler
from codecstream.client.runtimes import DecoderLoadError, check_decoder_source
from codecstream.client.synthesis import AsyncAudioStream
from codecstream.protocol.decoding import SAMPLE_RATE_HZ, FrameDecoder
from codecstream.protocol.text_timing import WordTiming
from codecstream.v1 import synthesis_pb2 as pb
from livekit.agents import APIConnectionError, APIConnectOptions, APIError, APIStatusError, APITimeoutError, tts
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, NotGivenOr, TimedString
from livekit.agents.utils import is_given

log = logging.getLogger(__name__)
MIME_TYPE = "audio/pcm"


class CodecstreamTTS(tts.TTS):
    """LiveKit Agents TTS backed by a codecstream server, decoding on this machine."""

    def __init__(
        self,
        *,
        server: str,
        decoder: FrameDecoder | str | pathlib.Path = AUTO,
        voice: str = "",
        language: str = "",
        instructions: str = "",
        seed: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        sample_rate: int = SAMPLE_RATE_HZ,
        token: str | None = None,
        tls: bool | str | pathlib.Path = False,
        backend: str = "auto",
        text_transforms: Sequence[TextTransform] = (),
    ) -> None:
        StreamResampler(sample_rate)  # a bad rate fails here, not at the first utterance
        if not (isinstance(decoder, str) and decoder == AUTO):
            check_decoder_source(decoder, backend)  # a missing or wrong decoder fails here
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self._target = server
        self._client_options = {"token": token, "tls": tls}
        self._decoder_source = decoder
        self._backend = backend
        #: What every stream is started with; `update_options` replaces it.
        self._opts = SpeechOptions(voice, language, instructions, seed, temperature, top_p, top_k)
        #: Applied, in order, to the text of every stream before it is spoken.
        self.text_transforms = list(text_transforms)
        self._client: AsyncClient | None = None
        self._decoder = None
        self._decoder_loading: asyncio.Task | None = None
        self._model = "qwen3-tts"

    @property
    def provider(self) -> str:
        return "codecstream"

    @property
    def model(self) -> str:
        return self._model

    def update_options(
        self,
        *,
        voice: NotGivenOr[str] = NOT_GIVEN,
        language: NotGivenOr[str] = NOT_GIVEN,
        instructions: NotGivenOr[str] = NOT_GIVEN,
        seed: NotGivenOr[int | None] = NOT_GIVEN,
        temperature: NotGivenOr[float | None] = NOT_GIVEN,
        top_p: NotGivenOr[float | None] = NOT_GIVEN,
        top_k: NotGivenOr[int | None] = NOT_GIVEN,
    ) -> None:
        """Change what the next streams are started with (streams already running keep theirs)."""
        given = dict(
            voice=voice,
            language=language,
            instructions=instructions,
            seed=seed,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
        )
        self._opts = dataclasses.replace(self._opts, **{k: v for k, v in given.items() if is_given(v)})

    async def list_voices(self) -> list[pb.Voice]:
        """The server's voices (codecstream.v1 Voice: name, description, languages)."""
        client = self._connected()
        try:
            return await client.voices()
        except CodecStreamError as error:
            raise _api_error(error) from None

    def _connected(self) -> AsyncClient:
        if self._client is None:
            self._client = AsyncClient(self._target, **self._client_options)
        return self._client

    async def _ready(self) -> tuple[AsyncClient, object]:
        """The client and the loaded decoder, made on first use on the running loop."""
        client = self._connected()
        if self._decoder is None:
            if self._decoder_loading is None:
                self._decoder_loading = asyncio.ensure_future(self._load_decoder(client))
            try:
                self._decoder = await asyncio.shield(self._decoder_loading)
            except CodecStreamError as error:
                self._decoder_loading = None  # the next utterance tries again (a server may come up)
                raise _api_error(error) from None
        return client, self._decoder

    async def _load_decoder(self, client: AsyncClient):
        decoder = await client.open_decoder(self._decoder_source, backend=self._backend)
        self._model = (await client.codec_info()).model or self._model
        return decoder

    def prewarm(self) -> None:
        """Start loading the decoder in the background (LiveKit calls this on the event loop, which
        must not block, and a failure must not escape: it is reported at the first utterance)."""
        if self._decoder is None and self._decoder_loading is None:
            self._decoder_loading = asyncio.ensure_future(self._load_decoder(self._connected()))
            self._decoder_loading.add_done_callback(_log_failure)

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options)

    async def aclose(self) -> None:
        if self._decoder_loading is not None and not self._decoder_loading.done():
            self._decoder_loading.cancel()
        if self._client is not None:
            await self._client.close()
            self._client = None


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("codecstream: loading the decoder failed: %s", task.exception())


def _api_error(error: CodecStreamError) -> APIError:
    """LiveKit's error for `error`: what will fail the same way again is not retried."""
    if isinstance(error, InvalidRequest):
        return APIStatusError(str(error), status_code=400, retryable=False)
    if isinstance(error, Unauthenticated):
        return APIStatusError(str(error), status_code=401, retryable=False)
    if isinstance(error, CodecMismatch):
        return APIStatusError(str(error), status_code=412, retryable=False)
    if isinstance(error, ResourceExhausted):
        return APIStatusError(str(error), status_code=429, retryable=True)
    if isinstance(error, DecoderLoadError):
        return APIError(f"codecstream decoder: {error}", retryable=False)
    return APIConnectionError(str(error))


async def _within_timeout(
    speaking: Awaitable[None], output: _Output, text_given: asyncio.Event, conn_options: APIConnectOptions
) -> None:
    """Await `speaking` (open the stream, then hand its audio to LiveKit), bounded as LiveKit bounds a
    provider by `conn_options.timeout`: once the server has text it can speak (a whole text, a flush or
    the end of the input), its first audio must come within the timeout. A server that takes the call
    and never starts speaking (its engine stalled) is then a retryable APITimeoutError, not a turn
    held forever."""

    async def first_audio() -> None:
        await text_given.wait()
        try:
            await asyncio.wait_for(output.first_audio.wait(), conn_options.timeout)
        except asyncio.TimeoutError:
            raise APITimeoutError(
                f"codecstream: no audio within {conn_options.timeout:g} s of the text (conn_options.timeout)"
            ) from None

    speech = asyncio.ensure_future(speaking)
    watchdog = asyncio.ensure_future(first_audio())
    try:
        await asyncio.wait({speech, watchdog}, return_when=asyncio.FIRST_EXCEPTION)
        if watchdog.done() and watchdog.exception() is not None:
            raise watchdog.exception()
        await speech
    finally:
        for task in (speech, watchdog):
            task.cancel()
        await asyncio.gather(speech, watchdog, return_exceptions=True)


_END_OF_INPUT = object()


class _Output:
    """One stream's audio and words on their way to LiveKit."""

    def __init__(self, stream: AsyncAudioStream, text: SpokenText, emitter: tts.AudioEmitter, sample_rate: int) -> None:
        self.speech = Speech(stream, sample_rate, text)
        #: Set at the first audio handed to LiveKit.
        self.first_audio = asyncio.Event()
        self._emitter = emitter

    async def run(self) -> None:
        text = self.speech.text
        async for handout in self.speech:
            if handout.first:
                self.first_audio.set()
            if handout.words:
                # LiveKit joins the strings: each word with the white space after it, as the text has them.
                self._emitter.push_timed_transcript(
                    [TimedString(_with_space_after(text.written, w), w.start_s, w.end_s) for w in handout.words]
                )
            if handout.audio:
                self._emitter.push(handout.audio)

    async def stop(self) -> None:
        """Cancel the stream on the server unless it ended, reporting the frames played so far."""
        stream = self.speech.stream
        if stream.end is None:
            await asyncio.shield(stream.cancel(self.speech.played_frames()))


async def _transformed(text: SpokenText, written: str, *, complete: bool) -> str:
    """What to speak for `written` (SpokenText.push); a failing transform is the application's
    error, and would fail the same way again."""
    try:
        return await text.push(written, complete=complete)
    except Exception as error:
        raise APIError(f"codecstream: a text transform failed on {written!r}: {error}", retryable=False) from error


def _with_space_after(text: str, word: WordTiming) -> str:
    end = word.text_end
    while end < len(text) and text[end].isspace():
        end += 1
    return text[word.text_start : end]


class ChunkedStream(tts.ChunkedStream):
    """One whole text (`TTS.synthesize`)."""

    def __init__(self, *, tts: CodecstreamTTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._codecstream = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        engine = self._codecstream
        client, decoder = await engine._ready()
        output_emitter.initialize(
            request_id=uuid.uuid4().hex, sample_rate=engine.sample_rate, num_channels=1, mime_type=MIME_TYPE
        )
        text = SpokenText(engine.text_transforms)
        spoken = await _transformed(text, self.input_text, complete=True)
        stream = client.synthesize(spoken, decoder=decoder, **engine._opts.start_options())
        output = _Output(stream, text, output_emitter, engine.sample_rate)
        text_given = asyncio.Event()
        text_given.set()
        try:
            await _within_timeout(output.run(), output, text_given, self._conn_options)
        except CodecStreamError as error:
            api_error = _api_error(error)
            if output.speech.playout.handed_frames:
                api_error.retryable = False  # LiveKit would replay the whole text after audio went out
            raise api_error from None
        finally:
            await output.stop()


class SynthesizeStream(tts.SynthesizeStream):
    """Text as the LLM writes it (`TTS.stream`): one codecstream stream for the whole input."""

    def __init__(self, *, tts: CodecstreamTTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._codecstream = tts
        #: The input's text and flushes as they came, then _END_OF_INPUT.
        self._text: asyncio.Queue = asyncio.Queue()

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        reading = asyncio.create_task(self._read_input(), name="codecstream-read-text")
        try:
            await self._speak(output_emitter)
        finally:
            reading.cancel()

    async def _read_input(self) -> None:
        """Take the LLM's text as it comes, also while the decoder may still be loading."""
        async for item in self._input_ch:
            if not isinstance(item, self._FlushSentinel):
                # LiveKit times TTFB and emits TTSMetrics from the first text given to the provider:
                # marked on arrival, so that a turn waiting for the decoder's load counts the wait.
                self._mark_started()
            self._text.put_nowait(item)
        self._text.put_nowait(_END_OF_INPUT)

    async def _speak(self, output_emitter: tts.AudioEmitter) -> None:
        engine = self._codecstream
        client, decoder = await engine._ready()
        request_id = uuid.uuid4().hex
        output_emitter.initialize(
            request_id=request_id, sample_rate=engine.sample_rate, num_channels=1, mime_type=MIME_TYPE, stream=True
        )
        output_emitter.start_segment(segment_id=request_id)
        stream = client.stream_text(decoder=decoder, **engine._opts.start_options())
        text = SpokenText(engine.text_transforms)
        output = _Output(stream, text, output_emitter, engine.sample_rate)
        text_given = asyncio.Event()  # a flush or the input's end: the server can speak what it has

        async def send_text() -> None:
            while (item := await self._text.get()) is not _END_OF_INPUT:
                if isinstance(item, self._FlushSentinel):
                    stream.push_text(await _transformed(text, "", complete=True))
                    stream.flush()
                    text_given.set()
                else:
                    stream.push_text(await _transformed(text, item, complete=False))
            stream.push_text(await _transformed(text, "", complete=True))
            stream.end_input()
            text_given.set()

        async def speak() -> None:
            await stream.open()
            await output.run()

        sender = asyncio.create_task(send_text(), name="codecstream-send-text")
        try:
            await _within_timeout(speak(), output, text_given, self._conn_options)
            output_emitter.end_segment()
        except CodecStreamError as error:
            raise _api_error(error) from None
        finally:
            sender.cancel()
            await output.stop()

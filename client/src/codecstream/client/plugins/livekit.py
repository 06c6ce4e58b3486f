"""codecstream as a LiveKit Agents TTS: codes over gRPC, decoded to PCM here, on the device.

    pip install './client[openvino,livekit]'

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

`conn_options.timeout` bounds how long a server may owe audio without sending any (its first audio
once it has text it can speak, then every gap: plugins/stall.py): past it the stream fails with
APITimeoutError, which LiveKit retries (the input replayed) until audio has gone out. What would fail
the same way again (a refusal, a decoder that cannot load, a text transform that raises) is a
non-retryable APIError, raised at once.

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
from collections.abc import Sequence

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
from codecstream.client.plugins.stall import SpeechStalled
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


_END_OF_INPUT = object()


class _Output:
    """One stream's audio and words on their way to LiveKit. The stream is bounded as LiveKit bounds a
    provider, by `conn_options.timeout`: a server that owes audio (stall.py) and sends none for as
    long ends it with APITimeoutError, retryable until audio went out (LiveKit would replay the text
    from its start)."""

    def __init__(
        self,
        stream: AsyncAudioStream,
        text: SpokenText,
        emitter: tts.AudioEmitter,
        sample_rate: int,
        conn_options: APIConnectOptions,
    ) -> None:
        self.speech = Speech(stream, sample_rate, text, stall_timeout_s=conn_options.timeout)
        self._emitter = emitter

    async def run(self) -> None:
        """Open the stream and hand its words and audio to LiveKit; raises LiveKit's error for a failure."""
        try:
            await self._hand_over()
        except SpeechStalled as error:
            message = f"codecstream: {error} (conn_options.timeout)"
            raise APITimeoutError(message, retryable=not self.audio_out) from None
        except CodecStreamError as error:
            api_error = _api_error(error)
            if self.audio_out:
                api_error.retryable = False  # LiveKit would replay the whole text after audio went out
            raise api_error from None

    @property
    def audio_out(self) -> bool:
        return self.speech.playout.handed_frames > 0

    async def _hand_over(self) -> None:
        text = self.speech.text
        async for handout in self.speech:
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
        output = _Output(stream, text, output_emitter, engine.sample_rate, self._conn_options)
        try:
            await output.run()
        finally:
            await output.stop()


class SynthesizeStream(tts.SynthesizeStream):
    """Text as the LLM writes it (`TTS.stream`): one codecstream stream for the whole input."""

    def __init__(self, *, tts: CodecstreamTTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._codecstream = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        # Each attempt reads the input from its start: LiveKit replays it into a new channel for a retry.
        text: asyncio.Queue = asyncio.Queue()
        reading = asyncio.create_task(self._read_input(text), name="codecstream-read-text")
        try:
            await self._speak(output_emitter, text)
        finally:
            reading.cancel()

    async def _read_input(self, text: asyncio.Queue) -> None:
        """Take the LLM's text as it comes, also while the decoder may still be loading: its pieces
        and flushes, then _END_OF_INPUT."""
        async for item in self._input_ch:
            if not isinstance(item, self._FlushSentinel):
                # LiveKit times TTFB and emits TTSMetrics from the first text given to the provider:
                # marked on arrival, so that a turn waiting for the decoder's load counts the wait.
                self._mark_started()
            text.put_nowait(item)
        text.put_nowait(_END_OF_INPUT)

    async def _speak(self, output_emitter: tts.AudioEmitter, received: asyncio.Queue) -> None:
        engine = self._codecstream
        client, decoder = await engine._ready()
        request_id = uuid.uuid4().hex
        output_emitter.initialize(
            request_id=request_id, sample_rate=engine.sample_rate, num_channels=1, mime_type=MIME_TYPE, stream=True
        )
        output_emitter.start_segment(segment_id=request_id)
        stream = client.stream_text(decoder=decoder, **engine._opts.start_options())
        text = SpokenText(engine.text_transforms)
        output = _Output(stream, text, output_emitter, engine.sample_rate, self._conn_options)
        speech = output.speech

        async def send_text() -> None:
            while (item := await received.get()) is not _END_OF_INPUT:
                if isinstance(item, self._FlushSentinel):
                    speech.push_text(await _transformed(text, "", complete=True))
                    speech.flush()
                else:
                    speech.push_text(await _transformed(text, item, complete=False))
            speech.push_text(await _transformed(text, "", complete=True))
            speech.end_input()

        sender = asyncio.create_task(send_text(), name="codecstream-send-text")
        speaking = asyncio.create_task(output.run(), name="codecstream-speak")
        try:
            # The sender's failure (a text transform's) ends the stream at once; its end does not.
            await asyncio.wait({sender, speaking}, return_when=asyncio.FIRST_EXCEPTION)
            if sender.done() and not sender.cancelled() and sender.exception() is not None:
                raise sender.exception()
            await speaking
            output_emitter.end_segment()
        finally:
            for task in (sender, speaking):
                task.cancel()
            await asyncio.gather(sender, speaking, return_exceptions=True)
            await output.stop()

"""codecstream as a Pipecat TTS service: codes over gRPC, decoded to PCM here, on the device.

    pip install './client[openvino,pipecat]'

    from codecstream.client.plugins.pipecat import CodecstreamTTSService

    tts = CodecstreamTTSService(
        server="tts.example.com:50051",
        settings=CodecstreamTTSService.Settings(voice="ryan", language=Language.EN),
    )
    pipeline = Pipeline([transport.input(), stt, user_aggregator, llm, tts, transport.output(), ...])

One codecstream stream per Pipecat audio context (one bot turn). By default the LLM's tokens go
straight to the server as they arrive (TextAggregationMode.TOKEN): the server grows one talker
request as the text comes (synthesis.proto, TextInput), so audio starts with the first words;
with TextAggregationMode.SENTENCE each of Pipecat's sentences is flushed as it comes. The end of
the LLM reply ends the stream's input. The decoder is the server's own (`decoder="auto"`,
downloaded once and cached) unless a path is given.

Words go to Pipecat with the audio that completes them, timed where they will be heard (a
stream's characters spread over the frames that speak them, from the talker's conditioning, not a
forced alignment; waits for late audio included), so Pipecat's transcript of an interrupted turn
holds what was heard. An interruption cancels the stream on the server at once, reporting the
frames played so far (estimated from when the audio was handed to Pipecat: Pipecat plays it in
real time). Settings changed with TTSUpdateSettingsFrame apply from the next turn.

A turn whose server owes audio and sends none for `stall_timeout_s` (its first audio once it has
text it can speak, or the next chunk once audio flows: plugins/stall.py) ends with one ErrorFrame
carrying a TimeoutError (Pipecat's CONNECTIVITY) and its TTSStoppedFrame; a turn that cannot be
spoken (refused, no decoder) is one ErrorFrame. Only words the listener heard reach the assistant's
context: Pipecat's own report, at a turn's end, of the words no timestamp covered is left out. A
decoder that could not be loaded (a server down when the bot started) is loaded again by the next turn.

`text_transforms` (Pipecat's convention: `[(text_type or "*", async (text, text_type) -> text)]`,
and `add_text_transformer`) change what is spoken, not what is reported: the service applies them
itself, to whole words (Pipecat applies them to each token alone, so a word split over tokens was
never fixed), and reports the words as written, timed where their spoken form is heard
(plugins/spoken_text.py), so the transcript and the assistant's context keep the LLM's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import pathlib
from collections.abc import AsyncGenerator, Awaitable, Callable

from codecstream.client.client import AsyncClient
from codecstream.client.decoder_download import AUTO
from codecstream.client.errors import CodecStreamError
from codecstream.client.languages import model_language
from codecstream.client.plugins.speech import OPTION_NAMES, Speech, start_options
from codecstream.client.plugins.spoken_text import SpokenText
from codecstream.client.plugins.stall import SpeechStalled
from codecstream.client.requests import StartOptions
from codecstream.client.resample import StreamResampler
from codecstream.client.runtimes import DecoderLoadError, check_decoder_source
from codecstream.client.runtimes.loaded import LoadedDecoder
from codecstream.client.text_stream import AsyncTextStream
from codecstream.protocol.decoding import FRAME_SECONDS, FrameDecoder
from loguru import logger
from pipecat.frames.frames import (
    AggregatedTextProgressFrame,
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.settings import NOT_GIVEN, NotGiven, TTSSettings
from pipecat.services.tts_service import TextAggregationMode, TTSService
from pipecat.transcriptions.language import Language
from pipecat.utils.errors import ErrorCategory

#: How long a server may owe audio without sending any before its turn ends (stall_timeout_s).
STALL_TIMEOUT_S = 10.0
#: How much longer than the server lets a stream wait for text a turn may go quiet before Pipecat
#: gives up on it. Every turn is ended by its stream (TTSStoppedFrame); Pipecat's own 3 s default
#: would end a turn whose LLM pauses or whose server runs slower than real time, and drop the rest.
QUIET_MARGIN_S = 10.0


@dataclasses.dataclass
class CodecstreamTTSSettings(TTSSettings):
    """Runtime-updatable settings (TTSUpdateSettingsFrame): Pipecat's voice and language, and
    codecstream's style instructions and sampling (synthesis.proto Start)."""

    instructions: str | NotGiven | None = dataclasses.field(default_factory=lambda: NOT_GIVEN)
    seed: int | NotGiven | None = dataclasses.field(default_factory=lambda: NOT_GIVEN)
    temperature: float | NotGiven | None = dataclasses.field(default_factory=lambda: NOT_GIVEN)
    top_p: float | NotGiven | None = dataclasses.field(default_factory=lambda: NOT_GIVEN)
    top_k: int | NotGiven | None = dataclasses.field(default_factory=lambda: NOT_GIVEN)


def _service_parameters() -> set[str]:
    """Keyword arguments TTSService and its bases take (Pipecat's BaseObject swallows any other)."""
    names: set[str] = set()
    for cls in TTSService.__mro__:
        init = cls.__dict__.get("__init__")
        if init is not None:
            names |= {
                p.name for p in inspect.signature(init).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
            }
    return names


@dataclasses.dataclass
class _Turn:
    """One bot turn's speech, and the task that hands it to Pipecat."""

    context_id: str
    speech: Speech[AsyncTextStream]
    reader: asyncio.Task | None = None

    @property
    def stream(self) -> AsyncTextStream:
        return self.speech.stream

    @property
    def text(self) -> SpokenText:
        return self.speech.text


class _DecoderLoad:
    """The service's decoder: loading beside the pipeline's start, loaded again by the first turn
    after a load that failed (a server down or restarting when the bot started). A failure is kept
    for the turn that waited for it: Pipecat's tasks swallow exceptions."""

    def __init__(self, create_task: Callable[..., asyncio.Task], load: Callable[[], Awaitable[LoadedDecoder]]):
        self._create_task = create_task
        self._load = load
        self.decoder: LoadedDecoder | None = None
        #: Why the last load failed (the next turn loads again).
        self.error: CodecStreamError | None = None
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = self._create_task(self._run(), "codecstream-decoder-load")

    async def _run(self) -> None:
        try:
            self.decoder, self.error = await self._load(), None
        except CodecStreamError as error:
            self.error = error

    async def ready(self) -> LoadedDecoder:
        """The decoder, loading it again where the last load failed; raises that load's error."""
        if self.decoder is None:
            if self.task is None or self.task.done():
                self.start()
            await asyncio.shield(self.task)
            if self.decoder is None:  # an error other than codecstream's is in Pipecat's log
                raise self.error or DecoderLoadError("loading the decoder failed (see the log)")
        return self.decoder


class CodecstreamTTSService(TTSService):
    """Pipecat TTS service backed by a codecstream server, decoding on this machine."""

    Settings = CodecstreamTTSSettings
    _settings: CodecstreamTTSSettings

    def __init__(
        self,
        *,
        server: str,
        decoder: FrameDecoder | str | pathlib.Path = AUTO,
        voice_id: str | None = None,
        language: Language | str | None = None,
        sample_rate: int | None = None,
        settings: CodecstreamTTSSettings | None = None,
        token: str | None = None,
        tls: bool | str | pathlib.Path = False,
        backend: str = "auto",
        text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
        stall_timeout_s: float | None = STALL_TIMEOUT_S,
        **kwargs,
    ) -> None:
        unknown = sorted(set(kwargs) - _service_parameters())
        if unknown:
            hint = " (codecstream speaks with the model its server loaded)" if "model" in unknown else ""
            raise TypeError(f"CodecstreamTTSService got unexpected keyword arguments {unknown}{hint}")
        # Pipecat's store holds every setting; None: not set, the server's default.
        defaults = CodecstreamTTSSettings(model=None, **dict.fromkeys(OPTION_NAMES, None))
        defaults.voice, defaults.language = voice_id, language
        if settings is not None:
            defaults.apply_update(settings)
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            push_text_frames=False,  # words come from the stream's word timings
            push_start_frame=True,
            settings=defaults,
            pause_frame_processing=False,
            sample_rate=sample_rate,
            **kwargs,
        )
        StreamResampler(sample_rate)  # a bad rate fails here, not at the first turn
        if not (isinstance(decoder, str) and decoder == AUTO):
            check_decoder_source(decoder, backend)  # a missing or wrong decoder fails here
        self._target = server
        self._client_options = {"token": token, "tls": tls}
        self._decoder_source = decoder
        self._backend = backend
        self._stall_timeout_s = stall_timeout_s
        self._client: AsyncClient | None = None
        self._decoder = _DecoderLoad(self.create_task, self._load_decoder)
        self._turns: dict[str, _Turn] = {}
        #: Turns whose stream failed (refused, stalled, broken) while the reply was being written: its
        #: later text has nowhere to go, and the audio context stays open (one TTSStartedFrame) until
        #: the reply ends, then stops: ended at once, the reply's next text would open it again.
        self._refused: set[str] = set()
        #: Turns that said in an ErrorFrame of their own why they were not (all) spoken.
        self._explained: set[str] = set()
        #: The context whose end Pipecat is completing (_apply_force_complete).
        self._completing: str | None = None
        #: The type of the text run_tts is about to get (Pipecat's text_transforms are chosen by it).
        self._text_type = "*"

    def can_generate_metrics(self) -> bool:
        return True

    @property
    def supports_processing_metrics(self) -> bool:
        return False  # audio comes from a reader task, not from run_tts

    def language_to_service_language(self, language: Language) -> str | None:
        """The model's name for a Pipecat language (Language.EN_GB -> "English"); one it does not
        speak is a ValueError (at construction, or the settings update that asks for it)."""
        return model_language(language.value)

    def _service_language(self, language: Language | str) -> str:
        # Pipecat passes a string its Language enum does not parse ("pt_BR", "xx-YY") to the service
        # as it is; the model's table maps it or refuses it here, as it does every Language.
        return model_language(language.value if isinstance(language, Language) else language)

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        self._client = AsyncClient(self._target, **self._client_options)
        # The decoder loads beside the pipeline's start (a download, a first compile: seconds with an
        # empty cache), not before it: only a turn needs it, and the first one waits for what is left.
        # A failed load is not an ErrorFrame (no turn failed): the next turn loads again and says why.
        self._decoder.start()

    async def _load_decoder(self) -> LoadedDecoder:
        """The decoder (weights, runtime sessions, warmed); every turn decodes with its own state."""
        try:
            info = await self._client.codec_info()
            self._stop_frame_timeout_s = info.text_input_timeout_ms / 1000 + QUIET_MARGIN_S
            return await self._client.open_decoder(self._decoder_source, backend=self._backend)
        except CodecStreamError as error:
            logger.warning(f"{self}: loading the decoder failed (the next turn tries again): {error}")
            raise

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)
        await self._close()

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._close()

    async def _close(self) -> None:
        if self._decoder.task is not None and not self._decoder.task.done():
            await self.cancel_task(self._decoder.task)
        for context_id in list(self._turns):
            await self._cancel_turn(context_id)
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def list_voices(self) -> list:
        """The server's voices (codecstream.v1 Voice: name, description, languages)."""
        client = self._client or AsyncClient(self._target, **self._client_options)
        try:
            return await client.voices()
        finally:
            if client is not self._client:
                await client.close()

    def _request(self) -> StartOptions:
        """Start options from the settings as they are now (TTSUpdateSettingsFrame applies per turn)."""
        return start_options(self._settings.given_fields())

    async def _transform_text(self, text: str, text_type: str) -> str | None:
        # Pipecat applies text_transforms here, to each token or sentence alone, and then reports the
        # words the TTS spoke. The service applies them in run_tts instead (the words as written go
        # to Pipecat): here Pipecat does the rest of its preparation with none, and the type is kept.
        self._text_type = text_type
        transforms, self._text_transforms = self._text_transforms, []
        try:
            return await super()._transform_text(text, text_type)
        finally:
            self._text_transforms = transforms

    async def _apply_text_transforms(self, text: str) -> str:
        for text_type, transform in self._text_transforms:
            if text_type in (self._text_type, "*"):
                text = await transform(text, self._text_type)
        return text

    async def _speak(self, turn: _Turn, text: str, *, complete: bool) -> None:
        """Send `text` as its transforms have it (an unfinished word waits unless `complete`). A
        transform that fails is the application's error, once, and the text it failed on is not
        spoken (speaking it untransformed may not be safe), as Pipecat does for its own."""
        try:
            spoken = await turn.text.push(text, complete=complete)
        except Exception as error:
            self._explained.add(turn.context_id)
            await self.push_error(
                error_msg=f"codecstream: a text transform failed on {text!r}: {error}",
                exception=error,
                category=ErrorCategory.APPLICATION,
            )
            return
        turn.speech.push_text(spoken)

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send `text` to the turn's stream (opened on its first text); audio arrives through the
        stream's reader task."""
        if context_id in self._refused:
            yield None  # the turn already said why it cannot be spoken, once
            return
        turn = self._turns.get(context_id)
        try:
            if turn is None:
                turn = self._open_turn(context_id, await self._decoder.ready())
            if self._text_aggregation_mode is TextAggregationMode.SENTENCE:
                # Pipecat strips the space between its sentences: without it "there.The" would be
                # one word to the tokenizer and to the word timings.
                if turn.text.written and not turn.text.written[-1].isspace() and not text[:1].isspace():
                    text = " " + text
                await self._speak(turn, text, complete=True)
                turn.speech.flush()  # Pipecat cut the sentence already
            else:
                await self._speak(turn, text, complete=False)
            await self.start_tts_usage_metrics(text)
        except CodecStreamError as error:  # the decoder could not be loaded
            self._refused.add(context_id)
            self._explained.add(context_id)
            yield ErrorFrame(error=f"codecstream: {error}")
            return
        yield None

    def _open_turn(self, context_id: str, decoder: LoadedDecoder) -> _Turn:
        """Start the turn's stream; it opens in the reader task, so that the text keeps coming to
        run_tts meanwhile (queued until the server answers) and a server that never answers is bound
        by the stall timeout. The turn's TTFB runs from its audio context's start (Pipecat's, at the
        turn's first text), so that a wait for the decoder is in it."""
        stream = self._client.stream_text(decoder=decoder, **self._request())
        text = SpokenText([self._apply_text_transforms] if self._text_transforms else [])
        turn = _Turn(context_id, Speech(stream, self.sample_rate, text, stall_timeout_s=self._stall_timeout_s))
        self._turns[context_id] = turn
        turn.reader = self.create_task(self._read(turn), f"codecstream-{context_id}")
        return turn

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The LLM's reply is complete: the stream ends once the rest is spoken."""
        context_id = context_id or self.get_active_audio_context_id() or ""
        if context_id in self._refused:
            await self._end_context(context_id)
        turn = self._turns.get(context_id)
        if turn is not None:
            await self._speak(turn, "", complete=True)
            turn.speech.end_input()

    async def _apply_force_complete(self, context_id: str) -> None:
        # At a context's end Pipecat reports the words no timestamp covered as spoken (for providers
        # that drop timestamps). Every word heard here came with its audio: the rest (of a turn that
        # stalled, was refused or lost text to a transform) was not heard and stays out of the context.
        self._completing = context_id
        try:
            await super()._apply_force_complete(context_id)
        finally:
            self._completing = None

    async def push_frame(self, frame: Frame, direction: FrameDirection = FrameDirection.DOWNSTREAM) -> None:
        if isinstance(frame, (TTSTextFrame, AggregatedTextProgressFrame)) and frame.context_id == self._completing:
            return
        await super().push_frame(frame, direction)

    async def _record_context_audio_outcome(self, context_id: str, received_audio: bool) -> None:
        # Pipecat notes every context that ends without audio as an error of its own, to catch a
        # provider that stays silent without saying why. This turn may have said why already.
        if context_id not in self._explained:
            await super()._record_context_audio_outcome(context_id, received_audio)

    async def on_audio_context_completed(self, context_id: str) -> None:
        self._refused.discard(context_id)
        self._explained.discard(context_id)
        await super().on_audio_context_completed(context_id)

    async def _read(self, turn: _Turn) -> None:
        context_id, playout = turn.context_id, turn.speech.playout
        try:
            async for handout in turn.speech:
                if handout.first:
                    await self.stop_ttfb_metrics()
                if handout.words:
                    # Pipecat times words from the turn's first audio; the waits for late audio are added.
                    words = [(w.word, playout.playout_s(w.start_s)) for w in handout.words]
                    await self.add_word_timestamps(words, context_id)
                if handout.audio:
                    frame = TTSAudioRawFrame(
                        audio=handout.audio, sample_rate=self.sample_rate, num_channels=1, context_id=context_id
                    )
                    await self.append_to_audio_context(context_id, frame)
        except SpeechStalled as error:  # a TimeoutError: Pipecat's CONNECTIVITY
            await self._failed(turn, error_msg=f"codecstream: {error}", exception=error)
        except CodecStreamError as error:
            await self._failed(turn, error_msg=f"codecstream: {error}")
        finally:
            self._turns.pop(context_id, None)
            if context_id not in self._refused:
                await self._end_context(context_id)

    async def _failed(self, turn: _Turn, **error) -> None:
        """The turn's stream failed: one ErrorFrame; the rest of a reply still being written goes nowhere."""
        self._explained.add(turn.context_id)
        if not turn.stream.text_complete:
            self._refused.add(turn.context_id)
        await self.push_error(**error)

    async def _end_context(self, context_id: str) -> None:
        """The turn is over: TTSStoppedFrame after its audio, and Pipecat plays the next turn at once."""
        if self.audio_context_available(context_id):
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: stop the server's stream now, reporting the frames played so far."""
        await self.stop_all_metrics()
        self._refused.discard(context_id)
        self._explained.discard(context_id)
        await self._cancel_turn(context_id)
        await super().on_audio_context_interrupted(context_id)

    async def _cancel_turn(self, context_id: str) -> None:
        turn = self._turns.pop(context_id, None)
        if turn is None:
            return
        played = turn.speech.played_frames()
        if turn.reader is not None:
            turn.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, CodecStreamError):
                await turn.reader
        with contextlib.suppress(CodecStreamError):
            end = await turn.stream.cancel(played)
            if end is not None:
                heard = turn.text.written_offset(end.text_offset_played)
                logger.debug(
                    f"{self}: stream {turn.stream.codes.stream_id} cancelled after {played * FRAME_SECONDS:.2f} s "
                    f"played; heard {heard} of {len(turn.text.written)} characters as written"
                )

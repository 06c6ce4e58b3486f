"""`AsyncClient` and `Client`: the same methods, asyncio or blocking."""

from __future__ import annotations

import asyncio
import concurrent.futures
import operator
import pathlib
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar, overload

import grpc
import numpy as np
from codecstream.client.channel import DEFAULT_KEEPALIVE_S, call_metadata, open_channel
from codecstream.client.code_stream import AsyncCodeStream
from codecstream.client.decoder_download import AUTO, DEFAULT_DECODER_TIMEOUT_S, fetch_decoder
from codecstream.client.decoders import shared_decoder
from codecstream.client.errors import from_rpc_error
from codecstream.client.requests import StartOptions, build_start
from codecstream.client.runtimes.errors import DecoderLoadError
from codecstream.client.runtimes.loaded import LoadedDecoder
from codecstream.client.synthesis import AsyncAudioStream, AudioStreamStats, PcmChunk
from codecstream.client.text_stream import AsyncTextStream
from codecstream.protocol.decoding import FrameDecoder
from codecstream.protocol.reassembler import ReceivedChunk
from codecstream.protocol.text_timing import WordTiming
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; the client also runs on 3.10 (JetPack 6)
    from typing_extensions import Unpack

T = TypeVar("T")
DEFAULT_TARGET = "127.0.0.1:50051"


class ConnectionOptions(TypedDict, total=False):
    """How a client connects: AsyncClient's keyword arguments, which Client passes on to it."""

    tls: bool | str | pathlib.Path
    token: str | None
    resume_timeout_s: float | None
    keepalive_s: float
    decoder_timeout_s: float


class AsyncClient:
    """A connection to a codecstream server.

    async with AsyncClient("host:50051") as client:
        async for chunk in client.stream_codes("Hello", voice="vivian"):
            ...

    `tls`: False (plaintext), True (system roots) or a PEM root certificate path. `token`: a bearer
    token sent on every call. `resume_timeout_s`: how long a resumable stream keeps trying to
    reattach after a lost connection; None: as long as the server keeps it (its resume window,
    which the Header states); 0: never. `keepalive_s`: ping the server this often while
    a call is open, so a connection that died silently is noticed within about twice that.
    `decoder_timeout_s`: the most decoder="auto" may take to have the server's decoder ready (the
    listing, the download and its check), DecoderLoadError after it.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        tls: bool | str | pathlib.Path = False,
        token: str | None = None,
        resume_timeout_s: float | None = None,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        decoder_timeout_s: float = DEFAULT_DECODER_TIMEOUT_S,
    ) -> None:
        self.target = target
        self._decoder_timeout_s = decoder_timeout_s
        self._channel = open_channel(target, tls, token, keepalive_s)
        self._stub = synthesis_pb2_grpc.SynthesisServiceStub(self._channel)
        self._metadata = call_metadata(token, bool(tls))
        self._resume_timeout_s = resume_timeout_s
        # One decode thread per client: decoding never blocks the event loop that reads the network.
        self._decode_thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="codecstream-decode"
        )
        self._closed = False

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        await self._channel.close()
        self._decode_thread.shutdown(wait=False)

    async def codec_info(self, timeout_s: float = 10.0) -> pb.GetCodecInfoResponse:
        try:
            return await self._stub.GetCodecInfo(pb.GetCodecInfoRequest(), metadata=self._metadata, timeout=timeout_s)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    async def voices(self, timeout_s: float = 10.0) -> list[pb.Voice]:
        try:
            response = await self._stub.ListVoices(pb.ListVoicesRequest(), metadata=self._metadata, timeout=timeout_s)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return list(response.voices)

    def stream_codes(
        self, text: str, *, timeout_s: float | None = None, **options: Unpack[StartOptions]
    ) -> AsyncCodeStream:
        """Start synthesizing `text`; iterate the result for chunks of codes.

        `timeout_s`: a deadline for the whole stream, resumes included (DeadlineExceeded after it);
        None: none. The other options are StartOptions.
        """
        return AsyncCodeStream(
            self._stub,
            build_start(text, **options),
            self._metadata,
            resume_timeout_s=self._resume_timeout_s,
            timeout_s=timeout_s,
        )

    async def open_decoder(
        self,
        decoder: FrameDecoder | str | pathlib.Path = AUTO,
        *,
        backend: str = "auto",
        cache_dir: pathlib.Path | None = None,
    ) -> LoadedDecoder:
        """A loaded decoder for this server's codes, opened once per process and shared.

        `decoder`: "auto" (the server's own, downloaded once into the cache, decoder_download.py),
        an artifact or checkpoint directory, or a decoder open_decoder opened. `backend` as for
        codecstream.client.runtimes.open_decoder."""
        if isinstance(decoder, str) and decoder == AUTO:

            async def fetch() -> pathlib.Path:
                info = await self.codec_info()
                return await fetch_decoder(self._stub, self._metadata, info.codec, self.target, backend, cache_dir)

            try:
                decoder = await asyncio.wait_for(fetch(), self._decoder_timeout_s)
            except asyncio.TimeoutError:  # TimeoutError itself only from Python 3.11 on
                raise DecoderLoadError(
                    f"the decoder of the server at {self.target} was not ready within "
                    f"{self._decoder_timeout_s:g} s (decoder_timeout_s)"
                ) from None
        return await asyncio.to_thread(shared_decoder, decoder, backend)

    def synthesize(
        self,
        text: str,
        *,
        decoder: FrameDecoder | str | pathlib.Path = AUTO,
        backend: str = "auto",
        timeout_s: float | None = None,
        **options: Unpack[StartOptions],
    ) -> AsyncAudioStream:
        """Start synthesizing `text`; iterate the result for decoded PcmChunks.

        `decoder`: "auto" (the server's own decoder, downloaded once and cached: `open_decoder`),
        a decoder opened by codecstream.client.runtimes.open_decoder, or the directory of a
        decoder artifact / checkpoint, opened with `backend` once per process and shared. Any
        number of streams may use one decoder at once: each decodes with a state of its own. The
        server is told which decoder the client has and refuses a stream its codes would not fit.
        `timeout_s` and the options as for stream_codes.
        """
        codes = self.stream_codes(text, timeout_s=timeout_s, **options)
        return self._decoded(AsyncAudioStream, codes, decoder, backend)

    def stream_text(
        self,
        text: str = "",
        *,
        decoder: FrameDecoder | str | pathlib.Path = AUTO,
        backend: str = "auto",
        timeout_s: float | None = None,
        **options: Unpack[StartOptions],
    ) -> AsyncTextStream:
        """Speech for text that arrives in pieces: `text` is the first piece (may be empty), then
        push_text / flush / end_input on the result; iterate it for PcmChunks with their text
        spans. Options as for synthesize (CustomVoice and VoiceDesign; never resumable)."""
        if options.get("resumable"):
            raise ValueError("stream_text cannot be resumable: text sent while disconnected would be lost")
        options["resumable"] = False
        start = build_start(text, **options)
        start.streaming_text = True
        codes = AsyncCodeStream(
            self._stub, start, self._metadata, resume_timeout_s=self._resume_timeout_s, timeout_s=timeout_s
        )
        return self._decoded(AsyncTextStream, codes, decoder, backend)

    def _decoded(self, stream_class, codes: AsyncCodeStream, decoder, backend: str):
        """`codes` decoded by `decoder`: opened now, or for "auto" when the stream opens."""
        if isinstance(decoder, str) and decoder == AUTO:
            return stream_class(codes, lambda: self.open_decoder(AUTO, backend=backend), self._decode_thread)
        return stream_class(codes, shared_decoder(decoder, backend), self._decode_thread)


class _LoopThread:
    """An event loop on a daemon thread, so blocking callers can drive the asyncio client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="codecstream-client", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def call_soon(self, function, *args) -> None:
        self.loop.call_soon_threadsafe(function, *args)

    def stop(self) -> None:
        """Cancel what is pending and stop the thread; safe to call more than once."""
        if not self._thread.is_alive():
            return

        async def cancel_pending() -> None:
            pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        self.run(cancel_pending())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


class _Forwarded(Generic[T]):
    """A read-only property of a blocking stream: the attribute at `path` (dotted) below it, read
    from the async stream it drives; `doc` is what help() shows for it."""

    def __init__(self, path: str, doc: str | None = None) -> None:
        self.path = path
        self._read = operator.attrgetter(path)
        self.__doc__ = doc
        self._name = path

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, instance: None, owner: type) -> _Forwarded[T]: ...
    @overload
    def __get__(self, instance: object, owner: type) -> T: ...
    def __get__(self, instance, owner):
        return self if instance is None else self._read(instance)

    def __set__(self, instance: object, value: T) -> None:
        raise AttributeError(f"{self._name} of a blocking stream is read-only")


class _BlockingStream:
    """Blocking view of an async stream driven on the client's loop thread."""

    header: _Forwarded[pb.Header | None] = _Forwarded("_stream.header")
    end: _Forwarded[pb.End | None] = _Forwarded("_stream.end", "The server's End, once the stream is over.")
    # Of the code stream: the stream itself, or the one an audio stream decodes.
    resumes: _Forwarded[int] = _Forwarded("_codes.resumes")
    replica: _Forwarded[str | None] = _Forwarded(
        "_codes.replica", "The replica a load balancer names for the stream (None: a direct connection)."
    )
    reference_codes: _Forwarded[np.ndarray] = _Forwarded(
        "_codes.reference_codes",
        "Voice-clone codes from the Header that primed the decoder (never played); (n, 16) int16.",
    )

    def __init__(self, stream, loop: _LoopThread) -> None:
        self._stream = stream
        self._codes: AsyncCodeStream = stream.codes if isinstance(stream, AsyncAudioStream) else stream
        self._loop = loop
        self._exhausted = False

    def open(self) -> pb.Header:
        return self._loop.run(self._stream.open())

    def __iter__(self):
        return self

    def __next__(self):
        if self._exhausted:
            raise StopIteration

        async def next_item():
            try:
                return await self._stream.__anext__()
            except StopAsyncIteration:
                return None

        item = self._loop.run(next_item())
        if item is None:
            self._exhausted = True
            raise StopIteration
        return item

    def cancel(self, played_frames: int = 0) -> pb.End | None:
        return self._loop.run(self._stream.cancel(played_frames))

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self._loop.run(self._stream.__aexit__(*exc_info))


class CodeStream(_BlockingStream):
    """Blocking twin of AsyncCodeStream: iterate for ReceivedChunks; `cancel()`, `ack()`, `header`, `end`."""

    stream_id: _Forwarded[str] = _Forwarded("_stream.stream_id")

    def __next__(self) -> ReceivedChunk:
        return super().__next__()

    def ack(self, seq: int) -> None:
        self._loop.call_soon(self._stream.ack, seq)

    def abandon(self) -> None:
        self._loop.call_soon(self._stream.abandon)


class AudioStream(_BlockingStream):
    """Blocking twin of AsyncAudioStream: iterate for PcmChunks; `cancel()`, `header`, `end`, `stats`."""

    stats: _Forwarded[AudioStreamStats] = _Forwarded("_stream.stats")
    text: _Forwarded[str] = _Forwarded("_stream.text")
    text_offset_played: _Forwarded[int | None] = _Forwarded("_stream.text_offset_played")
    heard_text: _Forwarded[str | None] = _Forwarded("_stream.heard_text")

    def __next__(self) -> PcmChunk:
        return super().__next__()

    def new_word_timings(self) -> list[WordTiming]:
        return self._stream.new_word_timings()

    def word_timestamps(self) -> list[WordTiming]:
        return self._stream.word_timestamps()


class TextStream(AudioStream):
    """Blocking twin of AsyncTextStream: push_text / flush / end_input, iterate for PcmChunks."""

    def push_text(self, text: str) -> None:
        self._loop.call_soon(self._stream.push_text, text)

    def flush(self) -> None:
        self._loop.call_soon(self._stream.flush)

    def end_input(self) -> None:
        self._loop.call_soon(self._stream.end_input)


class Client:
    """Blocking client with the methods of AsyncClient (and its constructor's options).

    with Client("host:50051") as client:
        for chunk in client.stream_codes("Hello", voice="vivian"):
            ...
    """

    def __init__(self, target: str = DEFAULT_TARGET, **connection: Unpack[ConnectionOptions]) -> None:
        self._loop = _LoopThread()

        async def make() -> AsyncClient:
            return AsyncClient(target, **connection)

        try:
            self._async = self._loop.run(make())
        except BaseException:
            self._loop.stop()
            raise
        self.target = target
        self._closed = False

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection and stop the client's thread; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._loop.run(self._async.close())
        self._loop.stop()

    def codec_info(self, timeout_s: float = 10.0) -> pb.GetCodecInfoResponse:
        return self._loop.run(self._async.codec_info(timeout_s))

    def voices(self, timeout_s: float = 10.0) -> list[pb.Voice]:
        return self._loop.run(self._async.voices(timeout_s))

    def open_decoder(
        self,
        decoder: FrameDecoder | str | pathlib.Path = AUTO,
        *,
        backend: str = "auto",
        cache_dir: pathlib.Path | None = None,
    ) -> LoadedDecoder:
        """Blocking twin of AsyncClient.open_decoder."""
        return self._loop.run(self._async.open_decoder(decoder, backend=backend, cache_dir=cache_dir))

    def stream_codes(self, text: str, *, timeout_s: float | None = None, **options: Unpack[StartOptions]) -> CodeStream:
        """Blocking twin of AsyncClient.stream_codes: iterate for ReceivedChunks."""
        return CodeStream(self._async.stream_codes(text, timeout_s=timeout_s, **options), self._loop)

    def synthesize(
        self,
        text: str,
        *,
        decoder: FrameDecoder | str | pathlib.Path = AUTO,
        backend: str = "auto",
        timeout_s: float | None = None,
        **options: Unpack[StartOptions],
    ) -> AudioStream:
        """Blocking twin of AsyncClient.synthesize: iterate for PcmChunks."""
        stream = self._async.synthesize(text, decoder=decoder, backend=backend, timeout_s=timeout_s, **options)
        return AudioStream(stream, self._loop)

    def stream_text(
        self,
        text: str = "",
        *,
        decoder: FrameDecoder | str | pathlib.Path = AUTO,
        backend: str = "auto",
        timeout_s: float | None = None,
        **options: Unpack[StartOptions],
    ) -> TextStream:
        """Blocking twin of AsyncClient.stream_text."""

        async def make() -> AsyncTextStream:
            return self._async.stream_text(text, decoder=decoder, backend=backend, timeout_s=timeout_s, **options)

        return TextStream(self._loop.run(make()), self._loop)

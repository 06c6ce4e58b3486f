"""`AsyncClient` and `Client`: the same methods, asyncio or blocking."""

from __future__ import annotations

import asyncio
import concurrent.futures
import pathlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import grpc
from codecstream.client.channel import call_metadata, open_channel
from codecstream.client.code_stream import AsyncCodeStream
from codecstream.client.errors import from_rpc_error
from codecstream.client.requests import build_start
from codecstream.client.synthesis import AsyncAudioStream, PcmChunk, decoder_codec
from codecstream.protocol.decoding import FrameDecoder
from codecstream.protocol.reassembler import ReceivedChunk
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc

T = TypeVar("T")
DEFAULT_TARGET = "127.0.0.1:50051"


class AsyncClient:
    """A connection to a codecstream server.

    async with AsyncClient("host:50051") as client:
        async for chunk in client.stream_codes("Hello", voice="vivian"):
            ...
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        tls: bool | str | pathlib.Path = False,
        token: str | None = None,
        resume_attempts: int = 3,
    ) -> None:
        self.target = target
        self._channel = open_channel(target, tls, token)
        self._stub = synthesis_pb2_grpc.SynthesisServiceStub(self._channel)
        self._metadata = call_metadata(token, bool(tls))
        self._resume_attempts = resume_attempts
        # One decode thread per client: decoding never blocks the event loop that reads the network.
        self._decode_thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="codecstream-decode"
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()
        self._decode_thread.shutdown(wait=False)

    async def codec_info(self, timeout: float = 10.0) -> pb.GetCodecInfoResponse:
        try:
            return await self._stub.GetCodecInfo(pb.GetCodecInfoRequest(), metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    async def voices(self, timeout: float = 10.0) -> list[pb.Voice]:
        try:
            response = await self._stub.ListVoices(pb.ListVoicesRequest(), metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return list(response.voices)

    def stream_codes(self, text: str, **options: Any) -> AsyncCodeStream:
        """Start synthesizing `text`; iterate the result for chunks of codes.

        Options: voice, language, instructions, task_type, reference_audio, reference_text, seed,
        temperature, top_p, top_k, repetition_penalty, max_frames, chunking, client_request_id,
        resumable, expected_codec.
        """
        return AsyncCodeStream(self._stub, build_start(text, **options), self._metadata, self._resume_attempts)

    def synthesize(
        self, text: str, *, decoder: FrameDecoder | str | pathlib.Path, backend: str = "auto", **options: Any
    ) -> AsyncAudioStream:
        """Start synthesizing `text`; iterate the result for decoded PcmChunks.

        `decoder`: an opened decoder (codecstream.client.runtimes.open_decoder) or the directory of
        a decoder artifact / checkpoint to open with `backend`. The server is told which decoder the
        client has and refuses a stream its codes would not fit; options as for stream_codes.
        """
        decoder = resolve_decoder(decoder, backend)
        options.setdefault("expected_codec", decoder_codec(decoder))
        return AsyncAudioStream(self.stream_codes(text, **options), decoder, self._decode_thread)


def resolve_decoder(decoder: FrameDecoder | str | pathlib.Path, backend: str = "auto") -> FrameDecoder:
    if isinstance(decoder, FrameDecoder):
        return decoder
    from codecstream.client.runtimes import open_decoder

    return open_decoder(decoder, backend=backend)


class _LoopThread:
    """An event loop on a daemon thread, so blocking callers can drive the asyncio client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="codecstream-client", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def stop(self) -> None:
        async def cancel_pending() -> None:
            pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        self.run(cancel_pending())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


class _BlockingStream:
    """Blocking view of an async stream driven on the client's loop thread."""

    def __init__(self, stream, loop: _LoopThread) -> None:
        self._stream = stream
        self._loop = loop

    def open(self) -> pb.Header:
        return self._loop.run(self._stream.open())

    def __iter__(self):
        return self

    def __next__(self):
        async def next_item():
            try:
                return await self._stream.__anext__()
            except StopAsyncIteration:
                return None

        item = self._loop.run(next_item())
        if item is None:
            raise StopIteration
        return item

    def cancel(self, played_frames: int = 0) -> pb.End | None:
        return self._loop.run(self._stream.cancel(played_frames))

    def __getattr__(self, name: str):
        # header, end, stats, ...: read-only state of the async stream.
        return getattr(self._stream, name)


class CodeStream(_BlockingStream):
    """Blocking twin of AsyncCodeStream: iterate for ReceivedChunks; `cancel()`, `ack()`, `header`, `end`."""

    def __next__(self) -> ReceivedChunk:
        return super().__next__()

    def ack(self, seq: int) -> None:
        self._loop.loop.call_soon_threadsafe(self._stream.ack, seq)

    def abandon(self) -> None:
        self._loop.loop.call_soon_threadsafe(self._stream.abandon)


class AudioStream(_BlockingStream):
    """Blocking twin of AsyncAudioStream: iterate for PcmChunks; `cancel()`, `header`, `end`, `stats`."""

    def __next__(self) -> PcmChunk:
        return super().__next__()


class Client:
    """Blocking client with the methods of AsyncClient.

    with Client("host:50051") as client:
        for chunk in client.stream_codes("Hello", voice="vivian"):
            ...
    """

    def __init__(self, target: str = DEFAULT_TARGET, **options: Any) -> None:
        self._loop = _LoopThread()

        async def make() -> AsyncClient:
            return AsyncClient(target, **options)

        self._async = self._loop.run(make())
        self.target = target

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._loop.run(self._async.close())
        self._loop.stop()

    def codec_info(self, timeout: float = 10.0) -> pb.GetCodecInfoResponse:
        return self._loop.run(self._async.codec_info(timeout))

    def voices(self, timeout: float = 10.0) -> list[pb.Voice]:
        return self._loop.run(self._async.voices(timeout))

    def stream_codes(self, text: str, **options: Any) -> CodeStream:
        return CodeStream(self._async.stream_codes(text, **options), self._loop)

    def synthesize(
        self, text: str, *, decoder: FrameDecoder | str | pathlib.Path, backend: str = "auto", **options: Any
    ) -> AudioStream:
        """Blocking twin of AsyncClient.synthesize: iterate for PcmChunks."""
        return AudioStream(self._async.synthesize(text, decoder=decoder, backend=backend, **options), self._loop)

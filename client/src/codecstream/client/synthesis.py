"""Codes in, PCM out: a stream of decoded audio chunks on top of a code stream.

Chunks are received on the event loop (timestamped on arrival) and decoded on a worker thread, so
a slow decode never delays reading the network. The decoder's codec spec is checked against the
stream's Header before any audio is produced; voice-clone reference codes prime the decoder and
are never returned as audio. Words are timed as their audio arrives (protocol/text_timing.py):
`new_word_timings()` after each chunk gives the words it completed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import time
from collections.abc import Awaitable, Callable

import numpy as np
from codecstream.client.code_stream import AsyncCodeStream
from codecstream.client.errors import CodecMismatch
from codecstream.client.runtimes.loaded import LoadedDecoder
from codecstream.protocol.codec_spec import spec_differences
from codecstream.protocol.decoding import FRAME_SECONDS
from codecstream.protocol.pcm import to_pcm16
from codecstream.protocol.reassembler import ReceivedChunk
from codecstream.protocol.text_timing import WordClock, WordTiming
from codecstream.v1 import synthesis_pb2 as pb

#: gRPC length prefix (5 bytes) + HTTP/2 DATA frame header (9 bytes) around every message.
FRAMING_BYTES_PER_MESSAGE = 14
_DONE = object()
#: A server that does not confirm a cancel within this long is dropped (the call is cancelled).
CANCEL_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class PcmChunk:
    """Decoded audio of one chunk: float32 samples in [-1, 1] at the stream's sample rate."""

    seq: int
    first_frame: int
    num_frames: int
    samples: np.ndarray
    #: The codes these samples were decoded from, (num_frames, 16) int16.
    codes: np.ndarray
    #: Seconds from the request to this chunk's arrival, and to the end of its decoding.
    arrived_s: float
    decoded_s: float
    decode_s: float
    #: Characters [text_start, text_end) of the text these frames speak: the text the talker was
    #: conditioned on while generating them (Chunk.text_start), not a forced alignment.
    text_start: int = 0
    text_end: int = 0
    #: No later chunk speaks more of that text (Chunk.ends_text_span).
    ends_text_span: bool = False

    def int16(self) -> np.ndarray:
        return to_pcm16(self.samples)


@dataclasses.dataclass
class AudioStreamStats:
    time_to_first_chunk_s: float | None = None
    time_to_first_audio_s: float | None = None
    chunks: int = 0
    frames: int = 0
    decode_s: float = 0.0
    wire_bytes: int = 0
    resumes: int = 0
    decode_times_s: list[float] = dataclasses.field(default_factory=list)
    arrival_times_s: list[float] = dataclasses.field(default_factory=list)

    @property
    def audio_s(self) -> float:
        return self.frames * FRAME_SECONDS

    @property
    def decode_rtf(self) -> float:
        """Decode time per second of audio (< 1: faster than real time)."""
        return self.decode_s / self.audio_s if self.frames else 0.0

    @property
    def wire_bytes_per_audio_second(self) -> float:
        return self.wire_bytes / self.audio_s if self.frames else 0.0


class AsyncAudioStream:
    """Async iterator of PcmChunk; `cancel()` stops the server, drops pending audio, resets the decoder.

    `decoder`: the loaded decoder (the stream decodes with a state of its own, `new_stream()`), or
    a coroutine function that loads it when the stream opens (the server's own decoder, `decoder="auto"`).
    The server is told which decoder it is (Start.expected_codec). Use the stream as an async
    context manager to cancel it if the block is left before the stream ends.
    """

    def __init__(
        self,
        codes: AsyncCodeStream,
        decoder: LoadedDecoder | Callable[[], Awaitable[LoadedDecoder]],
        executor: concurrent.futures.Executor,
    ) -> None:
        self.codes = codes
        self._loading: Callable[[], Awaitable[LoadedDecoder]] | None = None
        #: This stream's decoder (a state of its own over the loaded weights), once it is loaded.
        self.decoder: LoadedDecoder | None = None
        if isinstance(decoder, LoadedDecoder):
            self._use(decoder)
        else:
            self._loading = decoder
        self._executor = executor
        self._arrivals: asyncio.Queue = asyncio.Queue()
        self._receiver: asyncio.Task | None = None
        self._started = 0.0
        self._opened = False
        self._finished = False
        self.stats = AudioStreamStats()
        self._words = WordClock()
        self._words_taken = 0

    @property
    def text(self) -> str:
        """The text of the stream (Start.text); offsets in chunks and End refer to it."""
        return self.codes.start_text

    @property
    def text_complete(self) -> bool:
        """Whether `text` is all the stream will speak (a streamed text until its input ends is not)."""
        return True

    @property
    def header(self) -> pb.Header | None:
        return self.codes.header

    @property
    def end(self) -> pb.End | None:
        return self.codes.end

    async def open(self) -> pb.Header:
        """Start the request, check the codec, prime the decoder; returns the Header."""
        if self._opened:
            return self.header
        self._opened = True
        self._started = time.monotonic()
        if self._loading is not None:
            loading, self._loading = self._loading, None
            self._use(await loading())
        header = await self.codes.open()
        differences = spec_differences(header.codec, self.decoder.codec)
        if differences:
            await self.codes.cancel()
            raise CodecMismatch(f"the decoder does not match the stream's codec ({'; '.join(differences)})")
        await self._in_worker(self.decoder.reset)
        if len(self.codes.reference_codes):
            await self._in_worker(self.decoder.prime, self.codes.reference_codes)
        self._receiver = asyncio.create_task(self._receive())
        return header

    def _use(self, loaded: LoadedDecoder) -> None:
        self.decoder = loaded.new_stream()
        self.codes.expect_codec(loaded.codec)

    async def _in_worker(self, function, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def _receive(self) -> None:
        try:
            async for chunk in self.codes:
                self._arrivals.put_nowait((chunk, time.monotonic() - self._started))
            self._arrivals.put_nowait((_DONE, None))
        except Exception as error:
            self._arrivals.put_nowait((error, None))

    def __aiter__(self):
        return self

    async def __anext__(self) -> PcmChunk:
        if self._finished:
            raise StopAsyncIteration
        await self.open()
        item, arrived_s = await self._arrivals.get()
        if item is _DONE:
            self._finished = True
            self.stats.resumes = self.codes.resumes
            if self.end is not None and self.end.reason in (pb.END_REASON_EOS, pb.END_REASON_MAX_FRAMES):
                self._words.end(self.text)  # every span is complete
            raise StopAsyncIteration
        if isinstance(item, Exception):
            raise item
        chunk: ReceivedChunk = item
        began = time.monotonic()
        samples = await self._in_worker(self.decoder.decode, chunk.codes)
        decode_s = time.monotonic() - began
        decoded_s = time.monotonic() - self._started
        self.codes.ack(chunk.seq)
        self._account(chunk, arrived_s, decoded_s, decode_s)
        self._words.add(
            self.text,
            chunk.first_frame,
            chunk.num_frames,
            chunk.text_start,
            chunk.text_end,
            chunk.ends_text_span,
            text_complete=self.text_complete,
        )
        return PcmChunk(
            chunk.seq,
            chunk.first_frame,
            chunk.num_frames,
            samples,
            chunk.codes,
            arrived_s,
            decoded_s,
            decode_s,
            chunk.text_start,
            chunk.text_end,
            chunk.ends_text_span,
        )

    def new_word_timings(self) -> list[WordTiming]:
        """Words whose audio arrived since the last call, in order, timed from the stream's first
        frame (0 s): call it after each chunk to hand a transcript out with the audio it describes,
        and once more after the last chunk. Each span's characters are spread over its frames (an
        estimate from the talker's conditioning, not a forced alignment)."""
        words = self._words.words[self._words_taken :]
        self._words_taken += len(words)
        return words

    def word_timestamps(self) -> list[WordTiming]:
        """Every word timed so far (see `new_word_timings`)."""
        return list(self._words.words)

    @property
    def text_offset_played(self) -> int | None:
        """After the stream ended: characters of `text` the listener heard (End.text_offset_played)."""
        return self.end.text_offset_played if self.end is not None else None

    @property
    def heard_text(self) -> str | None:
        """After the stream ended: the text up to `text_offset_played`."""
        offset = self.text_offset_played
        return None if offset is None else self.text[:offset]

    def _account(self, chunk: ReceivedChunk, arrived_s: float, decoded_s: float, decode_s: float) -> None:
        stats = self.stats
        if stats.time_to_first_chunk_s is None:
            stats.time_to_first_chunk_s = arrived_s
            stats.time_to_first_audio_s = decoded_s
        stats.chunks += 1
        stats.frames += chunk.num_frames
        stats.decode_s += decode_s
        stats.decode_times_s.append(decode_s)
        stats.arrival_times_s.append(arrived_s)
        stats.wire_bytes += chunk.message_bytes + FRAMING_BYTES_PER_MESSAGE

    async def __aenter__(self) -> AsyncAudioStream:
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self._opened and self.codes.end is None:
            await self.cancel(self.stats.frames)

    async def cancel(self, played_frames: int = 0) -> pb.End | None:
        """Barge-in: stop the server stream, discard undecoded chunks, reset the decoder."""
        if self._receiver is None or self.codes.abandoned:
            # A dropped call ends its receiver with grpc.aio's CancelledError: nothing to wait for.
            if self._receiver is not None:
                self._receiver.cancel()
            end = await self.codes.cancel(played_frames)
        else:
            # The receiver owns the response iterator: it reads on until End(CANCELLED) arrives.
            self.codes.request_cancel(played_frames)
            try:
                await asyncio.wait_for(asyncio.shield(self._receiver), CANCEL_TIMEOUT_S)
            except asyncio.TimeoutError:
                self.codes.abandon()
            end = self.codes.end
        while not self._arrivals.empty():
            self._arrivals.get_nowait()
        self._arrivals.put_nowait((_DONE, None))
        if self.decoder is not None:
            await self._in_worker(self.decoder.reset)
        return end

"""One Synthesize call seen from the client: chunks of codes in order, cancel, ack, resume."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import numpy as np
from codecstream.client.errors import StreamEnded, from_rpc_error
from codecstream.protocol.reassembler import ReceivedChunk, StreamReassembler
from codecstream.v1 import synthesis_pb2 as pb

log = logging.getLogger(__name__)

_CLOSE = object()
#: Response header that a load balancer sets to name the replica serving a stream (Envoy's
#: header-based stateful session); echoed on Resume so the reattach reaches the same replica.
AFFINITY_HEADER = "codecstream-session"
#: Statuses that mean "the connection broke", after which a resumable stream reattaches.
_RESUMABLE_STATUSES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


class AsyncCodeStream:
    """Async iterator of `ReceivedChunk`s; the Header is read before the first chunk is returned.

    `header`, `reference_codes` and, once the stream is over, `end` describe the stream.
    """

    def __init__(self, stub, start: pb.Start, metadata: tuple = (), resume_attempts: int = 3) -> None:
        self._stub = stub
        self._start = start
        self._metadata = metadata
        self._resume_attempts = resume_attempts if start.resumable else 0
        self._reassembler = StreamReassembler()
        self._requests: asyncio.Queue = asyncio.Queue()
        self._call = None
        self._responses = None
        self.opened_at = 0.0
        self.first_chunk_at: float | None = None
        self.resumes = 0
        self.cancelled = False
        self._affinity: tuple[tuple[str, str], ...] = ()

    # -- state ---------------------------------------------------------------------------------

    @property
    def header(self) -> pb.Header | None:
        return self._reassembler.header

    @property
    def end(self) -> pb.End | None:
        return self._reassembler.end

    @property
    def stream_id(self) -> str:
        return self.header.stream_id if self.header else ""

    @property
    def reference_codes(self) -> np.ndarray:
        return self._reassembler.reference_codes

    @property
    def frames_received(self) -> int:
        return self._reassembler.next_frame

    # -- call plumbing -------------------------------------------------------------------------

    async def _request_messages(self, first: pb.SynthesizeRequest, queue: asyncio.Queue):
        yield first
        while (message := await queue.get()) is not _CLOSE:
            yield message

    def _open_call(self, first: pb.SynthesizeRequest) -> None:
        self._requests = asyncio.Queue()
        metadata = self._metadata + self._affinity
        self._call = self._stub.Synthesize(self._request_messages(first, self._requests), metadata=metadata)
        self._responses = self._call.__aiter__()

    async def _remember_affinity(self) -> None:
        for key, value in await self._call.initial_metadata() or ():
            if key == AFFINITY_HEADER:
                self._affinity = ((AFFINITY_HEADER, value),)

    async def open(self) -> pb.Header:
        """Send Start and wait for the Header. Raises a ServerError subclass if the server refuses."""
        if self._call is None:
            self.opened_at = time.monotonic()
            self._open_call(pb.SynthesizeRequest(start=self._start))
            await self._next_message()
            await self._remember_affinity()
        return self.header

    async def _next_message(self) -> pb.SynthesizeResponse | None:
        """Next validated message, reattaching once per broken connection if the stream is resumable."""
        while True:
            try:
                message = await self._responses.__anext__()
            except StopAsyncIteration:
                if self.end is None:
                    raise StreamEnded(
                        pb.End(reason=pb.END_REASON_ERROR, message="server closed the stream without End")
                    ) from None
                return None
            except grpc.RpcError as error:
                if await self._try_resume(error):
                    continue
                raise from_rpc_error(error) from None
            chunk = self._reassembler.accept(message)
            if message.HasField("end"):
                self._requests.put_nowait(_CLOSE)
            return message if chunk is None else chunk

    async def _try_resume(self, error: grpc.RpcError) -> bool:
        if self.header is None or self.end is not None or error.code() not in _RESUMABLE_STATUSES:
            return False
        while self.resumes < self._resume_attempts:
            self.resumes += 1
            await asyncio.sleep(0.05 * 2**self.resumes)
            log.info(
                "stream %s: connection lost (%s), resuming after seq %s",
                self.stream_id,
                error.code().name,
                self._reassembler.last_seq,
            )
            self._reassembler.expect_resume()
            resume = pb.Resume(stream_id=self.stream_id)
            if self._reassembler.last_seq is not None:
                resume.last_acked_seq = self._reassembler.last_seq
            self._open_call(pb.SynthesizeRequest(resume=resume))
            try:
                await self._next_message()  # the Header again
                return True
            except Exception as retry_error:
                log.info("stream %s: resume attempt %d failed: %s", self.stream_id, self.resumes, retry_error)
        return False

    # -- iteration -----------------------------------------------------------------------------

    def __aiter__(self):
        return self

    async def __anext__(self) -> ReceivedChunk:
        await self.open()
        while True:
            if self.end is not None:
                self._raise_if_error()
                raise StopAsyncIteration
            item = await self._next_message()
            if isinstance(item, ReceivedChunk):
                if self.first_chunk_at is None:
                    self.first_chunk_at = time.monotonic()
                return item

    def _raise_if_error(self) -> None:
        if self.end is not None and self.end.reason in (pb.END_REASON_ERROR, pb.END_REASON_UNSPECIFIED):
            raise StreamEnded(self.end)

    # -- control -------------------------------------------------------------------------------

    def ack(self, seq: int) -> None:
        """Tell the server chunks up to `seq` are decoded (they need not be kept for resume)."""
        if self._call is not None and self.end is None:
            self._requests.put_nowait(pb.SynthesizeRequest(ack=pb.Ack(seq=seq)))

    def request_cancel(self, played_frames: int = 0) -> None:
        """Ask the server to stop; whoever is iterating the stream sees its End(CANCELLED)."""
        self.cancelled = True
        if self._call is not None and self.end is None:
            self._requests.put_nowait(pb.SynthesizeRequest(cancel=pb.Cancel(played_frames=played_frames)))

    async def cancel(self, played_frames: int = 0) -> pb.End | None:
        """Stop the stream now; chunks still in flight are discarded. Returns the server's End."""
        self.request_cancel(played_frames)
        if self._call is None:
            return self.end
        try:
            while self.end is None:
                await self._next_message()
        except Exception as error:
            log.info("stream %s: error while cancelling: %s", self.stream_id, error)
            self._call.cancel()
        return self.end

    def abandon(self) -> None:
        """Drop the call without waiting (the server sees a disconnect)."""
        if self._call is not None:
            self._call.cancel()

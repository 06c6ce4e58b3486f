"""One Synthesize call seen from the client: chunks of codes in order, cancel, ack, resume.

A resumable stream survives a broken connection: the client opens a new call with Resume, the
server answers with the Header again and the chunks after the last one the client holds, and
iteration goes on as if nothing had happened. Every chunk is handed out exactly once (the
reassembler checks seq and frame continuity across calls), a Cancel or Ack asked for while the
connection was down is sent on the new call, and when the stream cannot be resumed the error
says why (StreamNotFound, ResumeOutOfRange), not just that the connection broke.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import numpy as np
from codecstream.client.errors import CONNECTION_LOST, StreamEnded, Unavailable, from_rpc_error
from codecstream.client.grpc_compat import latest_status, server_status
from codecstream.protocol.metadata import REPLICA_HEADER
from codecstream.protocol.reassembler import ReceivedChunk, StreamReassembler
from codecstream.v1 import synthesis_pb2 as pb

log = logging.getLogger(__name__)

_CLOSE = object()
_FIRST_RETRY_S, _LONGEST_RETRY_S = 0.05, 1.0
#: What grpc.aio reports when the client writes a message after the server has closed the call
#: (grpc/grpc#36066): a stand-in the server's own status replaces a moment later.


class AsyncCodeStream:
    """Async iterator of `ReceivedChunk`s; the Header is read before the first chunk is returned.

    `header`, `reference_codes` and, once the stream is over, `end` describe the stream. Use it as
    an async context manager to cancel it if the block is left before the stream ends.
    """

    def __init__(
        self,
        stub,
        start: pb.Start,
        metadata: tuple = (),
        *,
        resume_timeout_s: float | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self._stub = stub
        self._start = start
        self._metadata = metadata
        #: None: for as long as the server keeps the stream (Header.resume_window_ms).
        self._resume_timeout_s = resume_timeout_s
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._reassembler = StreamReassembler()
        self._requests: asyncio.Queue = asyncio.Queue()
        self._call = None
        self._responses = None
        self._answered = asyncio.Event()
        self._first_status = None
        self._played_frames = 0
        self.opened_at = 0.0
        self.first_chunk_at: float | None = None
        #: Times the stream reattached after a lost connection.
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
    def start_text(self) -> str:
        """Start.text: the text, or for streaming_text its first piece."""
        return self._start.text

    def expect_codec(self, codec) -> None:
        """Tell the server which decoder will decode the codes (Start.expected_codec), unless the
        caller named one; before `open()`."""
        if not self._start.HasField("expected_codec"):
            self._start.expected_codec.CopyFrom(codec)

    @property
    def stream_id(self) -> str:
        return self.header.stream_id if self.header else ""

    @property
    def reference_codes(self) -> np.ndarray:
        return self._reassembler.reference_codes

    @property
    def resume_window_s(self) -> float:
        """How long this stream tries to reattach after a lost connection: the client's
        resume_timeout_s, or the server's window for the stream (Header.resume_window_ms); 0
        for a stream that is not resumable."""
        if self.header is None or not self.header.resume_window_ms:
            return 0.0
        if self._resume_timeout_s is not None:
            return self._resume_timeout_s
        return self.header.resume_window_ms / 1000

    @property
    def replica(self) -> str | None:
        """The replica serving the stream, as a load balancer named it (REPLICA_HEADER); None
        when the server is reached directly."""
        return self._affinity[0][1] if self._affinity else None

    @property
    def frames_received(self) -> int:
        return self._reassembler.next_frame

    # -- call plumbing -------------------------------------------------------------------------

    async def _request_messages(self, first: pb.SynthesizeRequest, queue: asyncio.Queue, answered: asyncio.Event):
        yield first
        # Nothing more is written until the server has answered with its Header: a call it refuses
        # is closed before that, and a write that races the close hides the refusal behind
        # INTERNAL (grpc/grpc#36066).
        await answered.wait()
        while (message := await queue.get()) is not _CLOSE:
            yield message

    def _open_call(self, first: pb.SynthesizeRequest) -> None:
        """Open a call whose first message is `first`; messages not yet sent on the previous call
        (a Cancel, Acks) go out on this one."""
        unsent = []
        while not self._requests.empty():
            message = self._requests.get_nowait()
            if message is not _CLOSE:
                unsent.append(message)
        self._end_requests()  # the previous call's writer, if any, ends with it
        if self.cancelled and not any(message.HasField("cancel") for message in unsent):
            # The previous call may have taken the Cancel off the queue and died with it.
            unsent.append(pb.SynthesizeRequest(cancel=pb.Cancel(played_frames=self._played_frames)))
        self._requests = asyncio.Queue()
        for message in unsent:
            self._requests.put_nowait(message)
        metadata = self._metadata + self._affinity
        self._answered = asyncio.Event()
        self._call = self._stub.Synthesize(
            self._request_messages(first, self._requests, self._answered), metadata=metadata, timeout=self._remaining()
        )
        self._first_status = None
        self._call.add_done_callback(self._note_first_status)
        self._responses = self._call.__aiter__()

    def _end_requests(self) -> None:
        """Let the current call's request generator finish. grpc.aio writes it from a task of its own
        that only a cancel by the client stops: a call the server ended (a refusal, a lost connection)
        would leave it waiting for the Header or the next message forever, and its destruction
        reported as "Task was destroyed but it is pending!"."""
        self._requests.put_nowait(_CLOSE)
        self._answered.set()

    def _note_first_status(self, call) -> None:
        # The status the call ended with before anything could overwrite it (see server_status).
        self._first_status = latest_status(call)

    def _remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    async def _remember_affinity(self) -> None:
        for key, value in await self._call.initial_metadata() or ():
            if key == REPLICA_HEADER and value:
                self._affinity = ((REPLICA_HEADER, value),)

    async def open(self) -> pb.Header:
        """Send Start and wait for the Header. Raises a ServerError subclass if the server refuses."""
        if self._call is None:
            self.opened_at = time.monotonic()
            self._open_call(pb.SynthesizeRequest(start=self._start))
            await self._next_message()
            await self._remember_affinity()
        return self.header

    async def _next_message(self) -> pb.SynthesizeResponse | ReceivedChunk | None:
        """Next validated message; a broken connection is resumed (or its cause raised) first."""
        while True:
            try:
                message = await self._responses.__anext__()
            except StopAsyncIteration:
                self._end_requests()
                if self.end is None:
                    raise StreamEnded(
                        pb.End(reason=pb.END_REASON_ERROR, message="server closed the stream without End")
                    ) from None
                return None
            except grpc.RpcError as error:
                try:
                    await self._reattach(await server_status(error, self._call, self._first_status))
                except BaseException:
                    self._end_requests()
                    raise
                continue
            chunk = self._reassembler.accept(message)
            if message.HasField("header"):
                self._answered.set()
            if message.HasField("end"):
                self._requests.put_nowait(_CLOSE)
            return message if chunk is None else chunk

    async def _reattach(self, lost: grpc.RpcError) -> None:
        """Resume on a new call after `lost` broke the current one: retried with backoff for as long
        as the server keeps the stream. Returns once the new call's Header is in; raises the typed
        error of the real cause otherwise."""
        window_s = self.resume_window_s
        if window_s <= 0 or self.header is None or self.end is not None or lost.code() not in CONNECTION_LOST:
            raise from_rpc_error(lost) from None
        self.resumes += 1
        give_up_at = time.monotonic() + window_s
        delay, last = _FIRST_RETRY_S, lost
        while True:
            log.info("stream %s: connection lost (%s), resuming after seq %s", self.stream_id, last.code().name,
                     self._reassembler.last_seq)  # fmt: skip
            self._reassembler.expect_resume()
            resume = pb.Resume(stream_id=self.stream_id)
            if self._reassembler.last_seq is not None:
                resume.last_acked_seq = self._reassembler.last_seq
            self._open_call(pb.SynthesizeRequest(resume=resume))
            try:
                self._reassembler.accept(await self._responses.__anext__())  # the Header again
                self._answered.set()
                return
            except StopAsyncIteration:
                raise StreamEnded(
                    pb.End(reason=pb.END_REASON_ERROR, message="server closed the resumed stream without a Header")
                ) from None
            except grpc.RpcError as error:
                error = await server_status(error, self._call, self._first_status)
                if error.code() not in CONNECTION_LOST:
                    raise from_rpc_error(error, resuming=True) from None  # NOT_FOUND, OUT_OF_RANGE, ...
                last = error
            if time.monotonic() + delay > give_up_at:
                raise Unavailable(
                    grpc.StatusCode.UNAVAILABLE,
                    f"could not resume stream {self.stream_id} within {window_s:g} s: {last.details()}",
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _LONGEST_RETRY_S)

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

    async def __aenter__(self) -> AsyncCodeStream:
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self._call is not None and self.end is None:
            await self.cancel(self._played_frames)

    # -- control -------------------------------------------------------------------------------

    def ack(self, seq: int) -> None:
        """Tell the server chunks up to `seq` are decoded (they need not be kept for resume)."""
        if self._call is not None and self.end is None:
            self._requests.put_nowait(pb.SynthesizeRequest(ack=pb.Ack(seq=seq)))

    def send_text(self, text: str = "", *, flush: bool = False, end_of_input: bool = False) -> None:
        """Send a TextInput (streaming_text streams); queued until the call is open."""
        if self.end is None:
            self._requests.put_nowait(
                pb.SynthesizeRequest(text=pb.TextInput(text=text, flush=flush, end_of_input=end_of_input))
            )

    def request_cancel(self, played_frames: int = 0) -> None:
        """Ask the server to stop; whoever is iterating the stream sees its End(CANCELLED)."""
        self.cancelled = True
        self._played_frames = played_frames
        if self._call is not None and self.end is None:
            self._requests.put_nowait(pb.SynthesizeRequest(cancel=pb.Cancel(played_frames=played_frames)))

    async def cancel(self, played_frames: int = 0) -> pb.End | None:
        """Stop the stream now; chunks still in flight are discarded. Returns the server's End."""
        self.request_cancel(played_frames)
        if self._call is None or self.abandoned:
            return self.end
        try:
            while self.end is None:
                await self._next_message()
        except Exception as error:  # the stream is being abandoned either way
            log.info("stream %s: error while cancelling: %s", self.stream_id, error)
            self._call.cancel()
        return self.end

    def abandon(self) -> None:
        """Drop the call without waiting (the server sees a disconnect)."""
        if self._call is not None:
            self._call.cancel()

    @property
    def abandoned(self) -> bool:
        """The call was dropped (`abandon`): nothing more comes, and there is nothing to cancel."""
        return self._call is not None and self._call.cancelled()

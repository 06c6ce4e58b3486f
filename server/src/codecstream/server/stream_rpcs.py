"""The streaming RPC, Synthesize: the sessions it opens or resumes, and the calls that follow them.

Before a stream's Header the call is refused with a status; after it, every stream ends with
exactly one End (see the rules in synthesis.proto). Nothing a client sends is echoed beyond a
short prefix, and nothing slow runs on the event loop: reference audio is decoded in a thread and
the source builds its prompt off the loop too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable

import grpc
from codecstream.protocol.preview import preview
from codecstream.server.admission import Admission
from codecstream.server.calls import ClientGone, count_refusal, set_status, write_within
from codecstream.server.errors import Refusal, SourceUnavailable, TextInputViolation, invalid
from codecstream.server.handlers import UnreadableMessage
from codecstream.server.limits import MAX_STREAM_ID_BYTES, ServerLimits
from codecstream.server.metrics import Metrics
from codecstream.server.reference_audio import ReferenceAudioError, decode_reference_audio
from codecstream.server.request import TaskType
from codecstream.server.request_parsing import parse_start
from codecstream.server.segmenting import SegmentingSource
from codecstream.server.session import Attachment, StreamSession
from codecstream.v1 import synthesis_pb2 as pb

log = logging.getLogger(__name__)

STARTING = "the engine is starting"
SHUTTING_DOWN = "the server is shutting down; retry on another replica"
#: How long, and through how many more messages, a refused Synthesize call waits for its client
#: to half-close (see _wait_for_half_close).
REFUSAL_HALF_CLOSE_WAIT_S = 0.02
REFUSAL_HALF_CLOSE_WAIT_MESSAGES = 8


class StreamRpcs:
    """Synthesize over `generator` (the source, as the segmenter wraps it); `sessions` by stream id.
    `caller(context)` names the client a call comes from."""

    def __init__(
        self,
        generator: SegmentingSource,
        limits: ServerLimits,
        metrics: Metrics,
        admission: Admission,
        caller: Callable[[object], str],
    ) -> None:
        self._generator = generator
        self.limits = limits
        self.metrics = metrics
        self.admission = admission
        self._caller = caller
        self.sessions: dict[str, StreamSession] = {}
        #: Why new streams are refused (UNAVAILABLE); None while serving.
        self._unavailable: str | None = STARTING
        self._background: set[asyncio.Task] = set()

    def set_unavailable(self, reason: str | None) -> None:
        """Refuse new streams with UNAVAILABLE and `reason`; None: serve them."""
        self._unavailable = reason

    @property
    def unavailable(self) -> str | None:
        """Why new streams are refused; None while they are served."""
        return self._unavailable

    async def stop_streams(self, reason: int, message: str) -> None:
        """End every running stream with `reason` (engine failure, shutdown)."""
        running = [session for session in self.sessions.values() if not session.finished]
        results = await asyncio.gather(*(s.stop(reason, message) for s in running), return_exceptions=True)
        for session, result in zip(running, results, strict=True):
            if isinstance(result, BaseException):
                log.error("stream %s: stopping failed", session.stream_id, exc_info=result)

    async def Synthesize(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        requests = aiter(request_iterator)
        self.metrics.calls.inc()
        try:
            session, first_seq = await self._begin(requests, context)
        except Refusal as refusal:
            status, message = refusal.status, refusal.message
        except asyncio.CancelledError:
            self.metrics.abandoned.inc()
            raise
        else:
            await self._follow(session, first_seq, requests, context)
            return
        # Refused outside the handler of the Refusal, without context.abort(): see _refuse().
        await self._refuse(context, requests, Refusal(status, message))

    async def _wait_for_half_close(self, requests) -> None:
        """Give a client that already sent everything a moment to half-close before the refusal
        ends the call: a call ended while its client still has the stream open leaves native
        buffers behind in gRPC (docs/performance.md, "Measurements behind the code"; grpc/grpc#43360). A
        client that is still sending is not waited for: read for the whole wait, a flood costs
        the server 20 ms of parsing a refused call."""
        try:
            await asyncio.wait_for(_discard(requests, REFUSAL_HALF_CLOSE_WAIT_MESSAGES), REFUSAL_HALF_CLOSE_WAIT_S)
        except asyncio.TimeoutError:
            pass  # a client still sending: not waited for any longer
        except Exception as error:  # the client went away or sent garbage: the refusal goes out regardless
            log.debug("refused call: reading up to the client's half-close failed: %s", type(error).__name__)

    async def _begin(self, requests, context) -> tuple[StreamSession, int]:
        """The session the first message opens or resumes, and the seq to send from; Refusal otherwise."""
        first = await self._first_message(requests)
        kind = first.WhichOneof("kind")
        if kind == "start":
            return await self._open(first.start, context)
        if kind == "resume":
            return await self._resume(first.resume, context)
        raise invalid(f"first message must be start or resume, got {kind or 'empty'}")

    async def _follow(self, session: StreamSession, first_seq: int, requests, context) -> None:
        """Send the session from `first_seq` on while applying what the client sends; set the
        call's status for the ways it can end early."""
        attachment = await session.attach()
        reader = asyncio.create_task(self._read_control(requests, session, attachment))
        delivered_end = stalled = gone = False
        try:
            async for response in session.follow(first_seq, attachment):
                if not await self._write(context, response):
                    stalled = True
                    break
                delivered_end = response.HasField("end")
        except ClientGone:
            gone = True
        finally:
            reader.cancel()
            if delivered_end:
                self._forget(session)
            else:
                # The connection went away (or stalled) before End: a resumable stream waits for its client.
                why = "client stopped reading" if stalled else "client disconnected"
                session.detach(attachment, lambda: self._expire(session, why))
        if gone:
            raise asyncio.CancelledError("the client went away during a write")
        if attachment.violation:
            set_status(context, "INVALID_ARGUMENT", attachment.violation)
        elif attachment.superseded:
            set_status(context, "ABORTED", f"stream {session.stream_id} was resumed by another call")
        elif stalled:
            self.metrics.stalled_clients.inc()
            timeout = self.limits.stalled_client_timeout_s
            log.info("stream %s: dropped a client that read nothing for %g s", session.stream_id, timeout)
            # Its last write is still pending in gRPC, so a status would fail in gRPC's own code
            # (ExecuteBatchError, logged as an error): the call is cancelled instead, which sends none.
            raise asyncio.CancelledError(f"the client read nothing for {timeout:g} s")

    async def _first_message(self, requests) -> pb.SynthesizeRequest:
        timeout = self.limits.first_message_timeout_s
        try:
            first = await asyncio.wait_for(anext(requests), timeout)
        except StopAsyncIteration:
            raise Refusal(
                "INVALID_ARGUMENT", "the client closed the stream without a Start or Resume message"
            ) from None
        except asyncio.TimeoutError:
            message = f"no Start or Resume within {timeout:g} s of opening the call"
            raise Refusal("DEADLINE_EXCEEDED", message) from None
        if isinstance(first, UnreadableMessage):
            raise invalid(first.reason)
        return first

    async def _write(self, context, response: pb.SynthesizeResponse) -> bool:
        return await write_within(context, response, self.limits.stalled_client_timeout_s)

    async def _open(self, start: pb.Start, context) -> tuple[StreamSession, int]:
        received_at = time.monotonic()
        if self._unavailable:
            raise Refusal("UNAVAILABLE", self._unavailable)
        parsed = parse_start(start, self._generator.offering, self._generator.codec, self.limits)
        caller = self._caller(context)
        running = [session.principal for session in self.sessions.values() if not session.finished]
        stream_id = uuid.uuid4().hex
        with self.admission.admit(caller, running):
            try:
                request = parsed.request
                if request.task_type is TaskType.BASE:
                    reference = await self._decode_reference(parsed.reference_audio)
                    request = dataclasses.replace(request, reference=reference)
                generation = await self._generator.open(request, stream_id)
            except Refusal:
                raise
            except SourceUnavailable as failure:
                raise Refusal("UNAVAILABLE", str(failure)) from None
            except Exception:
                log.exception("stream %s: opening failed", stream_id)
                self.metrics.errors.labels(kind="internal").inc()
                raise Refusal("INTERNAL", f"internal server error (logged with stream id {stream_id})") from None
        session = StreamSession(
            stream_id,
            request,
            generation,
            parsed.schedule,
            start.client_request_id,
            principal=caller,
            resume_window_s=self.limits.resume_window_s if start.resumable else 0.0,
            retained_chunks=self.limits.resume_retained_chunks,
            metrics=self.metrics,
            received_at=received_at,
        )
        self.sessions[stream_id] = session
        session.start(self._generator.codec)
        self.metrics.started.inc()
        self.metrics.active.set(len(self.sessions))
        log.info(
            "stream %s started (client_request_id=%r, %d chars)",
            stream_id,
            start.client_request_id,
            len(request.text_so_far),
        )
        return session, 0

    async def _decode_reference(self, audio: bytes):
        try:
            return await asyncio.to_thread(decode_reference_audio, audio, self.limits)
        except ReferenceAudioError as error:
            raise invalid(str(error)) from None

    async def _resume(self, resume: pb.Resume, context) -> tuple[StreamSession, int]:
        size = len(resume.stream_id.encode())
        if size > MAX_STREAM_ID_BYTES:
            raise invalid(f"resume.stream_id is {size} bytes, the limit is {MAX_STREAM_ID_BYTES}")
        session = self.sessions.get(resume.stream_id)
        # Another principal's stream is reported exactly like an unknown one: ids must not leak.
        if session is None or not session.resumable or session.principal != self._caller(context):
            raise Refusal(
                "NOT_FOUND",
                f"no resumable stream {preview(resume.stream_id)} on this server "
                "(expired, finished or never resumable)",
            )
        last = resume.last_acked_seq if resume.HasField("last_acked_seq") else None
        first_seq = session.check_resume(last)
        if last is not None:
            session.acknowledge(last)
        self.metrics.resumes.inc()
        log.info("stream %s resumed from seq %d", session.stream_id, first_seq)
        return session, first_seq

    async def _read_control(self, requests, session: StreamSession, attachment: Attachment) -> None:
        """Apply Cancel, Ack and TextInput as they arrive. A message the contract forbids, or one
        over its client's message rate, is noted on the attachment and ends the stream with
        End(ERROR); the call then closes with INVALID_ARGUMENT. A half-close ends a streamed text."""
        try:
            async for message in requests:
                violation = self.admission.control_message(session.principal)
                if violation is None and isinstance(message, UnreadableMessage):
                    violation = message.reason
                elif violation is None:
                    violation = await self._apply(message, session)
                if violation is None:
                    continue
                # Noted before the stop: the End it causes may reach the client before stop() returns.
                attachment.violation = violation
                if not attachment.superseded:
                    await session.stop(pb.END_REASON_ERROR, f"protocol violation: {violation}")
                return
            session.end_text_input()
        except (asyncio.CancelledError, grpc.RpcError, grpc.aio.UsageError):
            pass  # the call is over; the handler decides what happens to the session

    @staticmethod
    async def _apply(message: pb.SynthesizeRequest, session: StreamSession) -> str | None:
        """Apply one message that follows the first; the violation it is, where the contract forbids it."""
        kind = message.WhichOneof("kind")
        if kind == "cancel":
            await session.stop(pb.END_REASON_CANCELLED, "cancelled by the client", message.cancel.played_frames)
        elif kind == "ack":
            session.acknowledge(message.ack.seq)
        elif kind == "text":
            try:
                session.push_text(message.text.text, message.text.flush, message.text.end_of_input)
            except TextInputViolation as error:
                return str(error)
        else:
            return f"{kind or 'an empty message'} after the first message: only cancel, ack and text may follow"
        return None

    def _expire(self, session: StreamSession, why: str) -> None:
        """No client came back for a detached stream: stop it and forget it."""

        async def stop_and_forget() -> None:
            await session.stop(pb.END_REASON_CANCELLED, why)
            if not session.attached:
                self._forget(session)

        self._in_background(stop_and_forget())

    def _in_background(self, work) -> None:
        """Run `work` without waiting for it; the loop keeps only weak references to tasks, so it is
        held until it is done."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _forget(self, session: StreamSession) -> None:
        if self.sessions.get(session.stream_id) is session:
            del self.sessions[session.stream_id]
        self.metrics.active.set(len(self.sessions))

    async def _refuse(self, context, requests, refusal: Refusal) -> None:
        """Refuse a Synthesize call before its Header: the handler returns with this status set.
        Not context.abort: the AbortError it raises is kept by the call's state in a reference
        cycle with the handler's frames, which held the request (up to 8.5 MB) until a full
        collection, and full collections are rare once the engine's objects are frozen (app.py)."""
        count_refusal(self.metrics, refusal)
        await self._wait_for_half_close(requests)
        set_status(context, refusal.status, refusal.message)

    async def drain(self, grace_s: float) -> None:
        """Refuse new streams, let running ones finish for `grace_s`, then end them with ERROR."""
        self.set_unavailable(SHUTTING_DOWN)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while any(not s.finished for s in self.sessions.values()) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await self.stop_streams(pb.END_REASON_ERROR, "server shutting down")


async def _discard(requests, at_most: int) -> None:
    """Read and drop up to `at_most` messages, or until the client half-closes."""
    async for _ in requests:
        at_most -= 1
        if at_most <= 0:
            return

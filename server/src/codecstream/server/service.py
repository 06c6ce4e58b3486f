"""The codecstream.v1 SynthesisService over any CodeSource (grpc.aio)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator

import grpc
from codecstream.server import __version__
from codecstream.server.auth import bearer_token, token_identity
from codecstream.server.limits import RateLimiter, ServerLimits
from codecstream.server.metrics import Metrics
from codecstream.server.request_parsing import TASK_TYPE_ENUMS, parse_start
from codecstream.server.session import ResumeUnavailable, StreamSession
from codecstream.server.source import CodeSource, RequestRejected
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc

log = logging.getLogger(__name__)


class ProtocolViolation(Exception):
    """A client message the contract forbids at this point of the stream."""


class SynthesisService(synthesis_pb2_grpc.SynthesisServiceServicer):
    def __init__(self, source: CodeSource, limits: ServerLimits | None = None, metrics: Metrics | None = None) -> None:
        limits = limits or ServerLimits()
        self.source = source
        self.limits = limits
        self.metrics = metrics or Metrics()
        self.sessions: dict[str, StreamSession] = {}
        self._rate_limiter = RateLimiter(limits.streams_per_client_per_minute)
        self._draining = False
        self._background: set[asyncio.Task] = set()

    # -- unary -------------------------------------------------------------------------------

    async def GetCodecInfo(self, request: pb.GetCodecInfoRequest, context) -> pb.GetCodecInfoResponse:
        return pb.GetCodecInfoResponse(
            codec=self.source.codec,
            model=self.source.model_name,
            server_version=__version__,
            languages=self.source.languages(),
            task_types=[TASK_TYPE_ENUMS[t] for t in self.source.supported_task_types()],
            max_text_chars=self.limits.max_text_chars,
            max_frames=self.limits.max_frames,
            default_chunking=self.limits.default_chunking.to_policy(),
            resume_window_ms=int(self.limits.resume_window_s * 1000),
        )

    async def ListVoices(self, request: pb.ListVoicesRequest, context) -> pb.ListVoicesResponse:
        return pb.ListVoicesResponse(
            voices=[
                pb.Voice(name=v.name, description=v.description, languages=v.languages) for v in self.source.voices()
            ]
        )

    # -- streaming ---------------------------------------------------------------------------

    async def Synthesize(
        self, request_iterator, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.SynthesizeResponse]:
        requests = request_iterator.__aiter__()
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            await self._reject(
                context, "INVALID_ARGUMENT", "the client closed the stream without a Start or Resume message"
            )
        kind = first.WhichOneof("kind")
        if kind == "start":
            session, first_seq = await self._open(first.start, context)
        elif kind == "resume":
            session, first_seq = await self._resume(first.resume, context)
        else:
            await self._reject(
                context, "INVALID_ARGUMENT", f"first message must be start or resume, got {kind or 'an empty message'}"
            )

        violation: list[str] = []
        violated = asyncio.Event()
        reader = asyncio.create_task(self._read_control(requests, session, violation, violated))
        delivered_end = False
        try:
            async for response in session.follow(first_seq, violated):
                yield response
                delivered_end = response.HasField("end")
        finally:
            reader.cancel()
            if delivered_end:
                self._forget(session)
            elif violation:
                await session.stop(pb.END_REASON_ERROR, f"protocol violation: {violation[0]}")
                self._forget(session)
            else:
                # The connection went away before End: a resumable stream waits for its client.
                session.detach(self.limits.resume_window_s, lambda: self._expire(session))
        if violation:
            await self._reject(context, "INVALID_ARGUMENT", violation[0])

    async def _open(self, start: pb.Start, context) -> tuple[StreamSession, int]:
        if self._draining:
            await self._reject(context, "UNAVAILABLE", "server is shutting down; retry on another replica")
        try:
            request, schedule = parse_start(start, self.source, self.limits)
        except RequestRejected as rejection:
            await self._reject(context, rejection.status, rejection.message)
        active = sum(1 for s in self.sessions.values() if not s.finished)
        if active >= self.limits.max_concurrent_streams:
            await self._reject(
                context,
                "RESOURCE_EXHAUSTED",
                f"server is at its limit of {self.limits.max_concurrent_streams} concurrent streams",
            )
        client = self._client_identity(context)
        wait_s = self._rate_limiter.try_acquire(client)
        if wait_s:
            await self._reject(
                context,
                "RESOURCE_EXHAUSTED",
                f"client {client} exceeded {self.limits.streams_per_client_per_minute} streams per minute; "
                f"retry in {wait_s:.1f} s",
            )
        stream_id = uuid.uuid4().hex
        try:
            code_stream = await self.source.open(request, stream_id)
        except RequestRejected as rejection:
            await self._reject(context, rejection.status, rejection.message)
        session = StreamSession(
            stream_id,
            code_stream,
            schedule,
            request.max_frames,
            start.client_request_id,
            resumable=start.resumable and self.limits.resume_window_s > 0,
            retained_chunks=self.limits.resume_retained_chunks,
            metrics=self.metrics,
        )
        self.sessions[stream_id] = session
        session.attach()
        session.start(self.source.codec)
        self.metrics.started.inc()
        self.metrics.active.set(len(self.sessions))
        log.info(
            "stream %s started (client_request_id=%r, %d chars)", stream_id, start.client_request_id, len(request.text)
        )
        return session, 0

    async def _resume(self, resume: pb.Resume, context) -> tuple[StreamSession, int]:
        session = self.sessions.get(resume.stream_id)
        if session is None or not session.resumable:
            await self._reject(
                context,
                "NOT_FOUND",
                f"no resumable stream {resume.stream_id!r} on this server (expired, finished or never resumable)",
            )
        if session.attached:
            await self._reject(
                context, "FAILED_PRECONDITION", f"stream {resume.stream_id} is still attached to another connection"
            )
        last = resume.last_acked_seq if resume.HasField("last_acked_seq") else None
        try:
            first_seq = session.check_resume(last)
        except ResumeUnavailable as unavailable:
            await self._reject(context, unavailable.status, unavailable.message)
        session.attach()
        if last is not None:
            session.acknowledge(last)
        self.metrics.resumes.inc()
        log.info("stream %s resumed from seq %d", session.stream_id, first_seq)
        return session, first_seq

    async def _read_control(
        self, requests, session: StreamSession, violation: list[str], violated: asyncio.Event
    ) -> None:
        """Apply Cancel and Ack as they arrive; a forbidden message ends the call with INVALID_ARGUMENT."""
        try:
            async for message in requests:
                kind = message.WhichOneof("kind")
                if kind == "cancel":
                    await session.stop(pb.END_REASON_CANCELLED, "cancelled by the client", message.cancel.played_frames)
                elif kind == "ack":
                    session.acknowledge(message.ack.seq)
                else:
                    raise ProtocolViolation(
                        f"{kind or 'empty message'} after the first message: only cancel and ack may follow"
                    )
        except ProtocolViolation as error:
            violation.append(str(error))
            await session.interrupt(violated)
        except (asyncio.CancelledError, grpc.RpcError):
            pass  # the call is over; the handler decides what happens to the session

    def _expire(self, session: StreamSession) -> None:
        """No client came back for a detached stream: stop it and forget it."""

        async def stop_and_forget() -> None:
            await session.stop(pb.END_REASON_CANCELLED, "client disconnected")
            if not session.attached:
                self._forget(session)

        task = asyncio.ensure_future(stop_and_forget())
        # The loop keeps only weak references to tasks: hold it until it is done.
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _forget(self, session: StreamSession) -> None:
        self.sessions.pop(session.stream_id, None)
        self.metrics.active.set(len(self.sessions))

    def _client_identity(self, context) -> str:
        # With auth on, the (already verified) token identifies the client; else its address does.
        token = bearer_token(context.invocation_metadata())
        if token:
            return token_identity(token)
        peer = context.peer() or "unknown"
        return peer.rsplit(":", 1)[0] if peer.count(":") > 1 else peer

    async def _reject(self, context, status: str, message: str):
        self.metrics.rejected.labels(status=status.lower()).inc()
        log.info("rejected: %s %s", status, message)
        await context.abort(getattr(grpc.StatusCode, status), message)

    # -- lifecycle ---------------------------------------------------------------------------

    async def drain(self, grace_s: float) -> None:
        """Refuse new streams, let running ones finish for `grace_s`, then end them with ERROR."""
        self._draining = True
        deadline = asyncio.get_running_loop().time() + grace_s
        while any(not s.finished for s in self.sessions.values()):
            if asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(0.05)
        await asyncio.gather(
            *(
                s.stop(pb.END_REASON_ERROR, "server shutting down")
                for s in list(self.sessions.values())
                if not s.finished
            )
        )
        with contextlib.suppress(Exception):
            await self.source.close()

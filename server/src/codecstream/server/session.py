"""One synthesis stream on the server: generation, chunking, the retained chunks for Resume, End.

A session outlives its connection: generation runs in its own task and appends Chunks; a
connection follows the session from some seq on. That is what lets a client reattach (Resume)
without re-synthesis, and what makes cancel, disconnect, engine failure and shutdown one code
path: `stop()`. Whatever fails, the session decides exactly one End.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable

import numpy as np
from codecstream.protocol.chunking import ChunkSchedule
from codecstream.protocol.codes import pack_codes
from codecstream.protocol.text_timing import merge_spans, text_offset_played
from codecstream.server.metrics import Metrics
from codecstream.server.source import CodeStream, GenerationFailed, StopReason
from codecstream.server.text_stream import SegmentedCodeStream, TextInputViolation
from codecstream.v1 import synthesis_pb2 as pb
from google.protobuf import timestamp_pb2

log = logging.getLogger(__name__)

#: How long a stop waits for the generator to wind down (the engine's last step, its abort
#: acknowledgement) before it gives up on it; a healthy engine takes one step (tens of ms).
STOP_WAIT_S = 2.0


class ResumeUnavailable(Exception):
    """A Resume that cannot be served; `status` is the gRPC status code name."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclasses.dataclass
class StopRequest:
    reason: int
    message: str = ""
    played_frames: int = 0


class Attachment:
    """One connection following a session: `superseded` once a Resume on another call takes over,
    `violation` once its client sent something the contract forbids."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()
        self.superseded = False
        self.violation: str | None = None


class StreamSession:
    def __init__(
        self,
        stream_id: str,
        code_stream: CodeStream,
        schedule: ChunkSchedule,
        client_request_id: str,
        principal: str,
        resumable: bool,
        retained_chunks: int,
        metrics: Metrics,
        text_so_far: Callable[[], str] = str,
    ) -> None:
        self.stream_id = stream_id
        #: Who started the stream: only they may resume it.
        self.principal = principal
        self.resumable = resumable
        self._code_stream = code_stream
        self._schedule = schedule
        self._max_frames = code_stream.max_frames
        self._retained_limit = retained_chunks
        self._metrics = metrics
        #: The text received so far (it grows for streamed text).
        self._text = text_so_far
        #: (first_frame, num_frames, text_start, text_end) of every chunk, for End.text_offset_played.
        self._chunk_spans: list[tuple[int, int, int, int]] = []
        self._started = time.monotonic()
        started_at = timestamp_pb2.Timestamp()
        started_at.GetCurrentTime()
        reference = code_stream.reference_codes
        self.header = pb.Header(
            stream_id=stream_id,
            reference_codes=pack_codes(reference) if len(reference) else b"",
            reference_frames=len(reference),
            client_request_id=client_request_id,
            started_at=started_at,
            max_frames=self._max_frames,
        )
        #: Chunks not yet dropped: unsent ones always, sent ones until acked (resumable streams).
        self._chunks: collections.deque[pb.Chunk] = collections.deque()
        self._next_seq = 0
        self._frames_sent_in_chunks = 0
        self._first_frame_us = 0
        self._last_sent_seq = -1
        self._stop: StopRequest | None = None
        self._frames_after_stop = 0
        self.end: pb.End | None = None
        self._changed = asyncio.Condition()
        self._task: asyncio.Task | None = None
        self._attachment: Attachment | None = None
        self._detach_timer: asyncio.TimerHandle | None = None

    # -- generation --------------------------------------------------------------------------

    def start(self, codec) -> None:
        self.header.codec.CopyFrom(codec)
        self._task = asyncio.create_task(self._generate(), name=f"generate-{self.stream_id}")

    def _elapsed_us(self) -> int:
        return int((time.monotonic() - self._started) * 1e6)

    async def _generate(self) -> None:
        reason, message = pb.END_REASON_EOS, ""
        try:
            reason = await self._chunk_frames()
        except asyncio.CancelledError:
            pass  # stop() gave up waiting for the generator; the stop request says why
        except GenerationFailed as error:
            log.warning("stream %s: generation failed: %s", self.stream_id, error)
            reason, message = pb.END_REASON_ERROR, f"generation failed: {error}"
            self._metrics.errors.labels(kind="generation").inc()
        except Exception:  # a bug: the client gets End(ERROR) and the log the traceback, not a hang
            log.exception("stream %s: generation failed", self.stream_id)
            reason, message = pb.END_REASON_ERROR, f"internal server error (logged with stream id {self.stream_id})"
            self._metrics.errors.labels(kind="internal").inc()
        finally:
            await self._abort_generator()
            if self._stop is not None:
                reason, message = self._stop.reason, self._stop.message
                self._metrics.frames_after_stop.observe(self._frames_after_stop + self._code_stream.frames_after_abort)
            await self._finish(reason, message)

    async def _chunk_frames(self) -> int:
        """Group generated frames into chunks until the generator ends; return the End reason."""
        sizes = iter(self._schedule)
        target = next(sizes)
        pending: list[np.ndarray] = []
        pending_frames = 0
        total = 0
        last_step = None
        async for frames in self._code_stream:
            if not len(frames):  # a segment of streamed text ended: its frames get their own chunk
                if pending_frames and self._stop is None:
                    await self._emit(np.concatenate(pending))
                    pending, pending_frames = [], 0
                    target = next(sizes)
                continue
            if self._stop is not None:
                # Generated after the stop was asked for: never sent, counted.
                self._frames_after_stop += len(frames)
                continue
            now = time.monotonic()
            if last_step is not None:
                self._metrics.step_interval.observe(now - last_step)
            last_step = now
            if total == 0 and len(frames):
                self._first_frame_us = self._elapsed_us()
                self._metrics.time_to_first_frame.observe(self._first_frame_us / 1e6)
            frames = frames[: self._max_frames - total]
            total += len(frames)
            pending.append(frames)
            pending_frames += len(frames)
            while pending_frames >= target:
                block = np.concatenate(pending)
                await self._emit(block[:target])
                rest = block[target:]
                pending, pending_frames = ([rest] if len(rest) else []), len(rest)
                target = next(sizes)
            if total >= self._max_frames:
                break
        if pending_frames:
            await self._emit(np.concatenate(pending))
        if total >= self._max_frames:
            return pb.END_REASON_MAX_FRAMES
        if self._code_stream.stop_reason is StopReason.MAX_FRAMES:
            # The engine stopped at its length limit before the announced budget: the budget
            # was computed wrongly, and saying MAX_FRAMES would be a false reason.
            raise GenerationFailed(f"the engine stopped at its length limit after {total} of {self._max_frames} frames")
        return pb.END_REASON_EOS

    async def _emit(self, codes: np.ndarray) -> None:
        text_start, text_end = self._code_stream.text_span() or (0, len(self._text()))
        self._chunk_spans.append((self._frames_sent_in_chunks, len(codes), text_start, text_end))
        async with self._changed:
            self._chunks.append(
                pb.Chunk(
                    seq=self._next_seq,
                    first_frame=self._frames_sent_in_chunks,
                    num_frames=len(codes),
                    codes=pack_codes(codes),
                    generated_at_us=self._elapsed_us(),
                    text_start=text_start,
                    text_end=text_end,
                )
            )
            self._next_seq += 1
            self._frames_sent_in_chunks += len(codes)
            self._changed.notify_all()
        self._metrics.frames.inc(len(codes))

    async def _finish(self, reason: int, message: str) -> None:
        played = self._stop.played_frames if self._stop else 0
        spans = merge_spans(self._chunk_spans)
        if reason == pb.END_REASON_CANCELLED:
            heard = text_offset_played(self._text(), spans, played)
            self._metrics.played_frames_at_cancel.inc(played)
            log.info("stream %s cancelled after %d played frames (%d characters heard)", self.stream_id, played, heard)
        else:
            heard = spans[-1].text_end if spans else 0
        end = pb.End(
            reason=reason,
            frames_generated=self._frames_sent_in_chunks,
            message=message,
            text_offset_played=heard,
            stats=pb.StreamStats(
                time_to_first_frame_us=self._first_frame_us,
                duration_us=self._elapsed_us(),
                chunks=self._next_seq,
                played_frames=played,
            ),
        )
        self._metrics.ended.labels(reason=pb.EndReason.Name(reason).removeprefix("END_REASON_").lower()).inc()
        async with self._changed:
            self.end = end
            self._changed.notify_all()

    async def stop(self, reason: int, message: str = "", played_frames: int = 0) -> None:
        """End the stream now (cancel, disconnect, engine failure, shutdown); returns once End is decided.

        The generator is aborted and given STOP_WAIT_S to deliver its last step, so that what it
        generated after the stop is counted; a generator that hangs is cancelled."""
        if self.end is None and self._stop is None:
            self._stop = StopRequest(reason, message, played_frames)
            await self._abort_generator()
        if self._task is None:
            return
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), STOP_WAIT_S)
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._task)

    async def _abort_generator(self) -> None:
        # abort() promises not to raise; if it does anyway, End must still be decided.
        try:
            await self._code_stream.abort()
        except Exception:
            log.exception("stream %s: aborting the generator failed", self.stream_id)
            self._metrics.errors.labels(kind="abort").inc()

    def push_text(self, text: str, flush: bool, end_of_input: bool) -> None:
        """A TextInput; TextInputViolation for one the contract forbids."""
        if not isinstance(self._code_stream, SegmentedCodeStream):
            raise TextInputViolation("text input on a stream whose Start did not set streaming_text")
        self._code_stream.push(text, flush, end_of_input)

    @property
    def finished(self) -> bool:
        return self.end is not None

    # -- connections -------------------------------------------------------------------------

    def check_resume(self, last_acked_seq: int | None) -> int:
        """The first seq a reattaching client needs; raise ResumeUnavailable if it is gone."""
        wanted = 0 if last_acked_seq is None else last_acked_seq + 1
        if wanted > self._next_seq:
            raise ResumeUnavailable(
                "OUT_OF_RANGE",
                f"stream {self.stream_id} has sent seq 0..{self._next_seq - 1}, cannot resume after {last_acked_seq}",
            )
        oldest = self._chunks[0].seq if self._chunks else self._next_seq
        if wanted < oldest:
            raise ResumeUnavailable(
                "OUT_OF_RANGE", f"stream {self.stream_id} no longer keeps seq {wanted} (oldest kept is {oldest})"
            )
        return wanted

    async def follow(self, first_seq: int, attachment: Attachment) -> AsyncIterator[pb.SynthesizeResponse]:
        """Header, the chunks from `first_seq` on as they come, then End; stops early, without End,
        once `attachment` ends (the connection is torn down or superseded)."""
        yield pb.SynthesizeResponse(header=self.header)
        next_seq = first_seq
        while True:
            async with self._changed:
                await self._changed.wait_for(
                    lambda after=next_seq: self._next_seq > after or self.end is not None or attachment.ended.is_set()
                )
                if attachment.ended.is_set():
                    return
                ready = [chunk for chunk in self._chunks if chunk.seq >= next_seq]
                # End is decided only after the last chunk is appended, so this snapshot is complete.
                end = self.end
            for chunk in ready:
                sent = pb.Chunk()
                sent.CopyFrom(chunk)
                sent.sent_at_us = self._elapsed_us()
                yield pb.SynthesizeResponse(chunk=sent)
                next_seq = chunk.seq + 1
                self._on_sent(chunk.seq)
            if end is not None:
                yield pb.SynthesizeResponse(end=end)
                return

    async def end_attachment(self, attachment: Attachment) -> None:
        """Stop `attachment`'s follow() and wake it."""
        async with self._changed:
            attachment.ended.set()
            self._changed.notify_all()

    def _on_sent(self, seq: int) -> None:
        self._last_sent_seq = max(self._last_sent_seq, seq)
        if not self.resumable:
            self.acknowledge(seq)
            return
        while len(self._chunks) > self._retained_limit and self._chunks[0].seq <= self._last_sent_seq:
            self._chunks.popleft()

    def acknowledge(self, seq: int) -> None:
        """The client decoded up to `seq`: those chunks need not be kept for Resume."""
        while self._chunks and self._chunks[0].seq <= min(seq, self._last_sent_seq):
            self._chunks.popleft()

    @property
    def retained_chunks(self) -> int:
        return len(self._chunks)

    @property
    def attached(self) -> bool:
        return self._attachment is not None

    async def attach(self) -> Attachment:
        """A connection follows the session from now on; one that followed it before is superseded."""
        if self._detach_timer is not None:
            self._detach_timer.cancel()
            self._detach_timer = None
        previous, self._attachment = self._attachment, Attachment()
        if previous is not None:
            previous.superseded = True
            await self.end_attachment(previous)
        return self._attachment

    def detach(self, attachment: Attachment, window_s: float, on_expiry) -> None:
        """`attachment`'s connection went away. A resumable stream waits `window_s` for a Resume;
        a superseded attachment changes nothing (another connection follows the session)."""
        if attachment is not self._attachment:
            return
        self._attachment = None
        if self.resumable and window_s > 0:
            self._detach_timer = asyncio.get_running_loop().call_later(window_s, on_expiry)
        else:
            on_expiry()

"""One synthesis stream on the server: generation, End; its frames are cut into chunks by a
ChunkCutter, and the chunks wait for the client in a ChunkLog.

A session outlives its connection: generation runs in its own task and appends Chunks; a
connection follows the session from some seq on. That is what lets a client reattach (Resume)
without re-synthesis, and what makes cancel, disconnect, engine failure and shutdown one code
path: `stop()`. The session is a small state machine (`Phase`, drawn as a table in
docs/architecture.md), and `decide_end` is the one place that turns what happened into End.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import time

from codecstream.protocol.chunking import ChunkSchedule
from codecstream.protocol.codes import pack_codes
from codecstream.protocol.text_timing import WordClock
from codecstream.server.chunk_cutting import ChunkCutter, ChunkFrames
from codecstream.server.chunk_log import ChunkLog
from codecstream.server.errors import GenerationFailed, TextInputExpired, TextInputViolation
from codecstream.server.limits import milliseconds
from codecstream.server.metrics import Metrics
from codecstream.server.request import SynthesisRequest
from codecstream.server.source import Finished, FinishReason, Frames, Generation, SegmentEnd
from codecstream.v1 import synthesis_pb2 as pb
from google.protobuf import timestamp_pb2

log = logging.getLogger(__name__)

#: How long a stop waits for the generator to wind down (the engine's last step, its abort
#: acknowledgement) before it gives up on it; a healthy engine takes one step (tens of ms).
STOP_WAIT_S = 2.0


class Phase(enum.Enum):
    #: Created with its Header; generation not started yet.
    OPENED = "opened"
    #: Frames are chunked and appended as the generation yields them.
    GENERATING = "generating"
    #: A stop was asked for (cancel, disconnect, violation, engine failure, shutdown): the
    #: generation is aborted; what it still yields is counted, never sent.
    STOPPING = "stopping"
    #: End is decided; nothing changes any more.
    ENDED = "ended"


@dataclasses.dataclass(frozen=True)
class StopRequest:
    reason: int
    message: str = ""
    played_frames: int = 0


@dataclasses.dataclass(frozen=True)
class Failure:
    """Generation failed; `message` is End.message."""

    message: str


@dataclasses.dataclass(frozen=True)
class BudgetReached:
    """Header.max_frames frames were sent."""


#: What ended a generation, as `decide_end` weighs it; None: stop() gave up waiting for it.
Outcome = Finished | Failure | BudgetReached | None


class Attachment:
    """One connection following a session: `superseded` once a Resume on another call takes over,
    `violation` once its client sent something the contract forbids."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()
        self.superseded = False
        self.violation: str | None = None


def decide_end(stop: StopRequest | None, outcome: Outcome, frames_sent: int, max_frames: int) -> tuple[int, str]:
    """End's reason and message, from the stop asked for (if any) and how generation ended."""
    if stop is not None:
        return stop.reason, stop.message
    if isinstance(outcome, Failure):
        return pb.END_REASON_ERROR, outcome.message
    if isinstance(outcome, BudgetReached):
        return pb.END_REASON_MAX_FRAMES, ""
    if isinstance(outcome, Finished) and outcome.reason is FinishReason.EOS:
        return pb.END_REASON_EOS, ""
    if isinstance(outcome, Finished) and outcome.reason is FinishReason.LENGTH:
        # The generator stopped at its length limit before the announced budget: the budget
        # was computed wrongly, and saying MAX_FRAMES would be a false reason.
        return pb.END_REASON_ERROR, (
            f"generation failed: the engine stopped at its length limit after {frames_sent} of {max_frames} frames"
        )
    return pb.END_REASON_ERROR, "generation failed: the engine ended the request unasked"


def _header(stream_id: str, generation: Generation, client_request_id: str, started: float, resume_window_s: float):
    """The stream's Header (its codec is set when it starts); `started`: its clock's zero (time.monotonic())."""
    started_at = timestamp_pb2.Timestamp()
    started_at.FromNanoseconds(time.time_ns() - round((time.monotonic() - started) * 1e9))
    reference = generation.reference_codes
    return pb.Header(
        stream_id=stream_id,
        reference_codes=pack_codes(reference) if len(reference) else b"",
        reference_frames=len(reference),
        client_request_id=client_request_id,
        started_at=started_at,
        max_frames=generation.max_frames,
        resume_window_ms=milliseconds(resume_window_s),
    )


class StreamSession:
    def __init__(
        self,
        stream_id: str,
        request: SynthesisRequest,
        generation: Generation,
        schedule: ChunkSchedule,
        client_request_id: str,
        principal: str,
        resume_window_s: float,
        retained_chunks: int,
        metrics: Metrics,
        received_at: float | None = None,
    ) -> None:
        """`received_at`: when the server received the Start (time.monotonic()); the stream's clock
        starts there, so its time to first frame counts the request's opening (default: now)."""
        self.stream_id = stream_id
        #: Who started the stream: only they may resume it.
        self.principal = principal
        #: How long the stream waits for a Resume once its connection is gone; 0: not resumable.
        self.resume_window_s = resume_window_s
        self.phase = Phase.OPENED
        self._request = request
        self._generation = generation
        self._schedule = schedule
        self._max_frames = generation.max_frames
        self._metrics = metrics
        #: The words of the chunks sent, as the client times them: End.text_offset_played.
        self._words = WordClock()
        self._text_spoken_to = 0
        self._started = time.monotonic() if received_at is None else received_at
        self.header = _header(stream_id, generation, client_request_id, self._started, resume_window_s)
        self._chunk_log = ChunkLog(stream_id, resumable=resume_window_s > 0, retained_limit=retained_chunks)
        self._frames_sent = 0
        self._first_frame_us = 0
        self._stop: StopRequest | None = None
        self._frames_after_stop = 0
        self.end: pb.End | None = None
        self._changed = asyncio.Condition()
        self._task: asyncio.Task | None = None
        self._attachment: Attachment | None = None
        self._detach_timer: asyncio.TimerHandle | None = None

    @property
    def resumable(self) -> bool:
        return self.resume_window_s > 0

    @property
    def finished(self) -> bool:
        return self.phase is Phase.ENDED

    # -- generation --------------------------------------------------------------------------

    def start(self, codec) -> None:
        self.header.codec.CopyFrom(codec)
        self.phase = Phase.GENERATING
        self._task = asyncio.create_task(self._generate(), name=f"generate-{self.stream_id}")

    def _elapsed_us(self) -> int:
        return int((time.monotonic() - self._started) * 1e6)

    async def _generate(self) -> None:
        outcome: Outcome = None
        try:
            outcome = await self._chunk_frames()
        except asyncio.CancelledError:
            pass  # stop() gave up waiting for the generator; the stop request says why
        except TextInputExpired as error:
            log.info("stream %s: %s", self.stream_id, error)
            outcome = Failure(str(error))
        except GenerationFailed as error:
            log.warning("stream %s: generation failed: %s", self.stream_id, error)
            outcome = Failure(f"generation failed: {error}")
            self._metrics.errors.labels(kind="generation").inc()
        except Exception:  # a bug: the client gets End(ERROR) and the log the traceback, not a hang
            log.exception("stream %s: generation failed", self.stream_id)
            outcome = Failure(f"internal server error (logged with stream id {self.stream_id})")
            self._metrics.errors.labels(kind="internal").inc()
        finally:
            await self._abort_generation()
            if self._stop is not None:
                self._metrics.frames_after_stop.observe(self._frames_after_stop)
            await self._finish(*decide_end(self._stop, outcome, self._frames_sent, self._max_frames))

    async def _chunk_frames(self) -> Finished | BudgetReached:
        """Cut the generation's frames into chunks until it finishes or the budget is sent."""
        cutter = ChunkCutter(self._schedule)
        generated = 0
        last_step = None
        async for event in self._generation:
            if isinstance(event, Finished):
                if self._stop is None and (rest := cutter.rest()) is not None:
                    await self._emit(rest)
                return event
            if self._stop is not None:
                if isinstance(event, Frames):  # generated after the stop was asked for: counted, never sent
                    self._frames_after_stop += len(event.codes)
                continue
            if isinstance(event, SegmentEnd):
                # Frames of two segments never share a chunk (chunk_cutting.py).
                if (rest := cutter.segment_end()) is not None:
                    await self._emit(rest)
                continue
            now = time.monotonic()
            if last_step is not None:
                self._metrics.step_interval.observe(now - last_step)
            last_step = now
            if generated == 0:
                self._first_frame_us = self._elapsed_us()
                self._metrics.time_to_first_frame.observe(self._first_frame_us / 1e6)
            codes = event.codes[: self._max_frames - generated]
            generated += len(codes)
            for chunk in cutter.add(dataclasses.replace(event, codes=codes)):
                await self._emit(chunk)
            if generated >= self._max_frames:
                if (rest := cutter.rest()) is not None:
                    await self._emit(rest)
                return BudgetReached()
        raise GenerationFailed("the generator ended without saying why")

    async def _emit(self, frames: ChunkFrames) -> None:
        codes = frames.codes
        self._words.add(
            self._request.text_so_far,
            self._frames_sent,
            len(codes),
            frames.text_start,
            frames.text_end,
            frames.ends_text_span,
            text_complete=self._request.streamed_text is None or self._request.streamed_text.ended,
        )
        self._text_spoken_to = frames.text_end
        async with self._changed:
            self._chunk_log.append(
                pb.Chunk(
                    first_frame=self._frames_sent,
                    num_frames=len(codes),
                    codes=pack_codes(codes),
                    generated_at_us=self._elapsed_us(),
                    text_start=frames.text_start,
                    text_end=frames.text_end,
                    ends_text_span=frames.ends_text_span,
                )
            )
            self._frames_sent += len(codes)
            self._changed.notify_all()
        self._metrics.frames.inc(len(codes))

    async def _finish(self, reason: int, message: str) -> None:
        played = self._stop.played_frames if self._stop else 0
        if reason == pb.END_REASON_CANCELLED:
            heard = self._words.heard(played)
            self._metrics.played_frames_at_cancel.inc(played)
            log.info("stream %s cancelled after %d played frames (%d characters heard)", self.stream_id, played, heard)
        else:
            heard = self._text_spoken_to
        end = pb.End(
            reason=reason,
            frames_generated=self._frames_sent,
            message=message,
            text_offset_played=heard,
            stats=pb.StreamStats(
                time_to_first_frame_us=self._first_frame_us,
                duration_us=self._elapsed_us(),
                chunks=self._chunk_log.next_seq,
                played_frames=played,
            ),
        )
        self._metrics.ended.labels(reason=pb.EndReason.Name(reason).removeprefix("END_REASON_").lower()).inc()
        async with self._changed:
            self.end = end
            self.phase = Phase.ENDED
            self._changed.notify_all()

    async def stop(self, reason: int, message: str = "", played_frames: int = 0) -> None:
        """End the stream now (cancel, disconnect, engine failure, shutdown); returns once End is decided.

        The generation is aborted and given STOP_WAIT_S to deliver its last step, so that what it
        generated after the stop is counted; a generator that hangs is cancelled. A stream stopped
        before it started ends at once with the stop's reason, and its generation is aborted."""
        if self.phase in (Phase.OPENED, Phase.GENERATING):
            started = self.phase is Phase.GENERATING
            self.phase = Phase.STOPPING
            self._stop = StopRequest(reason, message, played_frames)
            await self._abort_generation()
            if not started:  # no generation task will decide End
                await self._finish(reason, message)
        if self._task is None:
            return
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), STOP_WAIT_S)
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._task)

    async def _abort_generation(self) -> None:
        # abort() promises not to raise; if it does anyway, End must still be decided.
        try:
            await self._generation.abort()
        except Exception:
            log.exception("stream %s: aborting the generator failed", self.stream_id)
            self._metrics.errors.labels(kind="abort").inc()

    def push_text(self, text: str, flush: bool, end_of_input: bool) -> None:
        """A TextInput; TextInputViolation for one the contract forbids."""
        streamed = self._request.streamed_text
        if streamed is None:
            raise TextInputViolation("text input on a stream whose Start did not set streaming_text")
        streamed.push(text, flush, end_of_input)

    def end_text_input(self) -> None:
        """The client half-closed: a streamed text that has not ended cannot grow any more."""
        streamed = self._request.streamed_text
        if streamed is not None and not streamed.ended:
            streamed.push("", flush=False, end_of_input=True)

    # -- connections -------------------------------------------------------------------------

    def check_resume(self, last_acked_seq: int | None) -> int:
        """The first seq a reattaching client needs; raise Refusal(OUT_OF_RANGE) if it is gone."""
        return self._chunk_log.first_to_resend(last_acked_seq)

    async def follow(self, first_seq: int, attachment: Attachment):
        """Header, the chunks from `first_seq` on as they come, then End; stops early, without End,
        once `attachment` ends (the connection is torn down or superseded)."""
        yield pb.SynthesizeResponse(header=self.header)
        next_seq = first_seq
        while True:
            async with self._changed:
                await self._changed.wait_for(
                    lambda after=next_seq: (
                        self._chunk_log.next_seq > after or self.end is not None or attachment.ended.is_set()
                    )
                )
                if attachment.ended.is_set():
                    return
                ready = self._chunk_log.since(next_seq)
                # End is decided only after the last chunk is appended, so this snapshot is complete.
                end = self.end
            for chunk in ready:
                sent = pb.Chunk()
                sent.CopyFrom(chunk)
                sent.sent_at_us = self._elapsed_us()
                yield pb.SynthesizeResponse(chunk=sent)
                next_seq = chunk.seq + 1
                self._chunk_log.sent(chunk.seq)
            if end is not None:
                yield pb.SynthesizeResponse(end=end)
                return

    async def end_attachment(self, attachment: Attachment) -> None:
        """Stop `attachment`'s follow() and wake it."""
        async with self._changed:
            attachment.ended.set()
            self._changed.notify_all()

    def acknowledge(self, seq: int) -> None:
        """The client decoded up to `seq`: those chunks need not be kept for Resume."""
        self._chunk_log.acknowledge(seq)

    @property
    def retained_chunks(self) -> int:
        return len(self._chunk_log)

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

    def detach(self, attachment: Attachment, on_expiry) -> None:
        """`attachment`'s connection went away. A resumable stream waits its resume window for a
        Resume; a superseded attachment changes nothing (another connection follows the session)."""
        if attachment is not self._attachment:
            return
        self._attachment = None
        if self.resumable:
            self._detach_timer = asyncio.get_running_loop().call_later(self.resume_window_s, on_expiry)
        else:
            on_expiry()

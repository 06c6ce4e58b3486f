"""Between decode and the speaker: absorbs arrival jitter and decode-time spikes.

The decoder thread pushes PCM as chunks are decoded; the audio callback pulls fixed blocks. Play
starts once `playout_delay_s` of audio is buffered (or the stream has ended). The delay is chosen
from what is measured — how long decoding takes per second of audio, and how late chunks arrive
against their real-time schedule — and from the chunk schedule the stream follows: while chunks
grow (a ramp), the next one takes longer to decode than the audio before it lasts, so the buffer
must already hold the difference. It grows after an underrun, so a slow device buffers more and a
fast one starts sooner.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import threading

import numpy as np
from codecstream.protocol.chunking import ChunkSchedule
from codecstream.protocol.decoding import FRAME_SECONDS, SAMPLE_RATE_HZ

#: Added to the measured need: scheduling noise of the audio callback and the decode thread.
SAFETY_MARGIN_S = 0.02
MAX_PLAYOUT_DELAY_S = 1.0
#: The predicted decode time of a coming chunk is scaled by this: calls of one size vary by 10-30%
#: on shared cores (artifact_bench.json: p90 over median 1.1-1.3).
DECODE_HEADROOM = 1.2


@dataclasses.dataclass
class JitterStats:
    playout_delay_s: float = 0.0
    underruns: int = 0
    stall_s: float = 0.0
    dropped_s: float = 0.0
    played_s: float = 0.0


class JitterBuffer:
    """`schedule`: the chunk sizes the stream brings (the server's default ramp unless the request
    asked for another); `playout_delay_s`: a fixed delay instead of the measured one."""

    def __init__(self, sample_rate: int = SAMPLE_RATE_HZ, playout_delay_s: float | None = None,
                 schedule: ChunkSchedule | None = None) -> None:  # fmt: skip
        self.sample_rate = sample_rate
        self._fixed_delay = playout_delay_s
        self._schedule = schedule or ChunkSchedule()
        self._chunks = 0
        self._underrun_floor_s = 0.0
        self._blocks: collections.deque[np.ndarray] = collections.deque()
        self._offset = 0  # samples of _blocks[0] already played
        self._buffered = 0
        self._lock = threading.Lock()
        self._started = False
        self._ended = False
        self._in_underrun = False
        self._decode_s: list[float] = []
        self._audio_s: list[float] = []
        self._arrived_s: list[float | None] = []
        self._first_arrival_s: float | None = None
        self._pushed = 0
        self._lateness_s: list[float] = []
        self.stats = JitterStats(playout_delay_s=playout_delay_s or 0.0)

    # -- producer (decode thread) --------------------------------------------------------------

    def push(self, samples: np.ndarray, decode_s: float = 0.0, arrived_s: float | None = None) -> None:
        """Queue decoded samples; `decode_s` is what decoding them took, `arrived_s` when their chunk
        arrived (any clock, seconds). Lateness is measured against a real-time schedule that starts
        with the first chunk's arrival: chunk k is due when the audio before it would have played."""
        with self._lock:
            lateness_s = 0.0
            if arrived_s is not None:
                if self._first_arrival_s is None:
                    self._first_arrival_s = arrived_s
                lateness_s = max(0.0, arrived_s - self._first_arrival_s - self._pushed / self.sample_rate)
            self._pushed += len(samples)
            self._chunks += 1
            self._audio_s.append(len(samples) / self.sample_rate)
            self._arrived_s.append(arrived_s)
            self._blocks.append(np.asarray(samples, dtype=np.float32))
            self._buffered += len(samples)
            self._decode_s.append(decode_s)
            self._lateness_s.append(lateness_s)
            if self._fixed_delay is None:
                # The estimate may shrink as chunks of more sizes show the decoder's cost; never
                # below what an underrun taught.
                self.stats.playout_delay_s = max(self._underrun_floor_s, self._estimated_need())

    def end_of_stream(self) -> None:
        with self._lock:
            self._ended = True

    def _estimated_need(self) -> float:
        jitter = statistics.pstdev(self._lateness_s) if len(self._lateness_s) > 1 else 0.0
        lateness = max(0.0, max(self._lateness_s))
        return min(MAX_PLAYOUT_DELAY_S, self._decode_need() + lateness + 2 * jitter + SAFETY_MARGIN_S)

    def _decode_need(self) -> float:
        """Audio that must be buffered now for the chunks still to come to be decoded in time.

        Chunk m after the ones pushed is ready when it has arrived (a chunk is sent once all its
        frames are made, at the pace the arrivals so far show) and the decoder has decoded it after
        the chunks before it; it must play when the buffer and the chunks before m have played. The
        need is the largest difference. Without arrival times, chunks count as already there.
        """
        fixed_s, per_audio_s = self._decode_model()
        if per_audio_s >= 1.0:
            return MAX_PLAYOUT_DELAY_S  # the decoder falls behind whatever the chunks: buffer the most
        last_arrival, pace = self._arrived_s[-1], self._arrival_pace()
        now = (last_arrival or 0.0) + self._decode_s[-1]
        need, free, ahead, coming = max(self._decode_s[-8:]), now, 0.0, 0.0
        for frames in self._upcoming_frames():
            audio = frames * FRAME_SECONDS
            coming += audio
            start = free if last_arrival is None else max(free, last_arrival + coming / pace)
            free = start + DECODE_HEADROOM * (fixed_s + per_audio_s * audio)
            need = max(need, free - now - ahead)
            ahead += audio
        return need

    def _arrival_pace(self) -> float:
        """Seconds of audio that arrive per second, from the arrivals after the first (the first
        waited for the request); real time until a second chunk has come."""
        arrivals = [(at, audio) for at, audio in zip(self._arrived_s, self._audio_s, strict=True) if at is not None]
        if len(arrivals) < 2 or arrivals[-1][0] - arrivals[0][0] <= 0:
            return 1.0
        return sum(audio for _, audio in arrivals[1:]) / (arrivals[-1][0] - arrivals[0][0])

    def _decode_model(self) -> tuple[float, float]:
        """(seconds per call, seconds per audio second) fitted to the recent chunks' decode times.

        A decoder pays a fixed cost per call besides the cost per frame, so small chunks cost the
        most per second. With one chunk size seen so far, all of its time counts as per-second
        cost: an estimate that errs towards buffering more for the larger chunks to come.
        """
        decode, audio = np.array(self._decode_s[-8:]), np.array(self._audio_s[-8:])
        if np.ptp(audio) < 1e-6:
            return 0.0, float(decode.max() / max(audio.max(), 1e-6))
        per_audio_s, fixed_s = np.polyfit(audio, decode, 1)
        if per_audio_s <= 0 or fixed_s < 0:  # noise: fall back to the slowest observed rate
            return 0.0, float(np.max(decode / np.maximum(audio, 1e-6)))
        return float(fixed_s), float(per_audio_s)

    def _upcoming_frames(self) -> list[int]:
        """The sizes of the next chunks up to the schedule's first repeat of its last size: after
        that the chunks stop growing, and with rate < 1 the need only shrinks."""
        sizes = self._schedule.sizes
        return [*sizes[self._chunks :], sizes[-1]]

    # -- consumer (audio callback) -------------------------------------------------------------

    @property
    def buffered_s(self) -> float:
        return self._buffered / self.sample_rate

    @property
    def finished(self) -> bool:
        """The stream ended and everything buffered has been played."""
        return self._ended and self._buffered == 0

    def pull(self, frames: int) -> np.ndarray:
        """Exactly `frames` samples: audio, or silence while waiting (counted as a stall once playing)."""
        out = np.zeros(frames, dtype=np.float32)
        with self._lock:
            if not self._started:
                # Before the first chunk the speaker waits for the stream: not a stall (the automatic
                # delay is still 0 then).
                waiting = self._pushed == 0 or self._buffered / self.sample_rate < self.stats.playout_delay_s
                if waiting and not self._ended:
                    return out
                self._started = True
            filled = 0
            while filled < frames and self._blocks:
                block = self._blocks[0]
                take = min(frames - filled, len(block) - self._offset)
                out[filled : filled + take] = block[self._offset : self._offset + take]
                filled += take
                self._offset += take
                if self._offset == len(block):
                    self._blocks.popleft()
                    self._offset = 0
            self._buffered -= filled
            self.stats.played_s += filled / self.sample_rate
            missing = frames - filled
            if missing and not self._ended:
                self.stats.stall_s += missing / self.sample_rate
                if not self._in_underrun:
                    self.stats.underruns += 1
                    self._in_underrun = True
                    if self._fixed_delay is None:
                        # Re-buffer more next time: the measured need was too small.
                        self._underrun_floor_s = min(
                            MAX_PLAYOUT_DELAY_S, self.stats.playout_delay_s * 1.5 + SAFETY_MARGIN_S
                        )
                        self.stats.playout_delay_s = self._underrun_floor_s
                    self._started = False
            elif filled:
                self._in_underrun = False
        return out

    def clear(self) -> float:
        """Drop everything queued (barge-in); return the seconds of audio dropped."""
        with self._lock:
            dropped = self._buffered / self.sample_rate
            self._blocks.clear()
            self._offset = 0
            self._buffered = 0
            self._ended = True
            self.stats.dropped_s += dropped
        return dropped

"""Where a real-time player is in a stream's audio, judged from when its chunks were handed over.

A voice-agent framework's output transport plays what a TTS hands it in real time: the first
chunk when it arrives, each later one right after the one before, or when it arrives if the player
ran dry first. From the hand-over times alone that gives two things a plugin needs and the
framework does not tell it: the frames heard when the user barges in (Cancel.played_frames, and so
End.text_offset_played), and when a word of the audio will actually be heard once the player has
waited for late audio (a framework times words from the first audio sample and does not count
such gaps).
"""

from __future__ import annotations

import bisect

from codecstream.protocol.decoding import FRAME_SECONDS

#: Hand-over times this close to the end of the audio before count as on time (float rounding).
_SAME_INSTANT_S = 1e-6


class PlayoutClock:
    """Feed `handed(now, frames)` for every chunk given to the player, in order; times are seconds
    on any monotonic clock, the same for every call. `underruns`: the chunks that came after the
    audio before them had played out (the player ran dry, and was silent, before each)."""

    def __init__(self) -> None:
        self._audio_starts: list[float] = []  # audio time at which each handed chunk starts
        self._delays: list[float] = []  # how much later than its audio time each chunk plays
        self._playout_starts: list[float] = []
        self._audio_s = 0.0
        self._first: float | None = None
        self._playout_end = 0.0
        self.underruns = 0

    def handed(self, now: float, frames: int) -> None:
        """A chunk of `frames` frames was given to the player at `now`."""
        if self._first is None:
            self._first = self._playout_end = now
        elif now > self._playout_end + _SAME_INSTANT_S:
            self.underruns += 1
        start = max(now, self._playout_end)
        self._audio_starts.append(self._audio_s)
        self._delays.append(start - self._first - self._audio_s)
        self._playout_starts.append(start)
        self._audio_s += frames * FRAME_SECONDS
        self._playout_end = start + frames * FRAME_SECONDS

    def playout_s(self, audio_s: float) -> float:
        """When audio time `audio_s` (seconds from the stream's first frame) is heard, in seconds
        from the first audio heard: `audio_s` plus the waits for late chunks before it."""
        index = bisect.bisect_right(self._audio_starts, audio_s) - 1
        return audio_s + (self._delays[index] if index >= 0 else 0.0)

    def played_frames(self, now: float) -> int:
        """Whole frames heard by `now`: what was handed over, as far as real-time play has reached."""
        if self._first is None:
            return 0
        index = bisect.bisect_right(self._playout_starts, now) - 1
        if index < 0:
            return 0
        chunk_end = self._audio_starts[index + 1] if index + 1 < len(self._audio_starts) else self._audio_s
        heard_s = min(chunk_end, self._audio_starts[index] + now - self._playout_starts[index])
        return int(heard_s / FRAME_SECONDS + 1e-9)

    @property
    def handed_frames(self) -> int:
        return round(self._audio_s / FRAME_SECONDS)

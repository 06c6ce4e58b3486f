"""Server limits and the per-client rate limiter."""

from __future__ import annotations

import dataclasses
import time

from codecstream.protocol.chunking import ChunkSchedule


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    #: Longest Start.text, in characters.
    max_text_chars: int = 2_000
    #: Largest Start.max_frames, and the limit when it is 0 (2048 frames = 164 s of audio, the
    #: talker's own default max_new_tokens).
    max_frames: int = 2_048
    #: Streams one process serves at once.
    max_concurrent_streams: int = 1_024
    #: Streams one client (token, or peer address) may start per minute; 0: unlimited.
    streams_per_client_per_minute: int = 0
    #: How long a resumable stream waits for its client to reattach, in seconds; 0: no resume.
    resume_window_s: float = 5.0
    #: Sent chunks a resumable stream keeps for Resume beyond the last Ack.
    resume_retained_chunks: int = 512
    #: Chunking when Start.chunking is unset.
    default_chunking: ChunkSchedule = dataclasses.field(default_factory=ChunkSchedule)


class RateLimiter:
    """Token bucket per client: `per_minute` starts, refilled continuously."""

    def __init__(self, per_minute: int, clock=time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def try_acquire(self, client: str) -> float:
        """Take one start for `client`; return 0.0 on success, else the seconds until one is free."""
        if self.per_minute <= 0:
            return 0.0
        now = self._clock()
        tokens, stamp = self._buckets.get(client, (float(self.per_minute), now))
        tokens = min(float(self.per_minute), tokens + (now - stamp) * self.per_minute / 60.0)
        if tokens < 1.0:
            self._buckets[client] = (tokens, now)
            return (1.0 - tokens) * 60.0 / self.per_minute
        self._buckets[client] = (tokens - 1.0, now)
        return 0.0

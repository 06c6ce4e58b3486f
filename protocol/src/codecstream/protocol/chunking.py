"""Chunk schedules: how many frames go into each Chunk (a small first chunk, then a ramp)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

from codecstream.protocol.errors import ChunkingError
from codecstream.v1 import synthesis_pb2

#: One frame (80 ms) starts audio earliest; the ramp stops growing at 8 frames, where a CPU decoder
#: already runs at its best cost per frame, because a larger chunk is sent only once all its frames
#: are made: its wait is what the player must have buffered. Measured (benchmarks/ramp_bench.py,
#: docs/performance.md): the earliest first audio without an underrun, quiet and beside a busy core.
DEFAULT_RAMP = (1, 2, 4, 8)
MAX_CHUNK_FRAMES = 250
#: Entries a ChunkingPolicy.ramp_frames may hold (the contract's limit; a ramp needs only a few).
MAX_RAMP_ENTRIES = 64


@dataclasses.dataclass(frozen=True)
class ChunkSchedule:
    """Sizes of successive chunks; the last size repeats forever."""

    sizes: tuple[int, ...] = DEFAULT_RAMP

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ChunkingError("a chunk schedule needs at least one size")
        for index, size in enumerate(self.sizes):
            if not 1 <= size <= MAX_CHUNK_FRAMES:
                raise ChunkingError(f"chunk size {index} is {size} frames, expected 1..{MAX_CHUNK_FRAMES}")

    @classmethod
    def parse(cls, text: str) -> ChunkSchedule:
        """From a comma-separated list such as "1,2,4,8"."""
        try:
            sizes = tuple(int(part) for part in text.split(","))
        except ValueError:
            raise ChunkingError(f"chunk schedule {text!r} is not a comma-separated list of frame counts") from None
        return cls(sizes)

    @classmethod
    def from_policy(cls, policy: synthesis_pb2.ChunkingPolicy, default: ChunkSchedule | None = None) -> ChunkSchedule:
        """The schedule a ChunkingPolicy message asks for, taking unset parts from `default`."""
        default = default or cls()
        if len(policy.ramp_frames) > MAX_RAMP_ENTRIES:
            raise ChunkingError(f"ramp_frames has {len(policy.ramp_frames)} entries, the limit is {MAX_RAMP_ENTRIES}")
        first = policy.first_chunk_frames or default.sizes[0]
        ramp = tuple(policy.ramp_frames) or default.sizes[1:] or default.sizes
        return cls((first, *ramp))

    def to_policy(self) -> synthesis_pb2.ChunkingPolicy:
        return synthesis_pb2.ChunkingPolicy(
            first_chunk_frames=self.sizes[0], ramp_frames=self.sizes[1:] or self.sizes[:1]
        )

    def __iter__(self) -> Iterator[int]:
        return itertools.chain(self.sizes, itertools.repeat(self.sizes[-1]))

    def split(self, num_frames: int) -> list[int]:
        """Chunk sizes covering `num_frames` frames; the last one may be short."""
        sizes = []
        remaining = num_frames
        for size in self:
            if remaining <= 0:
                break
            sizes.append(min(size, remaining))
            remaining -= size
        return sizes

"""A stream's chunks from generation to the client's acknowledgement: what a connection sends and
what a Resume can send again.

Every chunk gets the next seq and waits here until it has been sent. A stream that cannot be
resumed drops each chunk once it is sent; a resumable one keeps the sent chunks the client has not
acknowledged (Ack), the oldest sent ones dropped first once it holds more than `retained_limit`
chunks (unsent ones always stay), so that a client reattaching on another call continues from the
seq after its last acknowledged one without re-synthesis.
"""

from __future__ import annotations

import collections

from codecstream.server.errors import Refusal
from codecstream.v1 import synthesis_pb2 as pb


class ChunkLog:
    def __init__(self, stream_id: str, resumable: bool, retained_limit: int) -> None:
        self._stream_id = stream_id
        self._resumable = resumable
        self._retained_limit = retained_limit
        #: Chunks not yet dropped: unsent ones always, sent ones until acked (resumable streams).
        self._chunks: collections.deque[pb.Chunk] = collections.deque()
        #: The seq the next chunk gets: how many chunks the stream has made.
        self.next_seq = 0
        self._last_sent_seq = -1

    def append(self, chunk: pb.Chunk) -> None:
        """Keep `chunk`, giving it the next seq."""
        chunk.seq = self.next_seq
        self._chunks.append(chunk)
        self.next_seq += 1

    def since(self, seq: int) -> list[pb.Chunk]:
        """The kept chunks from `seq` on."""
        return [chunk for chunk in self._chunks if chunk.seq >= seq]

    def first_to_resend(self, last_acked_seq: int | None) -> int:
        """The first seq a reattaching client needs; Refusal(OUT_OF_RANGE) if it was never sent or is gone."""
        wanted = 0 if last_acked_seq is None else last_acked_seq + 1
        if wanted > self.next_seq:
            raise Refusal(
                "OUT_OF_RANGE",
                f"stream {self._stream_id} has sent seq 0..{self.next_seq - 1}, cannot resume after {last_acked_seq}",
            )
        oldest = self._chunks[0].seq if self._chunks else self.next_seq
        if wanted < oldest:
            raise Refusal(
                "OUT_OF_RANGE", f"stream {self._stream_id} no longer keeps seq {wanted} (oldest kept is {oldest})"
            )
        return wanted

    def sent(self, seq: int) -> None:
        """A connection sent chunk `seq`."""
        self._last_sent_seq = max(self._last_sent_seq, seq)
        if not self._resumable:
            self.acknowledge(seq)
            return
        while len(self._chunks) > self._retained_limit and self._chunks[0].seq <= self._last_sent_seq:
            self._chunks.popleft()

    def acknowledge(self, seq: int) -> None:
        """The client decoded up to `seq`: those chunks need not be kept for Resume."""
        while self._chunks and self._chunks[0].seq <= min(seq, self._last_sent_seq):
            self._chunks.popleft()

    def __len__(self) -> int:
        return len(self._chunks)

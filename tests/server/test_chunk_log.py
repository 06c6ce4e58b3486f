"""What a stream keeps of its chunks, for the connection that sends them and for a Resume."""

from __future__ import annotations

import pytest
from codecstream.server.chunk_log import ChunkLog
from codecstream.server.errors import Refusal
from codecstream.v1 import synthesis_pb2 as pb


def filled(log: ChunkLog, count: int) -> ChunkLog:
    for frame in range(count):
        log.append(pb.Chunk(first_frame=frame, num_frames=1))
    return log


def test_chunks_get_consecutive_seqs_and_wait_until_sent():
    log = filled(ChunkLog("s", resumable=False, retained_limit=0), 3)
    assert [chunk.seq for chunk in log.since(0)] == [0, 1, 2]
    assert [chunk.seq for chunk in log.since(2)] == [2]
    assert log.next_seq == 3


def test_a_stream_that_cannot_resume_drops_each_chunk_once_sent():
    log = filled(ChunkLog("s", resumable=False, retained_limit=8), 3)
    log.sent(0)
    log.sent(1)
    assert [chunk.seq for chunk in log.since(0)] == [2]


def test_a_resumable_stream_keeps_sent_chunks_until_acked_within_its_limit():
    log = filled(ChunkLog("s", resumable=True, retained_limit=4), 5)
    log.sent(0)
    log.sent(1)
    # Two sent, none acknowledged: kept, but no more than the limit (the oldest sent go first).
    assert [chunk.seq for chunk in log.since(0)] == [1, 2, 3, 4]
    log.acknowledge(0)
    assert [chunk.seq for chunk in log.since(0)] == [1, 2, 3, 4]
    log.acknowledge(1)
    assert [chunk.seq for chunk in log.since(0)] == [2, 3, 4]
    # An acknowledgement never drops a chunk that was not sent; unsent chunks stay beyond the limit.
    log.acknowledge(10)
    assert [chunk.seq for chunk in log.since(0)] == [2, 3, 4]


def test_a_resume_starts_after_the_last_ack_and_is_refused_outside_what_is_kept():
    log = filled(ChunkLog("s", resumable=True, retained_limit=1), 4)
    for seq in range(3):
        log.sent(seq)
    assert log.first_to_resend(2) == 3
    assert log.first_to_resend(3) == 4  # everything made was acknowledged: continue with the next
    with pytest.raises(Refusal, match="no longer keeps seq 0"):
        log.first_to_resend(None)
    with pytest.raises(Refusal, match="cannot resume after 7"):
        log.first_to_resend(7)

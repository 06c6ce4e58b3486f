import pytest
from codecstream.protocol import ChunkingError, ChunkSchedule
from codecstream.v1 import synthesis_pb2 as pb


def test_default_schedule_ramps_then_repeats_its_last_size():
    assert ChunkSchedule().split(100) == [1, 2, 4, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 5]


def test_policy_with_only_a_first_chunk_keeps_the_default_ramp():
    schedule = ChunkSchedule.from_policy(pb.ChunkingPolicy(first_chunk_frames=3))
    assert schedule.sizes == (3, 2, 4, 8)


def test_unset_policy_is_the_default():
    assert ChunkSchedule.from_policy(pb.ChunkingPolicy()) == ChunkSchedule()


def test_policy_round_trip():
    schedule = ChunkSchedule((3, 5, 7))
    assert ChunkSchedule.from_policy(schedule.to_policy()) == schedule


@pytest.mark.parametrize("sizes", [(), (0,), (2, 251)])
def test_out_of_range_sizes_are_rejected(sizes):
    with pytest.raises(ChunkingError):
        ChunkSchedule(sizes)


def test_parse_rejects_non_numbers_with_the_text():
    with pytest.raises(ChunkingError, match="'2,x'"):
        ChunkSchedule.parse("2,x")

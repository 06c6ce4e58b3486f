import numpy as np
import pytest
from codecstream.protocol import (
    CodesError,
    ProtocolError,
    StreamOrderError,
    StreamReassembler,
    pack_codes,
    qwen3_tts_12hz_spec,
)
from codecstream.v1 import synthesis_pb2 as pb
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

SPEC = qwen3_tts_12hz_spec("sha256:" + "ab" * 32)


def header(**fields) -> pb.SynthesizeResponse:
    return pb.SynthesizeResponse(header=pb.Header(stream_id="s1", codec=SPEC, **fields))


def chunk(seq: int, first_frame: int, frames: int, value: int = 7) -> pb.SynthesizeResponse:
    codes = np.full((frames, 16), value, dtype=np.int16)
    return pb.SynthesizeResponse(
        chunk=pb.Chunk(seq=seq, first_frame=first_frame, num_frames=frames, codes=pack_codes(codes))
    )


def end(frames: int, reason=pb.END_REASON_EOS) -> pb.SynthesizeResponse:
    return pb.SynthesizeResponse(end=pb.End(reason=reason, frames_generated=frames))


def test_well_ordered_stream_yields_its_chunks_and_finishes():
    r = StreamReassembler()
    assert r.accept(header()) is None
    first = r.accept(chunk(0, 0, 2))
    second = r.accept(chunk(1, 2, 4, value=9))
    assert r.accept(end(6)) is None
    assert (first.seq, first.first_frame, first.num_frames) == (0, 0, 2)
    assert second.codes.shape == (4, 16) and int(second.codes[0, 0]) == 9
    assert r.finished and r.last_seq == 1 and r.next_frame == 6


def test_reference_codes_in_header_are_unpacked():
    reference = np.arange(48, dtype=np.int16).reshape(3, 16)
    r = StreamReassembler()
    r.accept(header(reference_codes=pack_codes(reference), reference_frames=3))
    np.testing.assert_array_equal(r.reference_codes, reference)


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([chunk(0, 0, 1)], "chunk before Header"),
        ([header(), header()], "second Header"),
        ([header(), chunk(1, 0, 1)], r"chunk seq 1 \(gap\): expected seq 0"),
        ([header(), chunk(0, 0, 1), chunk(0, 1, 1)], r"chunk seq 0 \(duplicate\): expected seq 1"),
        ([header(), chunk(0, 0, 2), chunk(2, 2, 1)], r"chunk seq 2 \(gap\)"),
        ([header(), chunk(0, 0, 2), chunk(1, 3, 1)], "starts at frame 3, expected frame 2"),
        ([header(), chunk(0, 0, 0)], "has 0 frames"),
        ([header(), end(0), end(0)], "end after End"),
        ([header(), end(0), chunk(0, 0, 1)], "chunk after End"),
        ([header(), chunk(0, 0, 2), end(5)], "End reports 5 frames but chunks carried 2"),
        ([header(), end(0, reason=pb.END_REASON_UNSPECIFIED)], "reason UNSPECIFIED"),
        ([header(), pb.SynthesizeResponse()], "no kind set"),
    ],
)
def test_order_violations_raise_stream_order_error_naming_the_problem(messages, error):
    r = StreamReassembler()
    with pytest.raises(StreamOrderError, match=error):
        for message in messages:
            r.accept(message)


def test_chunk_whose_bytes_disagree_with_its_frame_count_raises_codes_error_with_seq():
    bad = pb.SynthesizeResponse(chunk=pb.Chunk(seq=0, first_frame=0, num_frames=2, codes=b"\0" * 32))
    r = StreamReassembler()
    r.accept(header())
    with pytest.raises(CodesError, match="chunk seq 0: codes byte length 32"):
        r.accept(bad)


def test_resume_accepts_the_same_stream_header_then_continues_the_sequence():
    r = StreamReassembler()
    r.accept(header())
    r.accept(chunk(0, 0, 2))
    r.expect_resume()
    r.accept(header())
    assert r.accept(chunk(1, 2, 2)).first_frame == 2


def test_resume_refuses_another_streams_header():
    r = StreamReassembler()
    r.accept(header())
    r.expect_resume()
    with pytest.raises(StreamOrderError, match="differs from the original"):
        r.accept(pb.SynthesizeResponse(header=pb.Header(stream_id="other", codec=SPEC)))


response_messages = st.one_of(
    st.builds(lambda: header()),
    st.builds(chunk, st.integers(0, 4), st.integers(0, 8), st.integers(0, 4), st.integers(0, 2047)),
    st.builds(end, st.integers(0, 8), st.sampled_from([0, 1, 2, 3, 4])),
    st.binary(max_size=80),
)


@settings(max_examples=300)
@given(st.lists(response_messages, max_size=12))
def test_hostile_message_sequences_raise_documented_errors_and_never_crash(messages):
    r = StreamReassembler()
    accepted_frames = 0
    for message in messages:
        if isinstance(message, bytes):
            try:
                message = pb.SynthesizeResponse.FromString(message)
            except DecodeError:
                continue
        try:
            received = r.accept(message)
        except ProtocolError:
            break
        accepted_frames += received.num_frames if received else 0
    assert r.next_frame == accepted_frames
    assert r.next_seq == (r.last_seq + 1 if r.last_seq is not None else 0)

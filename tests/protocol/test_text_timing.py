"""Text spans of chunks: merged per segment, words timed within them, the heard offset, and a span
that ends before it starts refused."""

from __future__ import annotations

import itertools

import pytest
from codecstream.protocol import pack_codes, qwen3_tts_12hz_spec
from codecstream.protocol.errors import StreamOrderError
from codecstream.protocol.reassembler import StreamReassembler
from codecstream.protocol.text_timing import TextSpan, merge_spans, text_offset_played, word_timings
from codecstream.v1 import synthesis_pb2 as pb

from tests.conftest import random_codes

TEXT = "One two. Three four five."


def test_chunks_of_one_segment_merge_into_one_span():
    chunks = [(0, 2, 0, 8), (2, 4, 0, 8), (6, 4, 9, 25), (10, 6, 9, 25)]
    assert merge_spans(chunks) == [TextSpan(0, 6, 0, 8), TextSpan(6, 10, 9, 25)]


def test_words_are_timed_by_spreading_each_segment_over_its_frames():
    words = word_timings(TEXT, [TextSpan(0, 8, 0, 8), TextSpan(8, 16, 9, 25)])
    assert [w.word for w in words] == ["One", "two.", "Three", "four", "five."]
    assert words[0].start_s == 0.0 and words[1].end_s == pytest.approx(8 * 0.08)
    assert words[2].start_s == pytest.approx(8 * 0.08)  # the second segment starts with its frames
    assert words[-1].end_s == pytest.approx(24 * 0.08)
    assert all(a.end_s <= b.start_s + 1e-9 for a, b in itertools.pairwise(words))


def test_the_heard_offset_counts_whole_segments_then_whole_words_that_fit():
    spans = [TextSpan(0, 8, 0, 8), TextSpan(8, 16, 9, 25)]
    assert text_offset_played(TEXT, spans, 0) == 0
    assert text_offset_played(TEXT, spans, 8) == 8  # "One two."
    # 7 of the second segment's 16 frames: 7/16 of its 16 characters = 7 characters, "Three" (5) fits.
    assert TEXT[: text_offset_played(TEXT, spans, 15)] == "One two. Three"
    assert text_offset_played(TEXT, spans, 24) == len(TEXT)


def test_a_chunk_whose_text_span_ends_before_it_starts_is_refused():
    reassembler = StreamReassembler()
    reassembler.accept(pb.SynthesizeResponse(header=pb.Header(stream_id="s", codec=qwen3_tts_12hz_spec("sha256:0"))))
    chunk = pb.Chunk(seq=0, first_frame=0, num_frames=1, codes=pack_codes(random_codes(1)), text_start=5, text_end=2)
    with pytest.raises(StreamOrderError, match=r"text span \[5, 2\): end before start"):
        reassembler.accept(pb.SynthesizeResponse(chunk=chunk))

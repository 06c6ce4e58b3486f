"""Word timings from the text spans of chunks: released with the audio they describe, in order, never
moved once released; the heard offset; a span that ends before it starts refused."""

from __future__ import annotations

import itertools

import pytest
from codecstream.protocol import pack_codes, qwen3_tts_12hz_spec
from codecstream.protocol.errors import StreamOrderError
from codecstream.protocol.reassembler import StreamReassembler
from codecstream.protocol.text_timing import FRAMES_PER_CHAR, WordClock, expected_frames
from codecstream.v1 import synthesis_pb2 as pb

from tests.conftest import random_codes

TEXT = "One two. Three four five."


def feed(clock: WordClock, text: str, chunks: list[tuple[int, int, int, int, bool]]) -> list[list[str]]:
    """The words each chunk releases."""
    return [[w.word for w in clock.add(text, *chunk)] for chunk in chunks]


def test_words_are_timed_by_spreading_each_ended_span_over_its_frames():
    clock = WordClock()
    feed(clock, TEXT, [(0, 4, 0, 8, False), (4, 4, 0, 8, True), (8, 8, 9, 25, False)])
    clock.end(TEXT)
    words = clock.words
    assert [w.word for w in words] == ["One", "two.", "Three", "four", "five."]
    assert words[0].start_s == 0.0 and words[1].end_s == pytest.approx(8 * 0.08)
    assert words[2].start_s == pytest.approx(8 * 0.08)  # the second span starts with its frames
    assert words[-1].end_s == pytest.approx(16 * 0.08)
    assert all(a.end_s <= b.start_s + 1e-9 for a, b in itertools.pairwise(words))


def test_a_span_that_ends_with_its_chunk_releases_its_words_with_that_chunk():
    # A growing stream: every chunk speaks exactly the tokens of its own frames.
    text = "Sure, I can help with that."
    clock = WordClock()
    released = feed(clock, text, [(0, 2, 0, 5, True), (2, 4, 5, 16, True), (6, 5, 16, 27, True)])
    assert released == [["Sure,"], ["I", "can", "help"], ["with"]]
    assert [w.word for w in clock.end(text)] == ["that."]  # the last word could go on until End


def test_a_segment_still_being_spoken_releases_the_words_its_audio_has_reached():
    # A sentence of a segmented stream, chunk by chunk: its length in frames is unknown until it ends.
    text = "The train leaves at nine from platform four."
    clock = WordClock()
    first = clock.add(text, 0, 2, 0, len(text), False)
    assert first == []  # 0.16 s: no word is spoken to its end yet
    second = clock.add(text, 2, 4, 0, len(text), False)
    assert [w.word for w in second] == ["The"]  # "The " takes 4 characters, about 3.6 frames
    assert second[0].end_s <= 6 * 0.08
    later = clock.add(text, 6, 10, 0, len(text), False)
    assert [w.word for w in later] == ["train", "leaves"]  # " at" would end past frame 16
    assert all(w.end_s <= 16 * 0.08 + 1e-9 for w in clock.words)


def test_words_released_early_keep_their_times_and_the_rest_of_the_span_fills_what_is_left():
    text = "The train leaves at nine from platform four."
    clock = WordClock()
    clock.add(text, 0, 14, 0, len(text), False)
    early = list(clock.words)
    # The sentence took 20 frames, faster than the typical rate; the text is complete.
    clock.add(text, 14, 6, 0, len(text), True, text_complete=True)
    assert clock.words[: len(early)] == early
    words = clock.words
    assert [w.word for w in words] == text.split()
    assert all(a.end_s <= b.start_s + 1e-9 for a, b in itertools.pairwise(words))
    assert words[-1].end_s == pytest.approx(20 * 0.08)


def test_a_word_split_over_two_chunks_is_one_word_released_with_its_end():
    text = "It leaves now."
    clock = WordClock()
    assert feed(clock, text, [(0, 2, 0, 5, True), (2, 2, 5, 10, True)]) == [["It"], ["leaves"]]
    leaves = clock.words[1]
    assert (leaves.text_start, leaves.text_end) == (3, 9)
    assert leaves.start_s == pytest.approx(3 * 2 / 5 * 0.08)  # "It le" over the first 2 frames
    assert leaves.end_s == pytest.approx((2 + 4 * 2 / 5) * 0.08)  # "aves" of "aves " over the next 2


def test_a_whole_text_cancelled_early_counts_only_the_words_its_frames_reached():
    text = "Hello there, this is a long answer that the listener will interrupt after a fraction of a second."
    clock = WordClock()
    clock.add(text, 0, 2, 0, len(text), False)
    clock.add(text, 2, 4, 0, len(text), False)
    heard = clock.heard(3)  # 0.24 s played
    assert text[:heard] in ("", "Hello")
    assert clock.heard(6) <= 12


def test_the_heard_offset_counts_whole_words_that_fit_in_the_frames_played():
    clock = WordClock()
    feed(clock, TEXT, [(0, 8, 0, 8, True), (8, 16, 9, 25, True)])
    clock.end(TEXT)
    assert clock.heard(0) == 0
    assert clock.heard(8) == 8  # "One two."
    # 7 of the second span's 16 frames: 7/16 of its 16 characters = 7 characters, "Three" (5) fits.
    assert TEXT[: clock.heard(15)] == "One two. Three"
    assert clock.heard(24) == len(TEXT)


def test_cjk_text_is_expected_to_take_longer_per_character():
    assert expected_frames("你好世界") > 3 * expected_frames("abcd")
    assert expected_frames("abcd") == pytest.approx(4 * FRAMES_PER_CHAR)


def test_a_chunk_whose_text_span_ends_before_it_starts_is_refused():
    reassembler = StreamReassembler()
    reassembler.accept(pb.SynthesizeResponse(header=pb.Header(stream_id="s", codec=qwen3_tts_12hz_spec("sha256:0"))))
    chunk = pb.Chunk(seq=0, first_frame=0, num_frames=1, codes=pack_codes(random_codes(1)), text_start=5, text_end=2)
    with pytest.raises(StreamOrderError, match=r"text span \[5, 2\): end before start"):
        reassembler.accept(pb.SynthesizeResponse(chunk=chunk))

"""Streamed text (Start.streaming_text + TextInput): the cutting rule, one stream of segments with
their text spans, the heard offset after a cancel, word timings, and every malformed sequence
refused with a precise status. The replay source plays its recording once per segment."""

from __future__ import annotations

import itertools
import threading
import time

import grpc
import numpy as np
import pytest
from codecstream.client import Client, StreamEnded
from codecstream.client.runtimes import open_decoder
from codecstream.protocol import decoder_digest
from codecstream.protocol.codec_spec import qwen3_tts_12hz_spec
from codecstream.protocol.codes_file import CodesFile
from codecstream.server.errors import Refusal
from codecstream.server.limits import ServerLimits
from codecstream.server.replay import ReplaySource
from codecstream.server.request import ModelOffering, SynthesisRequest, TaskType, VoiceInfo
from codecstream.server.request_parsing import parse_start
from codecstream.server.segmenting import SegmentedGeneration, TextSegmenter
from codecstream.server.source import Frames
from codecstream.server.text_input import StreamedText
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc

from tests.conftest import random_codes

FRAMES_PER_SEGMENT = 12


def segments_of(pieces: list[str], end: bool = True, **limits) -> list[str]:
    segmenter = TextSegmenter(ServerLimits(**limits))
    text, cut = "", []
    for piece in pieces:
        text += piece
        cut += segmenter.cut(text)
    if end:
        cut += segmenter.cut(text, [len(text)])
    return [text[s.start : s.end] for s in cut]


def test_a_sentence_end_cuts_a_segment_as_soon_as_a_space_follows_it():
    assert segments_of(["Hello there.", " How"], end=False) == ["Hello there."]
    assert segments_of(["Hello there."], end=False) == []  # "." may still be "..." or "3.5"
    assert segments_of(["It costs 3.5 euros. Fine"], end=False) == ["It costs 3.5 euros."]


def test_a_clause_mark_cuts_only_a_segment_long_enough():
    assert segments_of(["Well, I think so, and then some more words; and"], end=False, min_clause_chars=30) == [
        "Well, I think so, and then some more words;"
    ]


def test_a_segment_without_punctuation_is_cut_at_its_last_space_before_the_limit():
    text = " ".join(["word"] * 30)
    cut = segments_of([text], end=False, max_segment_chars=50)
    assert cut and all(len(s) <= 50 and not s.endswith(" ") for s in cut)
    assert " ".join(cut + segments_of([text], max_segment_chars=50)[len(cut) :]).split() == text.split()


def test_cjk_sentence_and_clause_marks_need_no_space():
    assert segments_of(["你好。今天天气很好，我们出去走走吧、好不好"], end=False, min_clause_chars=5) == [
        "你好。",
        "今天天气很好，",
        "我们出去走走吧、",
    ]


def test_end_of_input_speaks_the_rest_and_leading_spaces_are_not_part_of_a_segment():
    assert segments_of(["  One.  Two", " three  "]) == ["One.", "Two three"]


@pytest.mark.asyncio
async def test_every_flush_ends_a_segment_though_more_text_came_before_the_segment_was_cut():
    # Pipecat's sentence mode flushes each sentence; when the next one arrived before the stream
    # was cut (two LLM sentences a few ms apart), only the last flush counted and both sentences
    # became one segment ("there.The" has no space to end the first at).
    limits = ServerLimits()
    text = StreamedText("", limits)
    text.push("Hello there.", flush=True, end_of_input=False)
    text.push("The train leaves at nine.", flush=True, end_of_input=False)
    text.push("On time", flush=False, end_of_input=True)
    source = ReplaySource(CodesFile(random_codes(3)))
    request = SynthesisRequest(text="", max_frames=100, streamed_text=text)
    spans = {
        (e.text_start, e.text_end)
        async for e in SegmentedGeneration(source, request, text, "s", limits)
        if isinstance(e, Frames)
    }
    assert [text.text[a:b] for a, b in sorted(spans)] == ["Hello there.", "The train leaves at nine.", "On time"]


@pytest.fixture
def server(replay_server_factory, checkpoint):
    return replay_server_factory(
        codes=random_codes(FRAMES_PER_SEGMENT, seed=5),
        fps=200.0,
        decoder_digest=decoder_digest(checkpoint),
        limits=ServerLimits(text_idle_s=0.3, max_text_chars=200),
    )


def test_text_pushed_in_pieces_is_spoken_segment_by_segment_in_one_stream(server, checkpoint):
    pieces = ["Hello", " there.", " This is the second", " sentence of the reply!", " And a tail"]
    with Client(server.target) as client:
        assert not client.codec_info().streamed_text_grows  # the replay source speaks segments
        stream = client.stream_text(decoder=open_decoder(checkpoint))
        for piece in pieces:
            stream.push_text(piece)
        stream.end_input()
        chunks = list(stream)
    text = "".join(pieces)
    spans = sorted({(c.text_start, c.text_end) for c in chunks})
    assert [text[a:b] for a, b in spans] == ["Hello there.", "This is the second sentence of the reply!", "And a tail"]
    assert stream.end.reason == pb.END_REASON_EOS and stream.end.text_offset_played == len(text)
    # One frame space, each segment's frames in chunks of their own, the decoder never reset.
    assert [c.first_frame for c in chunks] == list(np.cumsum([0] + [c.num_frames for c in chunks[:-1]]))
    per_span = {span: sum(c.num_frames for c in chunks if (c.text_start, c.text_end) == span) for span in spans}
    assert set(per_span.values()) == {FRAMES_PER_SEGMENT}
    words = stream.word_timestamps()
    assert [w.word for w in words] == text.split()
    assert all(a.end_s <= b.start_s + 1e-9 for a, b in itertools.pairwise(words))
    assert words[-1].end_s <= sum(c.num_frames for c in chunks) * 0.08 + 1e-9


def test_a_partial_clause_is_spoken_after_the_idle_time_or_at_a_flush(server, checkpoint):
    with Client(server.target) as client:
        stream = client.stream_text("No punctuation here", decoder=open_decoder(checkpoint))
        started = time.monotonic()
        first = next(stream)  # spoken once 0.3 s passed without more text
        waited = time.monotonic() - started
        stream.push_text(" and more")
        stream.flush()
        rest = [first, *[next(stream) for _ in range(3)]]
        stream.end_input()
        rest += list(stream)
    assert waited >= 0.25
    spans = sorted({(c.text_start, c.text_end) for c in rest})
    assert [stream.text[a:b] for a, b in spans] == ["No punctuation here", "and more"]


def test_a_cancel_reports_how_far_the_listener_heard(replay_server_factory, checkpoint):
    server = replay_server_factory(
        codes=random_codes(FRAMES_PER_SEGMENT, seed=5), fps=25.0, decoder_digest=decoder_digest(checkpoint)
    )
    text = "One two three four. Five six seven eight. Nine ten eleven twelve."
    with Client(server.target) as client:
        stream = client.stream_text(text, decoder=open_decoder(checkpoint))
        stream.end_input()
        chunks = [next(stream) for _ in range(3)]
        # Both first segments generated, then the listener heard the first in full and half of
        # the second: "Five six" of it.
        while sum(c.num_frames for c in chunks) < 2 * FRAMES_PER_SEGMENT:
            chunks.append(next(stream))
        played = FRAMES_PER_SEGMENT + FRAMES_PER_SEGMENT // 2
        end = stream.cancel(played_frames=played)
    assert end.reason == pb.END_REASON_CANCELLED and end.stats.played_frames == played
    assert stream.heard_text == "One two three four. Five six"


def test_a_sentence_cut_short_while_it_is_generated_counts_only_the_words_its_played_frames_reach(
    replay_server_factory, checkpoint
):
    # Issue 21 item 3: a segment still being generated was spread over the frames made so far, so
    # 0.48 s of an 8 s sentence reported all 27 of its characters heard.
    server = replay_server_factory(codes=random_codes(100), fps=25.0, decoder_digest=decoder_digest(checkpoint))
    text = "The next train to the airport leaves at nine from platform four, and it is on time today."
    with Client(server.target) as client:
        stream = client.stream_text(text, decoder=open_decoder(checkpoint), chunking=[2, 4, 8, 16, 25])
        stream.end_input()
        chunks = [next(stream) for _ in range(2)]  # 6 of the sentence's 100 frames
        end = stream.cancel(played_frames=6)
    assert sum(c.num_frames for c in chunks) == 6
    assert end.reason == pb.END_REASON_CANCELLED
    assert stream.heard_text in ("The", "The next")  # 0.48 s: about 7 characters at a typical pace


def test_a_whole_text_cancelled_after_a_quarter_second_counts_a_word_or_two_heard(replay_server_factory, checkpoint):
    # Issue 21 item 3: 3 frames (0.24 s) of a 132-character text reported 71 characters heard.
    server = replay_server_factory(codes=random_codes(150), fps=25.0, decoder_digest=decoder_digest(checkpoint))
    text = (
        "Sure, I can help with that. The next train to the airport leaves at nine from platform four, "
        "and the one after it at half past nine."
    )
    with Client(server.target) as client:
        stream = client.synthesize(text, decoder=open_decoder(checkpoint), chunking=[2, 4, 8, 16, 25])
        chunks = [next(stream) for _ in range(3)]  # 2 + 4 + 8 frames generated
        end = stream.cancel(played_frames=3)
    assert sum(c.num_frames for c in chunks) == 14
    assert end.reason == pb.END_REASON_CANCELLED
    assert stream.heard_text in ("", "Sure,")


def raw_call(server, *messages: pb.SynthesizeRequest):
    """Send `messages` on one call, the last once the server has answered (its Header), and keep the
    call open until the server ends it; every response, then the status."""
    channel = grpc.insecure_channel(server.target)
    answered, ended = threading.Event(), threading.Event()

    def requests():
        for index, message in enumerate(messages):
            if index and index == len(messages) - 1:
                answered.wait(20)
            yield message
        ended.wait(20)  # no half-close: what ends the call is the server's doing

    responses = []
    try:
        for response in synthesis_pb2_grpc.SynthesisServiceStub(channel).Synthesize(requests(), timeout=20):
            responses.append(response)
            answered.set()
        return responses, grpc.StatusCode.OK, ""
    except grpc.RpcError as error:
        return responses, error.code(), error.details()
    finally:
        answered.set()
        ended.set()
        channel.close()


def streaming_start(text: str = "") -> pb.SynthesizeRequest:
    return pb.SynthesizeRequest(start=pb.Start(text=text, streaming_text=True))


def text_input(text: str = "", flush: bool = False, end: bool = False) -> pb.SynthesizeRequest:
    return pb.SynthesizeRequest(text=pb.TextInput(text=text, flush=flush, end_of_input=end))


def test_a_repeated_empty_end_of_input_changes_nothing(replay_server_factory):
    """On main the second one was "protocol violation: text after end_of_input" (issue 49)."""
    server = replay_server_factory(codes=random_codes(FRAMES_PER_SEGMENT))
    messages = [streaming_start("Hi."), text_input(end=True), text_input(end=True), text_input(flush=True)]
    responses, code, _ = raw_call(server, *messages)
    ends = [r.end for r in responses if r.HasField("end")]
    assert code == grpc.StatusCode.OK and [end.reason for end in ends] == [pb.END_REASON_EOS]


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([text_input("Hi.")], "first message must be start or resume, got text"),
        ([streaming_start("Hi."), text_input(end=True), text_input("More.")], "text after end_of_input"),
        ([streaming_start("Hi."), text_input("")], "empty text and neither flush nor end_of_input"),
        ([streaming_start("Hi."), text_input("x" * 250)], "text has 253 characters, the limit is 200"),
        (
            [pb.SynthesizeRequest(start=pb.Start(text="Hi.")), text_input("More.")],
            "text input on a stream whose Start did not set streaming_text",
        ),
        (
            [pb.SynthesizeRequest(start=pb.Start(text="", streaming_text=True, resumable=True))],
            "streaming_text and resumable cannot be combined",
        ),
    ],
    ids=["text-before-start", "after-end", "empty-piece", "oversize-total", "not-streaming", "resumable"],
)
def test_malformed_text_sequences_are_refused_with_a_precise_status(replay_server_factory, messages, message):
    # Slow enough that the stream still runs when the last message arrives.
    server = replay_server_factory(
        codes=random_codes(FRAMES_PER_SEGMENT), fps=10.0, limits=ServerLimits(max_text_chars=200)
    )
    responses, code, details = raw_call(server, *messages)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in details
    assert "x" * 20 not in details  # client text is never echoed
    ends = [r.end for r in responses if r.HasField("end")]
    if responses:  # refused after the Header: one End(ERROR) first
        assert len(ends) == 1 and ends[0].reason == pb.END_REASON_ERROR
    assert server.wait_until(lambda: server.live_requests() == 0)


def test_a_streamed_voice_clone_is_refused_before_anything_starts():
    offering = ModelOffering(task_types=(TaskType.CUSTOM_VOICE, TaskType.BASE), voices=(VoiceInfo("ryan"),))
    start = pb.Start(text="Hi.", streaming_text=True, task_type=pb.TASK_TYPE_BASE)
    start.reference_audio.audio = b"RIFF"
    with pytest.raises(Refusal, match="streaming_text is offered for CUSTOM_VOICE and VOICE_DESIGN, not BASE"):
        parse_start(start, offering, qwen3_tts_12hz_spec("sha256:0"), ServerLimits())


def test_a_stream_never_ended_by_its_client_ends_with_an_error(replay_server_factory, checkpoint):
    server = replay_server_factory(
        codes=random_codes(4), decoder_digest=decoder_digest(checkpoint), limits=ServerLimits(text_input_timeout_s=0.5)
    )
    with Client(server.target) as client:
        stream = client.stream_text("Hello.", decoder=open_decoder(checkpoint))
        with pytest.raises(StreamEnded, match=r"no text for 0\.5 s and no end_of_input"):
            list(stream)


def test_every_segment_starts_on_the_schedule_s_small_first_chunk(server, checkpoint):
    with Client(server.target) as client:
        stream = client.stream_text("Hello there.", decoder=open_decoder(checkpoint))
        first = [next(stream) for _ in range(3)]  # the first segment, spoken before more text came
        stream.push_text(" The second sentence comes after a pause.")
        stream.end_input()
        chunks = first + list(stream)
    sizes: dict = {}
    for chunk in chunks:
        sizes.setdefault((chunk.text_start, chunk.text_end), []).append(chunk.num_frames)
    # Default chunking 1, 2, 4, 8 over each segment's 12 frames, the second as soon as the first.
    assert list(sizes.values()) == [[1, 2, 4, 5], [1, 2, 4, 5]]

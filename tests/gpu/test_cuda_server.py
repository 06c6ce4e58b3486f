"""The server on the GPU it is built for: one real `codecstream-server` process on CUDA with the shipped
CUDA deploy YAML, a random-weight checkpoint in the official layout, driven through the client library
over gRPC as an application would drive it (codes only: the lane is about the server, no decoder).

Run with scripts/test-gpu on a GPU host; skipped where CUDA is absent. The engine-kill test restarts the
engine and comes last. Besides pass/fail the lane records first-chunk times and whether a seeded request
gives the same codes inside a batch (tests/gpu/lane.py: gpu-lane.json).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import re
import time

import numpy as np
import pytest
import yaml
from codecstream.client import AsyncClient, Client, StreamEnded, Unavailable
from codecstream.v1 import synthesis_pb2 as pb

from tests.gpu.lane import START_TIMEOUT_S, skip_reason
from tests.gpu.server_process import NOT_SERVING, SERVING, wait_for

if (reason := skip_reason()) is not None:
    pytest.skip(reason, allow_module_level=True)

# One xdist group: under the suite's `-n 2 --dist loadgroup` one worker starts the one server.
pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("gpu")]

VOICE = "ryan"
TEXT = "The next train to the airport leaves at nine, from platform four."
SCHEDULE = [1, 2, 4, 8]
WHOLE_FRAMES = 48
#: Longer than any stream a test lets finish: a stream cut by a cancel or a kill is still generating.
LONG_FRAMES = 2000
REPLY = "Sure, I can help with that. The next train to the airport leaves at nine, from platform four."
SEED = 11
#: More frames than the reply has text tokens (one is read per frame, and the test checkpoints' tokenizer
#: spells most words letter by letter: 93 for REPLY): every character is read before the budget ends.
STREAMED_FRAMES = 128


def streams_started(server) -> float:
    return server.metric("codecstream_streams_started_total")


def chunk_sizes(schedule: list[int], frames: int) -> list[int]:
    """The chunk sizes `frames` frames take under `schedule` (its last size repeats, the rest is sent last)."""
    sizes, sent = [], 0
    for size in itertools.chain(schedule, itertools.repeat(schedule[-1])):
        if sent + size > frames:
            break
        sizes.append(size)
        sent += size
    return sizes + ([frames - sent] if frames > sent else [])


def assert_complete_and_in_order(chunks, end: pb.End, frames: int, name: str) -> None:
    assert end.reason == pb.END_REASON_MAX_FRAMES, f"{name}: ended {pb.EndReason.Name(end.reason)} {end.message}"
    assert [chunk.seq for chunk in chunks] == list(range(len(chunks))), f"{name}: chunk seq not contiguous"
    starts = list(itertools.accumulate((chunk.num_frames for chunk in chunks[:-1]), initial=0))
    assert [chunk.first_frame for chunk in chunks] == starts, f"{name}: frames not contiguous"
    assert sum(chunk.num_frames for chunk in chunks) == frames == end.frames_generated, name


def joined(chunks) -> np.ndarray:
    return np.concatenate([chunk.codes for chunk in chunks]) if chunks else np.zeros((0, 16), np.int16)


# -- 1. whole text ---------------------------------------------------------------------------------


def test_a_whole_text_streams_every_frame_it_asked_for_in_chunks_of_its_schedule(lane_server, lane_report):
    async def run() -> list[tuple[object, list, list[float]]]:
        results = []
        async with AsyncClient(lane_server.target) as client:
            for label in ("first after start", "again"):
                before = streams_started(lane_server)
                stream = client.stream_codes(TEXT, voice=VOICE, seed=1, max_frames=WHOLE_FRAMES, chunking=SCHEDULE)
                chunks, arrivals = [], []
                async for chunk in stream:
                    chunks.append(chunk)
                    arrivals.append(time.monotonic())
                lane_report.first_chunk("whole_text", label, stream.first_chunk_at - stream.opened_at, before)
                results.append((stream, chunks, arrivals))
        return results

    for stream, chunks, arrivals in asyncio.run(run()):
        # Random weights never draw EOS here (tests/gpu/lane.py): the stream runs to its budget.
        assert_complete_and_in_order(chunks, stream.end, WHOLE_FRAMES, "whole text")
        assert [chunk.num_frames for chunk in chunks] == chunk_sizes(SCHEDULE, WHOLE_FRAMES)
        codes, codec = joined(chunks), stream.header.codec
        assert codes.shape == (WHOLE_FRAMES, codec.num_codebooks) == (WHOLE_FRAMES, 16)
        assert codes.min() >= 0 and codes.max() < codec.codebook_size
        # Chunks leave as the engine steps, not all at the end.
        assert arrivals[0] < arrivals[-1]


# -- 2. streamed text on the growing request ------------------------------------------------------


def llm_tokens(text: str) -> list[str]:
    """LLM-like pieces: words with their leading space, punctuation on its own."""
    return re.findall(r" ?[\w']+| ?[^\w\s]", text)


def random_cuts(text: str, cuts: int, seed: int) -> list[str]:
    points = sorted(random.Random(seed).sample(range(1, len(text)), cuts))
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def paced(rate_per_s: float) -> list[tuple[str, float]]:
    return [(token, 1.0 / rate_per_s) for token in llm_tokens(REPLY)]


ARRIVALS = {
    "all at once again": [(REPLY, 0.0)],
    "100 tokens/s": paced(100),
    "15 tokens/s": paced(15),
    "3 tokens/s": paced(3),
    "20 random cuts": [(piece, 0.05) for piece in random_cuts(REPLY, 20, seed=5)],
    "2 s pause inside a word": [(REPLY[: REPLY.index("leaves") + 3], 2.0), (REPLY[REPLY.index("leaves") + 3 :], 0.0)],
}


@dataclasses.dataclass
class Spoken:
    codes: np.ndarray
    #: (text_start, text_end) of each chunk that speaks text.
    spans: list[tuple[int, int]]
    end: pb.End
    first_chunk_s: float


async def speak(target: str, pieces: list[tuple[str, float]]) -> Spoken:
    """Stream `pieces` (text, seconds to wait after it) into one streamed-text request, the last with
    end of input; read its codes to the End."""
    async with AsyncClient(target) as client:
        text_stream = client.stream_text(voice=VOICE, seed=SEED, max_frames=STREAMED_FRAMES)
        codes = text_stream.codes  # read as codes: no decoder is ever opened

        async def write() -> None:
            for index, (piece, pause) in enumerate(pieces):
                text_stream.push_text(piece)
                if index == len(pieces) - 1:
                    text_stream.end_input()
                if pause:
                    await asyncio.sleep(pause)

        await codes.open()
        writer = asyncio.create_task(write())
        chunks = [chunk async for chunk in codes]
        await writer
    assert_complete_and_in_order(chunks, codes.end, STREAMED_FRAMES, "streamed text")
    spans = [(chunk.text_start, chunk.text_end) for chunk in chunks if chunk.text_end > chunk.text_start]
    return Spoken(joined(chunks), spans, codes.end, codes.first_chunk_at - codes.opened_at)


@pytest.fixture(scope="module")
def streamed_reference(lane_server, lane_report) -> Spoken:
    """The reply given all at once: what every arrival must reproduce (and the first streamed text
    after the start, whose first chunk is recorded)."""
    with Client(lane_server.target) as client:
        info = client.codec_info()
    assert info.streamed_text_grows, "the server speaks streamed text in segments, not as one growing request"
    before = streams_started(lane_server)
    spoken = asyncio.run(speak(lane_server.target, [(REPLY, 0.0)]))
    lane_report.first_chunk("streamed_text", "first after start (all at once)", spoken.first_chunk_s, before)
    return spoken


def test_the_streamed_reply_is_spoken_token_by_token_to_its_last_character(streamed_reference):
    # Each chunk names the text its frames read: in order, tiling the reply from its first character.
    assert "".join(REPLY[a:b] for a, b in streamed_reference.spans) == REPLY
    assert streamed_reference.end.text_offset_played == len(REPLY)


@pytest.mark.parametrize("arrival", list(ARRIVALS), ids=list(ARRIVALS))
def test_streamed_codes_are_byte_identical_to_the_reply_given_at_once_however_it_arrives(
    lane_server, lane_report, streamed_reference, arrival
):
    before = streams_started(lane_server)
    spoken = asyncio.run(speak(lane_server.target, ARRIVALS[arrival]))
    lane_report.first_chunk("streamed_text", arrival, spoken.first_chunk_s, before)
    assert spoken.codes.shape == streamed_reference.codes.shape
    assert spoken.codes.tobytes() == streamed_reference.codes.tobytes()
    assert "".join(REPLY[a:b] for a, b in spoken.spans) == REPLY
    assert spoken.end.text_offset_played == len(REPLY)


# -- 3. cancel --------------------------------------------------------------------------------------


def test_a_cancel_ends_the_stream_cancelled_and_the_engine_makes_at_most_one_frame_after_it(lane_server):
    stops = lane_server.metric("codecstream_frames_after_stop_count")
    within_one_step = lane_server.metric("codecstream_frames_after_stop_bucket", le="1.0")
    with Client(lane_server.target) as client:
        stream = client.stream_codes(TEXT, voice=VOICE, seed=2, max_frames=LONG_FRAMES, chunking=[1])
        played = sum(next(stream).num_frames for _ in range(4))
        end = stream.cancel(played_frames=played)
    assert end.reason == pb.END_REASON_CANCELLED and end.stats.played_frames == played
    assert played <= end.frames_generated < LONG_FRAMES
    # Counted by the server before it sent End: frames the engine generated after the stop.
    assert lane_server.metric("codecstream_frames_after_stop_count") == stops + 1
    assert lane_server.metric("codecstream_frames_after_stop_bucket", le="1.0") == within_one_step + 1, (
        "the engine generated more than one frame after the cancel"
    )
    wait_for(lambda: lane_server.metric("codecstream_streams_active") == 0, 30, "no stream left active")


# -- 4. many streams at once -----------------------------------------------------------------------


def test_many_streams_started_at_once_each_arrive_complete_and_in_order(lane_server, lane):
    frames = 40

    async def one(client: AsyncClient, index: int):
        stream = client.stream_codes(
            f"Stream number {index} says a sentence of its own.", voice=VOICE, seed=100 + index, max_frames=frames
        )
        chunks = [chunk async for chunk in stream]
        return stream.end, chunks

    async def run():
        async with AsyncClient(lane_server.target) as client:
            return await asyncio.gather(*(one(client, index) for index in range(lane.streams)))

    results = asyncio.run(run())
    assert len(results) == lane.streams
    for index, (end, chunks) in enumerate(results):
        assert_complete_and_in_order(chunks, end, frames, f"stream {index}")


# -- 5. a seeded request alone and inside a batch ---------------------------------------------------


def test_a_seeded_request_inside_a_batch_is_recorded_as_equal_or_not_to_the_same_request_alone(
    lane_server, lane, lane_report
):
    frames = 48
    seeded = {"text": TEXT, "voice": VOICE, "seed": 7, "max_frames": frames}
    neighbours = [
        {**seeded, "text": f"Neighbour {index} talks about something else.", "seed": 500 + index}
        for index in range(lane.batch - 1)
    ]

    async def together(requests: list[dict]) -> list[np.ndarray]:
        async def one(client: AsyncClient, request: dict) -> np.ndarray:
            options = dict(request)
            stream = client.stream_codes(options.pop("text"), **options)
            chunks = [chunk async for chunk in stream]
            assert_complete_and_in_order(chunks, stream.end, frames, f"seed {request['seed']}")
            return joined(chunks)

        async with AsyncClient(lane_server.target) as client:
            return await asyncio.gather(*(one(client, request) for request in requests))

    (alone,) = asyncio.run(together([seeded]))
    (alone_again,) = asyncio.run(together([seeded]))
    middle = len(neighbours) // 2
    in_batch = asyncio.run(together([*neighbours[:middle], seeded, *neighbours[middle:]]))[middle]
    differing = np.flatnonzero((in_batch != alone).any(axis=1))
    stage = yaml.safe_load(lane.deploy_config.read_text())["stages"][0]
    finding = {
        "frames": frames,
        "batch": lane.batch,
        "max_num_seqs": stage["max_num_seqs"],
        "alone_twice_equal": bool(np.array_equal(alone, alone_again)),
        "equal_alone_and_in_batch": not differing.size,
        "first_differing_frame": int(differing[0]) if differing.size else None,
        "differing_frames": int(differing.size),
    }
    lane_report.add("seeded_request_in_a_batch", finding)
    print(f"seeded request alone vs inside a batch of {lane.batch}: {finding}")


# -- 6. every slot held by streamed texts waiting for words ------------------------------------------

#: Newcomers measured one after another, quiet and then beside the idle holders.
NEWCOMERS = 8
#: Holders per client connection (one HTTP/2 connection carries this many calls at once).
HOLDERS_PER_CONNECTION = 32


async def newcomer_first_chunks(target: str) -> list[float]:
    """First-chunk seconds of NEWCOMERS whole-text streams, one after another."""
    seconds = []
    async with AsyncClient(target) as client:
        for index in range(NEWCOMERS):
            stream = client.stream_codes(TEXT, voice=VOICE, seed=300 + index, max_frames=8, chunking=[1])
            async for _ in stream:
                pass
            seconds.append(stream.first_chunk_at - stream.opened_at)
    return seconds


def test_streamed_texts_idle_in_every_engine_slot_leave_a_newcomer_served_at_once(lane_server, lane, lane_report):
    """Every request slot of the engine held by a streamed text that spoke its words and waits for
    more (the lane's server gives one client every slot: the engine sees no identities, so this is
    what any number of identities holding every slot between them comes to). On main a newcomer
    waited until the holders ended; now they give way while idle (scheduler.py)."""
    slots = yaml.safe_load(lane.deploy_config.read_text())["stages"][0]["max_num_seqs"]

    async def run() -> tuple[list[float], list[float], int]:
        quiet = await newcomer_first_chunks(lane_server.target)
        clients = [AsyncClient(lane_server.target) for _ in range(-(-slots // HOLDERS_PER_CONNECTION))]
        holders = []
        try:
            for index in range(slots):
                text = clients[index // HOLDERS_PER_CONNECTION].stream_text(
                    "Hello there, and", voice=VOICE, seed=400 + index, max_frames=LONG_FRAMES
                )
                await text.codes.open()
                holders.append(text)
            # Each has spoken what it had (its first chunk came) and now waits for more words.
            await asyncio.gather(*(anext(aiter(holder.codes)) for holder in holders))
            beside = await newcomer_first_chunks(lane_server.target)
            still_open = sum(holder.codes.end is None for holder in holders)
            for holder in holders:
                await holder.codes.cancel()
        finally:
            for client in clients:
                await client.close()
        return quiet, beside, still_open

    quiet, beside, still_open = asyncio.run(run())
    finding = {
        "slots_held": slots,
        "newcomers": NEWCOMERS,
        "quiet_first_chunk_ms": [round(s * 1000, 1) for s in quiet],
        "beside_idle_holders_first_chunk_ms": [round(s * 1000, 1) for s in beside],
        "median_ratio": round(float(np.median(beside) / np.median(quiet)), 2),
    }
    lane_report.add("idle_holders_in_every_slot", finding)
    print(f"newcomers beside {slots} idle streamed texts: {finding}")
    assert still_open == slots, "holders ended before the newcomers were served: they were not served beside them"
    wait_for(lambda: lane_server.metric("codecstream_streams_active") == 0, 60, "no stream left active")


# -- 7. the engine killed (last: it restarts the engine) ---------------------------------------------


def serving(server) -> bool:
    if server.process.poll() is not None:
        raise AssertionError(f"the server exited with status {server.process.returncode}\n{server.log_tail()}")
    return server.health() == SERVING


def test_a_killed_engine_turns_health_not_serving_ends_running_streams_with_error_and_is_restarted(
    lane_server, lane_report
):
    assert lane_server.health() == SERVING
    restarts = lane_server.metric("codecstream_engine_restarts_total")

    async def kill_while_streaming():
        async with AsyncClient(lane_server.target) as client:
            streams = [
                client.stream_codes(f"Running stream {index}.", voice=VOICE, seed=200 + index,
                                    max_frames=LONG_FRAMES, chunking=[1])
                for index in range(4)
            ]  # fmt: skip
            for stream in streams:  # each one is generating
                await anext(stream)
            cores = lane_server.engine_cores()
            assert cores, f"no engine-core process under the server (pid {lane_server.process.pid})"
            for core in cores:
                core.kill()
            killed_at = time.monotonic()
            await asyncio.to_thread(wait_for, lambda: lane_server.health() == NOT_SERVING, 60, "health NOT_SERVING")
            not_serving_s = time.monotonic() - killed_at
            ends = []
            for stream in streams:
                with pytest.raises(StreamEnded) as ended:
                    async for _ in stream:
                        pass
                ends.append(ended.value.end)
            with pytest.raises(Unavailable):
                await client.stream_codes("Too early.", voice=VOICE).open()
        return killed_at, not_serving_s, ends, len(cores)

    killed_at, not_serving_s, ends, killed = asyncio.run(kill_while_streaming())
    for end in ends:
        assert end.reason == pb.END_REASON_ERROR and "engine" in end.message, end
    assert lane_server.metric("codecstream_engine_up") == 0

    wait_for(lambda: serving(lane_server), START_TIMEOUT_S, "health SERVING after the restart", step_s=0.5)
    serving_again_s = time.monotonic() - killed_at
    assert lane_server.metric("codecstream_engine_up") == 1
    assert lane_server.metric("codecstream_engine_restarts_total") == restarts + 1

    async def after_restart():
        async with AsyncClient(lane_server.target) as client:
            stream = client.stream_codes(TEXT, voice=VOICE, seed=3, max_frames=WHOLE_FRAMES)
            return stream, [chunk async for chunk in stream]

    before = streams_started(lane_server)
    stream, chunks = asyncio.run(after_restart())
    assert_complete_and_in_order(chunks, stream.end, WHOLE_FRAMES, "stream after the restart")
    lane_report.first_chunk("whole_text", "first after the restart", stream.first_chunk_at - stream.opened_at, before)
    lane_report.add(
        "engine_restart",
        {
            "engine_processes_killed": killed,
            "not_serving_after_kill_s": round(not_serving_s, 3),
            "serving_again_after_kill_s": round(serving_again_s, 1),
        },
    )

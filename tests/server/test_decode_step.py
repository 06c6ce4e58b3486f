"""The decode-only step (engine/decode_step.py) on the real CPU engine: the steps that only decode
are prepared on codecstream's path, and every request's codes equal those vLLM-Omni's own path
gives (an engine started with it off): seeded requests alone and three at once, a text long enough
that its read part is dropped mid-stream, and a streamed text that grows as it arrives."""

from __future__ import annotations

import asyncio

import pytest
from codecstream.server.engine.decode_step import ENABLE_VARIABLE
from codecstream.server.request import SynthesisRequest
from codecstream.server.source import Frames

from tests.server.test_growing_text import REPLY, llm_tokens, speak

#: Over 64 text rows: upstream drops the read rows of a trailing text at frame 64 (compaction), and
#: both paths must do it at the same frame.
LONG_TEXT = " ".join(
    [
        "The morning train left the station a little after six, carrying commuters, students and",
        "a few tired travellers who had missed the last connection of the night before. Outside,",
        "the fields were still grey with frost, and the river ran high after a week of rain that",
        "had kept everyone indoors, reading, cooking, and waiting for the weather to turn at last.",
    ]
)


def request(text: str, seed: int, max_frames: int) -> SynthesisRequest:
    return SynthesisRequest(text=text, voice="ryan", seed=seed, max_frames=max_frames)


async def codes_of(source, synthesis: SynthesisRequest, stream_id: str) -> bytes:
    generation = await source.open(synthesis, stream_id)
    return b"".join([event.codes.tobytes() async for event in generation if isinstance(event, Frames)])


def spoken(engine) -> dict[str, bytes]:
    """What each case says on `engine`: a whole text alone, three at once, and the long text as a
    growing request (which reads every text row before it may end), given at once and streamed."""
    source = engine.source

    async def together() -> list[bytes]:
        texts = ["Three at once, each its own seed.", "Another one beside it.", "A third, the shortest."]
        cases = [request(text, seed, 96) for seed, text in enumerate(texts, start=21)]
        return list(await asyncio.gather(*(codes_of(source, case, f"together-{i}") for i, case in enumerate(cases))))

    results = {"alone": engine.run(codes_of(source, request(REPLY, 7, 96), "alone"))}
    for index, codes in enumerate(engine.run(together())):
        results[f"together {index}"] = codes
    at_once = engine.run(speak(source, [(LONG_TEXT, 0.0)], "long-at-once"))
    results["long text, growing, given at once"] = at_once.codes.tobytes()
    streamed = engine.run(speak(source, [(token, 0.01) for token in llm_tokens(LONG_TEXT)], "long-streamed"))
    results["long text, growing, streamed"] = streamed.codes.tobytes()
    return results


@pytest.mark.engine
def test_decode_only_steps_give_the_codes_of_vllm_omni_s_path(tmp_path_factory, monkeypatch, talker_engine):
    from tests.server.engine_harness import start_talker_engine, stop_talker_engine

    monkeypatch.setenv(ENABLE_VARIABLE, "0")  # the engine process inherits it
    upstream = start_talker_engine(tmp_path_factory.mktemp("upstream-step-engine"))
    try:
        steps_before = talker_engine.run(talker_engine.source.decode_only_steps())
        ours = spoken(talker_engine)
        steps = talker_engine.run(talker_engine.source.decode_only_steps()) - steps_before
        theirs = spoken(upstream)
        assert upstream.run(upstream.source.decode_only_steps()) == 0
    finally:
        stop_talker_engine(upstream)
    # Most steps decode only: the long requests' frames alone come to well over a hundred of them.
    assert steps > 100, steps
    frame_bytes = 16 * 2  # int16 codes
    assert len(ours["long text, growing, streamed"]) > 64 * frame_bytes, "it must pass the compaction at frame 64"
    for case, codes in ours.items():
        assert codes == theirs[case], case

"""The code predictor's seeded noise (engine/code_predictor_noise.py): a row's noise is a function of
its request's seed and frame only, whatever row or batch it lands in; and on the real CPU engine as
shipped (the noise on by default), a seeded request gives the same codes alone, beside another stream, and however its
streamed text arrives (on CUDA the noise drawn from the request's generator did not reach the code
predictor inside its graph: codebooks 1-15 differed from the first frame, docs/server.md)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from codecstream.server.engine.code_predictor_noise import ENABLE_VARIABLE, CodePredictorNoise, enabled


def info(seed: int | None, frame: int, prompt_len: int = 20) -> dict:
    return {"_omni_seed": seed, "_omni_prompt_len": prompt_len, "_omni_num_computed_tokens": prompt_len + frame}


def drawn(infos: list[dict]) -> torch.Tensor:
    noise = CodePredictorNoise(rows=8, steps=15, vocabulary=64, device="cpu")
    noise.start_step()
    noise.fill(infos[:2])
    noise.fill(infos[2:])  # the runner lines decode rows up in several groups
    return noise.rows(len(infos)).clone()


def test_the_noise_is_drawn_here_unless_switched_off(monkeypatch):
    monkeypatch.delenv(ENABLE_VARIABLE, raising=False)
    assert enabled()
    monkeypatch.setenv(ENABLE_VARIABLE, "0")
    assert not enabled()


def test_a_seeded_row_s_noise_depends_on_its_seed_and_frame_only():
    alone = drawn([info(7, 3)])[0]
    in_a_batch = drawn([info(None, 0), info(1, 3), info(7, 3, prompt_len=41), info(7, 4)])
    assert torch.equal(in_a_batch[2], alone)  # another row, another prompt length, same seed and frame
    assert not torch.equal(in_a_batch[3], alone)  # the next frame
    assert not torch.equal(in_a_batch[1], alone)  # another seed
    assert bool(((in_a_batch > 0) & (in_a_batch < 1)).all())


def test_unseeded_rows_get_fresh_noise_of_their_own_every_step():
    noise = CodePredictorNoise(rows=4, steps=15, vocabulary=64, device="cpu")
    noise.start_step()
    noise.fill([info(None, 0), info(5, 0), info(None, 0)])
    first = noise.rows(3).clone()
    noise.start_step()
    noise.fill([info(None, 1), info(5, 0), info(None, 1)])
    second = noise.rows(3)
    assert not torch.equal(first[0], first[2])  # two unseeded rows of one step
    assert not torch.equal(first[0], second[0]) and not torch.equal(first[2], second[2])
    assert torch.equal(first[1], second[1])  # the seeded row, same seed and frame
    assert bool(((second > 0) & (second < 1)).all())


def test_each_step_fills_from_the_first_row_and_a_step_cannot_overflow_the_buffer():
    noise = CodePredictorNoise(rows=2, steps=15, vocabulary=8, device="cpu")
    noise.start_step()
    noise.fill([info(1, 0), info(2, 0)])
    first = noise.rows(1).clone()
    noise.start_step()
    noise.fill([info(1, 0)])
    assert torch.equal(noise.rows(1), first)
    with pytest.raises(RuntimeError, match="more decode rows in one step than the 2"):
        noise.fill([info(3, 0), info(4, 0)])


@pytest.mark.engine
def test_on_the_engine_a_seeded_request_gives_the_same_codes_alone_beside_another_and_streamed(
    tmp_path_factory, monkeypatch, talker_engine
):
    from codecstream.server.limits import ServerLimits
    from codecstream.server.request import SynthesisRequest
    from codecstream.server.source import Frames
    from codecstream.server.text_input import StreamedText

    from tests.server.engine_harness import start_talker_engine, stop_talker_engine

    engine = talker_engine  # the suite's engine, started as shipped: the noise on
    monkeypatch.setenv(ENABLE_VARIABLE, "0")  # the engine process inherits it
    noise_off = start_talker_engine(tmp_path_factory.mktemp("noise-off-engine"))
    text = "A seeded sentence, spoken the same way every time."
    request = SynthesisRequest(text=text, voice="ryan", seed=11, max_frames=30)

    async def codes_of(generation) -> bytes:
        return b"".join([event.codes.tobytes() async for event in generation if isinstance(event, Frames)])

    async def beside() -> bytes:
        neighbour = await engine.source.open(SynthesisRequest(text="Another one.", voice="ryan", max_frames=60), "n")
        reading = asyncio.ensure_future(codes_of(neighbour))
        codes = await codes_of(await engine.source.open(request, "beside"))
        await reading
        return codes

    async def streamed(pieces: list[str]) -> bytes:
        limits = ServerLimits()
        streamed_text = StreamedText("", limits)
        growing = SynthesisRequest(text="", voice="ryan", seed=11, max_frames=30, streamed_text=streamed_text)
        generation = await engine.source.open_streamed(growing, f"streamed-{len(pieces)}", limits)

        async def write() -> None:
            for index, piece in enumerate(pieces):
                streamed_text.push(piece, flush=False, end_of_input=index == len(pieces) - 1)
                await asyncio.sleep(0.2)

        writing = asyncio.ensure_future(write())
        codes = await codes_of(generation)
        await writing
        return codes

    try:
        alone = engine.run(codes_of(engine.run(engine.source.open(request, "alone"))))
        # The same weights and request on an engine whose code predictor draws from the request's
        # generator: other codes, so the noise drawn here is what decided them.
        off = noise_off.run(codes_of(noise_off.run(noise_off.source.open(request, "noise off"))))
        assert off[:2] == alone[:2] and off != alone  # the talker's first code alike, the rest not
        assert engine.run(codes_of(engine.run(engine.source.open(request, "again")))) == alone
        assert engine.run(beside()) == alone
        whole = engine.run(streamed([text]))
        assert engine.run(streamed([text[:9], text[9:23], text[23:]])) == whole
    finally:
        stop_talker_engine(noise_off)

"""The talker's repetition penalty on the device (engine/repetition_penalty.py): the logits equal
vLLM's own penalty on the same histories, rows are cleared when reused, a request's penalty goes
back to vLLM where no talker shares the scheduler's process; and on the real CPU engine seeded
requests give the codes vLLM's sampler gives them, alone and three at once."""

from __future__ import annotations

import asyncio
import types

import pytest
import torch
from codecstream.server.engine.repetition_penalty import (
    ENABLE_VARIABLE,
    EXTRA_ARGS_KEY,
    DevicePenalties,
    take_from_vllm,
)

VOCABULARY = 40


def vllm_penalized(logits, prompts, outputs, penalties):
    """vLLM's sampler's penalty: the same function on its padded token tensors."""
    from vllm.model_executor.layers.utils import apply_penalties

    def padded(rows):
        width = max(1, max(len(row) for row in rows))
        return torch.tensor([row + [VOCABULARY] * (width - len(row)) for row in rows], dtype=torch.long)

    zeros = torch.zeros(len(penalties))
    return apply_penalties(
        logits.clone().float(), padded(prompts), padded(outputs), zeros, zeros, torch.tensor(penalties)
    )


def admitted(table: DevicePenalties, request_id: str, penalty: float) -> None:
    table.admit(request_id, types.SimpleNamespace(extra_args={EXTRA_ARGS_KEY: penalty}, repetition_penalty=1.0))


def test_the_logits_equal_vllm_s_penalty_over_prompts_and_sampled_ids():
    generator = torch.Generator().manual_seed(5)
    table = DevicePenalties()
    table.attach(VOCABULARY, rows=2, device="cpu")  # fewer rows than requests: the table grows
    ids, penalties = ["a", "b", "c", "d"], [1.3, 1.0, 0.7, 2.0]
    for request_id, penalty in zip(ids, penalties, strict=True):
        if penalty != 1.0:  # take_from_vllm leaves 1.0 with vLLM: such a request is never admitted
            admitted(table, request_id, penalty)
    prompts = [torch.randint(0, VOCABULARY, (length,), generator=generator).tolist() for length in (5, 3, 1, 7)]
    for request_id, prompt in zip(ids, prompts, strict=True):
        table.mark([request_id], torch.tensor(prompt))  # each prefill
    outputs: list[list[int]] = [[], [], [], []]
    for _ in range(6):  # decode steps: each row's input is the id it sampled last
        sampled = torch.randint(0, VOCABULARY, (4,), generator=generator)
        table.mark(ids, sampled)
        for row, token in zip(outputs, sampled.tolist(), strict=True):
            row.append(token)
        logits = torch.randn(4, VOCABULARY, generator=generator, dtype=torch.bfloat16)
        expected = vllm_penalized(logits, prompts, outputs, penalties)
        got = table.apply(logits.clone(), ids)
        assert got.dtype == torch.float32
        assert torch.equal(got, expected)


def test_ids_outside_the_vocabulary_are_ignored_and_unknown_requests_untouched():
    table = DevicePenalties()
    table.attach(VOCABULARY, rows=4, device="cpu")
    admitted(table, "a", 2.0)
    table.mark(["a"], torch.tensor([-1, VOCABULARY, VOCABULARY + 7, 3]))
    table.mark(["a", "not-penalized"], torch.tensor([4, 5]))
    logits = torch.ones(2, VOCABULARY)
    got = table.apply(logits.clone(), ["a", "not-penalized"])
    assert [index for index, value in enumerate(got[0].tolist()) if value != 1.0] == [3, 4]
    assert torch.equal(got[1], logits[1])


def test_a_freed_row_is_cleared_before_its_next_request_uses_it():
    table = DevicePenalties()
    table.attach(VOCABULARY, rows=1, device="cpu")
    admitted(table, "first", 2.0)
    table.mark(["first"], torch.tensor([1, 2, 3]))
    table.release("first")
    admitted(table, "second", 2.0)
    table.mark(["second"], torch.tensor([9]))
    got = table.apply(torch.ones(1, VOCABULARY), ["second"])
    assert [index for index, value in enumerate(got[0].tolist()) if value != 1.0] == [9]
    assert len(table) == 1


def test_a_decode_batch_that_changes_marks_its_own_rows():
    # A step reuses the last step's rows while its batch is the same: a freed request, a new one in
    # its place, another order, a request penalized only now, must each mark their own rows.
    table = DevicePenalties()
    table.attach(VOCABULARY, rows=2, device="cpu")
    admitted(table, "a", 2.0)
    admitted(table, "b", 2.0)
    table.mark(["a", "b"], torch.tensor([1, 2]))
    table.mark(["a", "b"], torch.tensor([3, 4]))
    table.release("a")
    admitted(table, "c", 2.0)  # takes a's freed row
    table.mark(["c", "b"], torch.tensor([5, 6]))
    table.mark(["b", "c"], torch.tensor([7, 8]))
    table.mark(["b", "d"], torch.tensor([9, 10]))  # d is not penalized yet
    admitted(table, "d", 2.0)
    table.mark(["b", "d"], torch.tensor([11, 12]))

    def penalized(request_id):
        got = table.apply(torch.ones(1, VOCABULARY), [request_id])
        return [index for index, value in enumerate(got[0].tolist()) if value != 1.0]

    assert penalized("b") == [2, 4, 6, 7, 9, 11]
    assert penalized("c") == [5, 8]
    assert penalized("d") == [12]


def test_a_batch_without_penalized_rows_is_returned_as_it_came():
    table = DevicePenalties()
    table.attach(VOCABULARY, rows=2, device="cpu")
    logits = torch.ones(2, VOCABULARY, dtype=torch.bfloat16)
    assert table.apply(logits, ["x", "y"]) is logits
    admitted(table, "x", 1.5)  # admitted but not yet run: nothing seen, nothing to scale
    assert table.apply(logits, ["x", "y"]) is logits


def test_the_penalty_moves_from_vllm_unless_switched_off(monkeypatch):
    monkeypatch.delenv(ENABLE_VARIABLE, raising=False)
    params = types.SimpleNamespace(repetition_penalty=1.05, extra_args={"tts_local_seed": 3})
    take_from_vllm(params)
    assert params.repetition_penalty == 1.0
    assert params.extra_args == {"tts_local_seed": 3, EXTRA_ARGS_KEY: 1.05}
    neutral = types.SimpleNamespace(repetition_penalty=1.0, extra_args=None)
    take_from_vllm(neutral)
    assert neutral.extra_args is None
    monkeypatch.setenv(ENABLE_VARIABLE, "0")
    kept = types.SimpleNamespace(repetition_penalty=1.05, extra_args=None)
    take_from_vllm(kept)
    assert kept.repetition_penalty == 1.05 and kept.extra_args is None


def test_without_a_talker_in_this_process_vllm_s_sampler_gets_the_penalty_back():
    table = DevicePenalties()  # nothing attached: the worker runs in another process
    params = types.SimpleNamespace(repetition_penalty=1.0, extra_args={EXTRA_ARGS_KEY: 1.2})
    table.admit("a", params)
    assert params.repetition_penalty == 1.2
    assert len(table) == 0


@pytest.mark.engine
def test_on_the_engine_seeded_requests_give_the_codes_of_vllm_s_penalty(tmp_path_factory, monkeypatch, talker_engine):
    from codecstream.server.request import SamplingOverrides, SynthesisRequest
    from codecstream.server.source import Frames

    from tests.server.engine_harness import start_talker_engine, stop_talker_engine

    monkeypatch.setenv(ENABLE_VARIABLE, "0")  # the engine process inherits it
    vllm_sampler = start_talker_engine(tmp_path_factory.mktemp("vllm-penalty-engine"))
    text = "A penalty that scales every id a stream has said."

    def request(seed: int, penalty: float) -> SynthesisRequest:
        overrides = SamplingOverrides(repetition_penalty=penalty)
        return SynthesisRequest(text=text, voice="ryan", seed=seed, max_frames=24, sampling=overrides)

    async def codes_of(generation) -> bytes:
        return b"".join([event.codes.tobytes() async for event in generation if isinstance(event, Frames)])

    async def together(engine, requests) -> list[bytes]:
        # Three at once, each its own penalty: a row applied to the wrong request shows.
        generations = [await engine.source.open(r, f"together-{i}") for i, r in enumerate(requests)]
        return list(await asyncio.gather(*(codes_of(generation) for generation in generations)))

    def alone(engine, r) -> bytes:
        return engine.run(codes_of(engine.run(engine.source.open(r, "alone"))))

    # A random tiny talker's logits are small: a penalty far below 1 (seen ids favoured a
    # thousandfold) is what changes its sampling visibly.
    requests = [request(3, 1e-3), request(4, 1.0), request(5, 30.0)]
    try:
        strong = alone(talker_engine, requests[0])
        assert len(strong) >= 4 * 16 * 2, len(strong) // 32
        assert alone(talker_engine, request(3, 1.0)) != strong  # the penalty changes what is said
        assert alone(vllm_sampler, requests[0]) == strong
        assert talker_engine.run(together(talker_engine, requests)) == vllm_sampler.run(
            together(vllm_sampler, requests)
        )
    finally:
        stop_talker_engine(vllm_sampler)

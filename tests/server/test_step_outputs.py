"""A step's outputs in batch operations (engine/step_outputs.py): each request's last hidden row from
one gather, only the client's codes in the output, no frame-valid mark to copy per request; and on
the real CPU engine, seeded requests give the same codes as upstream's per-request path, alone,
beside others and streamed."""

from __future__ import annotations

import asyncio

import pytest
import torch
from codecstream.server.engine.step_outputs import (
    ASYNC_COPY_VARIABLE,
    ENABLE_VARIABLE,
    async_copy_enabled,
    client_codes,
    drop_code2wav_meta,
    enabled,
    keep_last_hidden,
)


def test_on_unless_switched_off(monkeypatch):
    monkeypatch.delenv(ENABLE_VARIABLE, raising=False)
    monkeypatch.delenv(ASYNC_COPY_VARIABLE, raising=False)
    assert enabled() and async_copy_enabled()
    monkeypatch.setenv(ENABLE_VARIABLE, "0")
    monkeypatch.setenv(ASYNC_COPY_VARIABLE, "0")
    assert not enabled() and not async_copy_enabled()


def test_each_request_keeps_the_last_row_of_its_own_span_as_a_fresh_tensor():
    hidden = torch.arange(7 * 3, dtype=torch.float32).reshape(7, 3)
    # A 3-token prefill chunk, a decode row, a request with nothing scheduled, a decode row, padding.
    infos = [{"hidden_states": {"trailing_text": "kept"}}, {}, {"hidden_states": {"last": "old"}}, {"x": 1}]
    keep_last_hidden(hidden, infos, [(0, 3), (3, 4), (4, 4), (4, 5)])
    assert torch.equal(infos[0]["hidden_states"]["last"], hidden[2])
    assert infos[0]["hidden_states"]["trailing_text"] == "kept"
    assert torch.equal(infos[1]["hidden_states"]["last"], hidden[3])
    assert infos[2]["hidden_states"]["last"] == "old"  # nothing computed for it this step
    assert torch.equal(infos[3]["hidden_states"]["last"], hidden[4])
    hidden.zero_()  # the next graph replay overwrites its output buffer
    assert infos[3]["hidden_states"]["last"].tolist() == [12.0, 13.0, 14.0]


def test_without_the_runner_s_spans_no_row_is_guessed():
    with pytest.raises(RuntimeError, match="gave 1 request token spans for 2 requests"):
        keep_last_hidden(torch.zeros(2, 3), [{}, {}], [(0, 1)])
    with pytest.raises(RuntimeError, match="gave 0 request token spans for 1 requests"):
        keep_last_hidden(torch.zeros(2, 3), [{}], None)


def test_the_output_carries_the_codes_in_batch_order_and_references_only_when_one_has_them():
    first, second = torch.full((1, 16), 1), torch.full((1, 16), 2)
    reference = torch.ones(5, 16, dtype=torch.long)
    with_meta = {"codes": {"audio": first}, "meta": {"codec_streaming": True}}
    output = client_codes([with_meta, {"codes": {"audio": second}}])
    assert list(output) == ["codes"] and list(output["codes"]) == ["audio"]
    assert output["codes"]["audio"][:, 0].tolist() == [1, 2]
    cloned = client_codes([{"codes": {"audio": first}}, {"codes": {"audio": second, "ref": reference}}])
    assert [entry.numel() for entry in cloned["codes"]["ref"]] == [0, 80]
    assert client_codes([{}, {"codes": {}}]) == {}


def test_codes_already_on_the_host_are_handed_on_as_they_are_when_the_copy_is_asynchronous():
    # On CUDA they would land in pinned memory in stream order (the GPU lane checks the codes).
    rows = [{"codes": {"audio": torch.full((1, 16), value)}} for value in (3, 4)]
    output = client_codes(rows, to_host_async=True)["codes"]["audio"]
    assert output.device.type == "cpu" and output[:, 0].tolist() == [3, 4]


def test_the_frame_valid_mark_is_dropped_and_the_rest_of_the_update_kept():
    update = {"meta": {"codec_frame_valid": torch.tensor(True), "talker_text_offset": 3}, "hidden_states": {}}
    drop_code2wav_meta(update)
    assert update == {"meta": {"talker_text_offset": 3}, "hidden_states": {}}
    drop_code2wav_meta({"hidden_states": {}})  # nothing to drop


@pytest.mark.engine
def test_on_the_engine_seeded_requests_give_upstream_s_codes(tmp_path_factory, monkeypatch, talker_engine):
    from codecstream.server.limits import ServerLimits
    from codecstream.server.request import SynthesisRequest
    from codecstream.server.source import Frames
    from codecstream.server.text_input import StreamedText

    from tests.server.engine_harness import start_talker_engine, stop_talker_engine

    monkeypatch.setenv(ENABLE_VARIABLE, "0")  # the engine process inherits it
    upstream = start_talker_engine(tmp_path_factory.mktemp("per-request-outputs-engine"))
    text = "Every step's last hidden row decides the next frame."
    requests = [SynthesisRequest(text=text, voice="ryan", seed=seed, max_frames=24) for seed in (3, 4, 5)]

    async def codes_of(generation) -> bytes:
        return b"".join([event.codes.tobytes() async for event in generation if isinstance(event, Frames)])

    async def together(engine) -> list[bytes]:
        # Three at once: their rows share each step, so a row kept for the wrong request shows.
        generations = [await engine.source.open(request, f"together-{i}") for i, request in enumerate(requests)]
        return list(await asyncio.gather(*(codes_of(generation) for generation in generations)))

    async def streamed(engine) -> bytes:
        limits = ServerLimits()
        streamed_text = StreamedText("", limits)
        growing = SynthesisRequest(text="", voice="ryan", seed=3, max_frames=24, streamed_text=streamed_text)
        generation = await engine.source.open_streamed(growing, "streamed", limits)
        for index, piece in enumerate((text[:12], text[12:30], text[30:])):
            streamed_text.push(piece, flush=False, end_of_input=index == 2)
        return await codes_of(generation)

    try:
        alone = [talker_engine.run(codes_of(talker_engine.run(talker_engine.source.open(r, "a")))) for r in requests]
        assert len(set(alone)) == 3, [len(codes) // 32 for codes in alone]
        assert all(len(codes) >= 4 * 16 * 2 for codes in alone), [len(codes) // 32 for codes in alone]
        assert upstream.run(codes_of(upstream.run(upstream.source.open(requests[0], "a")))) == alone[0]
        assert talker_engine.run(together(talker_engine)) == alone
        assert upstream.run(together(upstream)) == alone
        assert talker_engine.run(streamed(talker_engine)) == upstream.run(streamed(upstream))
    finally:
        stop_talker_engine(upstream)

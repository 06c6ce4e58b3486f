"""Voice clone (Base) on the real engine: the talker encodes the reference audio itself, and the
stream carries those reference codes (the client's decoder context) before any frame."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import soundfile
from codecstream.server.source import RequestRejected, StopReason, SynthesisRequest, TaskType

from tests.server.engine_harness import start_talker_engine, stop_talker_engine

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def base_engine(tmp_path_factory):
    # Module scope: this second engine is gone before other modules' tests run.
    engine = start_talker_engine(tmp_path_factory.mktemp("qwen3-tts-tiny-base"), variant="base")
    try:
        yield engine
    finally:
        stop_talker_engine(engine)


def reference_wav(seconds: float, rate: int) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    samples = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * np.random.default_rng(0).standard_normal(t.size)
    out = io.BytesIO()
    soundfile.write(out, samples.astype(np.float32), rate, format="WAV")
    return out.getvalue()


def clone_request(reference_text: str, reference_audio: bytes | None = None) -> SynthesisRequest:
    return SynthesisRequest(
        text="Say this in the reference voice.",
        task_type=TaskType.BASE,
        language="English",
        reference_audio=reference_wav(1.5, 16_000) if reference_audio is None else reference_audio,
        reference_text=reference_text,
        seed=1,
        max_frames=20,
    )


def test_in_context_clone_carries_the_reference_codes_before_the_first_frame(base_engine):
    async def open_only():
        stream = await base_engine.source.open(clone_request("This is the reference."), "icl")
        reference = stream.reference_codes.copy()
        frames = np.concatenate([frames async for frames in stream])
        return reference, frames, stream

    reference, frames, stream = base_engine.run(open_only())
    # 1.5 s of 16 kHz audio is 36000 samples at the encoder's 24 kHz: ceil(36000 / 1920) frames.
    assert reference.shape == (math.ceil(36_000 / 1_920), 16) and reference.dtype == np.int16
    assert reference.min() >= 0 and reference.max() < 2048
    assert len(frames) > 0 and frames[:, 0].min() >= 1
    assert stream.stop_reason in (StopReason.EOS, StopReason.MAX_FRAMES)
    assert base_engine.wait_for_no_live_requests() == 0


def test_clone_without_a_transcript_uses_the_speaker_embedding_and_has_no_reference_codes(base_engine):
    collected = base_engine.collect(clone_request(""), "xvector")
    assert collected.stream.reference_codes.shape == (0, 16)
    assert len(collected.codes) > 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"reference_audio": b"not audio at all"}, "reference_audio is not a readable WAV, FLAC or OGG file"),
        ({"reference_audio": reference_wav(61, 8_000)}, "reference_audio lasts 61.0 s, longer than the 60 s allowed"),
    ],
)
def test_unusable_reference_audio_is_rejected_as_invalid_argument(base_engine, fields, message):
    with pytest.raises(RequestRejected) as rejected:
        base_engine.run(base_engine.source.open(clone_request("Reference.", **fields), "bad-reference"))
    assert rejected.value.status == "INVALID_ARGUMENT" and message in rejected.value.message


def test_a_base_checkpoint_serves_only_voice_clone(base_engine):
    assert base_engine.source.supported_task_types() == [TaskType.BASE]
    with pytest.raises(RequestRejected, match="task type CustomVoice is not served by this model"):
        base_engine.run(base_engine.source.open(SynthesisRequest(text="Hi.", voice="ryan"), "custom-on-base"))

"""Server-side fixtures: the real talker engine, shared by every test of a session that asks for it."""

from __future__ import annotations

import pytest

from codecstream.server.source import SynthesisRequest
from tests.server.engine_harness import TalkerEngine, start_talker_engine, stop_talker_engine


@pytest.fixture(scope="session")
def talker_engine(tmp_path_factory) -> TalkerEngine:
    """vLLM-Omni's talker on the CPU, serving a tiny random CustomVoice checkpoint."""
    engine = start_talker_engine(tmp_path_factory.mktemp("qwen3-tts-tiny-custom-voice"))
    try:
        # The first request pays one-off costs (tokenizer load, first kernels); keep them out of timings.
        engine.collect(SynthesisRequest(text="Warm up.", voice="ryan", seed=0, max_frames=2), "warm-up")
        yield engine
    finally:
        stop_talker_engine(engine)

"""The talker's warm-up requests are requests the server's configured limits admit, not the
library's defaults (no engine is started: the warm-ups are read as the source would send them)."""

from __future__ import annotations

import pytest
from codecstream.protocol.decoding import FRAMES_PER_SECOND
from codecstream.server.engine.talker_source import VllmTalkerSource
from codecstream.server.limits import ServerLimits
from codecstream.testing.random_checkpoint import write_qwen3_tts_checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm-up-checkpoints")
    for variant in ("custom_voice", "base"):
        write_qwen3_tts_checkpoint(root / variant, preset="tiny", seed=0, variant=variant)
    return root


def test_the_voice_clone_warm_up_sends_the_shortest_reference_the_configured_limits_accept(checkpoints):
    limits = ServerLimits(min_reference_audio_s=2.0)
    source = VllmTalkerSource(str(checkpoints / "base"), limits=limits)
    ((_, request),) = source._warm_ups()
    assert request.reference.num_frames == 2.0 * FRAMES_PER_SECOND


def test_the_streamed_text_warm_up_is_held_to_the_configured_limits(checkpoints):
    limits = ServerLimits(max_text_input_s=7.0)
    source = VllmTalkerSource(str(checkpoints / "custom_voice"), limits=limits)
    source.grows_streamed_text = True
    streamed = dict(source._warm_ups())["warm_up_streamed"].streamed_text
    seconds, why = streamed.input_time_left()
    assert seconds <= 7.0
    assert why == "text input expired: it did not end within 7 s"

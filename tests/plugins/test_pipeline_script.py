"""The test support that runs a real Pipecat pipeline from a script (codecstream.testing.pipecat_pipeline)
fails a script whose wait times out instead of hanging: the pipeline waited for an EndFrame that a
failed script never sent, so a plugin defect showed as a test killed at its timeout, not a failure."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("pipecat", reason="the pipecat extra: pip install './client[pipecat]'")

from codecstream.testing.pipecat_pipeline import Until, run_script
from pipecat.frames.frames import TTSStoppedFrame
from pipecat.processors.frame_processor import FrameProcessor


class Passthrough(FrameProcessor):
    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)


@pytest.mark.asyncio
async def test_a_wait_that_times_out_fails_the_script_instead_of_hanging():
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        # Nothing ever stops: the script's 1 s wait runs out. The outer bound is a hang check.
        await asyncio.wait_for(run_script(Passthrough(), [Until(TTSStoppedFrame, timeout_s=1.0)]), 60)
    assert time.monotonic() - began < 30

"""The serving benchmark's playout model (benchmarks/gpu_serving_bench.py): underruns of a strict
player, the start-up buffer that would have avoided them, and the step's change after a soak."""

from __future__ import annotations

import pathlib
import random
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
from gpu_serving_bench import buffer_needed, playout, step_interval_change


def test_a_stream_that_keeps_ahead_never_underruns():
    # 80 ms of audio every 50 ms: each piece lands before the audio before it has played.
    arrivals = [(0.05 * i, 0.08) for i in range(20)]
    assert playout(arrivals) == (0, 0.0)
    assert buffer_needed(arrivals) == 0.0


def test_one_frame_then_a_late_long_chunk_stalls_once():
    # vLLM-Omni's stock shape: one frame (80 ms), then 25 frames (2 s) 200 ms later.
    arrivals = [(0.0, 0.08), (0.2, 2.0), (2.1, 2.0)]
    underruns, stall_s = playout(arrivals)
    assert underruns == 1
    assert stall_s == pytest.approx(0.12)
    assert buffer_needed(arrivals) == pytest.approx(0.12)


@pytest.mark.parametrize("seed", range(20))
def test_the_buffer_needed_equals_the_strict_players_stalls(seed):
    rng = random.Random(seed)
    now, arrivals = 0.0, []
    for _ in range(rng.randrange(1, 40)):
        now += rng.expovariate(10.0)
        arrivals.append((now, rng.choice((0.08, 0.16, 0.32, 0.64))))
    _, stall_s = playout(arrivals)
    assert buffer_needed(arrivals) == pytest.approx(stall_s)
    # A player that waits that long before starting has every piece by its turn to play.
    start, audio_before = arrivals[0][0] + buffer_needed(arrivals), 0.0
    for at, audio_s in arrivals:
        assert at <= start + audio_before + 1e-9
        audio_before += audio_s


def test_the_step_interval_change_after_the_soak_is_reported_per_rate():
    def row(rate, step_ms, batch):
        return {"rate": rate, "engine": {"mean_step_interval_ms": step_ms, "mean_engine_batch": batch}}

    fresh = [row(10.0, 12.0, 10.0), row(20.0, 16.0, 30.0)]
    after = [row(10.0, 12.6, 10.5), row(20.0, 16.0, 30.0), row(30.0, 20.0, 60.0)]
    changes = step_interval_change(fresh, after)
    assert changes[0] == {"rate": 10.0, "step_ms": [12.0, 12.6], "batch": [10.0, 10.5], "step_change_percent": 5.0}
    assert changes[1]["step_change_percent"] == 0.0
    # A rate measured only after the soak has nothing to compare with.
    assert changes[2] == {"rate": 30.0, "step_ms": [None, 20.0], "batch": [None, 60.0], "step_change_percent": None}

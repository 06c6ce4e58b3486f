"""Cancel and disconnect storms against the real talker engine (CPU, tiny checkpoint): a neighbouring
seeded stream is untouched, the engine frees every request, and a stopped stream costs at most
the engine step already in flight."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from codecstream.client import Client

pytestmark = pytest.mark.engine

NEIGHBOUR = {"voice": "ryan", "language": "English", "seed": 11, "max_frames": 40, "chunking": [2]}


def neighbour_codes(target: str) -> np.ndarray:
    with Client(target) as client:
        return np.concatenate([chunk.codes for chunk in client.stream_codes("The neighbour speaks.", **NEIGHBOUR)])


def storm(target: str, rounds: int) -> None:
    """Streams that are cancelled after their first chunk or dropped without a word, one after another."""
    with Client(target, resume_timeout_s=0) as client:
        for index in range(rounds):
            stream = client.stream_codes("A stream that will not be heard out.", voice="ryan", seed=100 + index)
            try:
                next(stream)
                if index % 2:
                    stream.cancel(played_frames=1)
                else:
                    stream.abandon()
            except Exception:  # a stream that ended by itself first is fine
                pass


def test_a_seeded_stream_beside_a_cancel_and_disconnect_storm_has_the_codes_it_has_on_a_quiet_server(
    engine_server,
):
    quiet = neighbour_codes(engine_server.target)
    storms = [threading.Thread(target=storm, args=(engine_server.target, 6)) for _ in range(3)]
    for thread in storms:
        thread.start()
    busy = neighbour_codes(engine_server.target)
    for thread in storms:
        thread.join(300)
    np.testing.assert_array_equal(busy, quiet)
    assert engine_server.wait_for_no_live_requests() == 0


def test_a_stopped_stream_costs_at_most_the_engine_step_in_flight(engine_server):
    metrics = engine_server.server.metrics
    before = histogram(metrics)
    storm(engine_server.target, 8)
    assert engine_server.wait_for_no_live_requests() == 0
    after = histogram(metrics)
    stops = after["count"] - before["count"]
    assert stops >= 4, "most storm streams were stopped while generating"
    # Bucket "le=1": stops after which the engine generated at most one more frame (one step).
    at_most_one_step = after["le_1"] - before["le_1"]
    assert at_most_one_step == stops, f"{stops - at_most_one_step} of {stops} stops cost more than one engine step"


def histogram(metrics) -> dict[str, float]:
    registry = metrics.registry
    return {
        "count": registry.get_sample_value("codecstream_frames_after_stop_count") or 0.0,
        "le_1": registry.get_sample_value("codecstream_frames_after_stop_bucket", {"le": "1.0"}) or 0.0,
    }

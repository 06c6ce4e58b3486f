"""A tiny decoder checkpoint the plugins decode with, and the server's metrics they are judged by (the
Pipecat pipeline driver is codecstream.testing.pipecat_pipeline)."""

from __future__ import annotations

import pytest
from codecstream.testing.random_speech_tokenizer import write_speech_tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_speech_tokenizer(tmp_path_factory.mktemp("ckpt") / "speech_tokenizer", preset="tiny", seed=0)


def sample(server, name: str, **labels: str) -> float:
    """A value of the server's Prometheus registry (0 when never set)."""
    return server.server.metrics.registry.get_sample_value(name, labels) or 0.0

"""The server's metrics the plugins are judged by (the Pipecat pipeline driver is
codecstream.testing.pipecat_pipeline)."""

from __future__ import annotations


def sample(server, name: str, **labels: str) -> float:
    """A value of the server's Prometheus registry (0 when never set)."""
    return server.server.metrics.registry.get_sample_value(name, labels) or 0.0

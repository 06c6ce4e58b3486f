"""Prometheus metrics of one server: streams, frames, time to first frame, step cadence, cancels, errors."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.12, 0.16, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


class Metrics:
    """All metrics in a registry of their own, so several servers can live in one process (tests)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.started = Counter("codecstream_streams_started", "Streams accepted", registry=r)
        self.active = Gauge("codecstream_streams_active", "Streams generating or waiting for resume", registry=r)
        self.ended = Counter("codecstream_streams_ended", "Streams ended, by End reason", ["reason"], registry=r)
        self.rejected = Counter(
            "codecstream_requests_rejected", "Requests refused, by gRPC status", ["status"], registry=r
        )
        self.frames = Counter("codecstream_frames", "Code frames generated", registry=r)
        self.time_to_first_frame = Histogram(
            "codecstream_time_to_first_frame_seconds",
            "Stream start to first generated frame",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.step_interval = Histogram(
            "codecstream_step_interval_seconds",
            "Time between successive engine outputs of a stream",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.resumes = Counter("codecstream_resumes", "Streams reattached by Resume", registry=r)
        self.errors = Counter("codecstream_errors", "Internal errors, by kind", ["kind"], registry=r)

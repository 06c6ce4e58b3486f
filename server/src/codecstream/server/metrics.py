"""Prometheus metrics of one server: streams, frames, time to first frame, step cadence, stops, the engine."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.12, 0.16, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
_FRAME_COUNT_BUCKETS = (0, 1, 2, 3, 5, 10, 25)


class Metrics:
    """All metrics in a registry of their own, so several servers can live in one process (tests)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # Every Synthesize call is counted once in calls and once in exactly one of: streams_started,
        # resumes, requests_rejected, calls_abandoned (the client left before a Header).
        self.calls = Counter("codecstream_calls", "Synthesize calls received", registry=r)
        self.abandoned = Counter(
            "codecstream_calls_abandoned", "Synthesize calls the client left before their Header", registry=r
        )
        self.started = Counter("codecstream_streams_started", "Streams accepted", registry=r)
        self.active = Gauge("codecstream_streams_active", "Streams generating or waiting for resume", registry=r)
        self.ended = Counter("codecstream_streams_ended", "Streams ended, by End reason", ["reason"], registry=r)
        self.rejected = Counter(
            "codecstream_requests_rejected", "Calls refused before a Header, by gRPC status", ["status"], registry=r
        )
        self.frames = Counter("codecstream_frames", "Code frames sent in chunks", registry=r)
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
        self.frames_after_stop = Histogram(
            "codecstream_frames_after_stop",
            "Frames the engine generated for a stream after it was stopped (cancel, disconnect, shutdown)",
            buckets=_FRAME_COUNT_BUCKETS,
            registry=r,
        )
        self.played_frames_at_cancel = Counter(
            "codecstream_played_frames_at_cancel",
            "Cancel.played_frames summed over cancelled streams (what listeners heard before a barge-in)",
            registry=r,
        )
        self.resumes = Counter("codecstream_resumes", "Streams reattached by Resume", registry=r)
        self.artifact_downloads = Counter(
            "codecstream_decoder_artifact_downloads", "DownloadDecoderArtifact calls served", registry=r
        )
        self.artifact_bytes = Counter(
            "codecstream_decoder_artifact_bytes", "Decoder artifact bytes sent to clients", registry=r
        )
        self.downloads_running = Gauge(
            "codecstream_decoder_artifact_downloads_running",
            "DownloadDecoderArtifact calls sending now (at most max_concurrent_downloads)",
            registry=r,
        )
        self.stalled_clients = Counter(
            "codecstream_stalled_clients",
            "Calls (streams and downloads) dropped because their client read nothing for the stall timeout",
            registry=r,
        )
        self.errors = Counter("codecstream_errors", "Internal errors, by kind", ["kind"], registry=r)
        self.loop_lag = Histogram(
            "codecstream_event_loop_lag_seconds",
            "How late the server's event loop ran a timer it set 0.1 s ahead (time it was blocked)",
            buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=r,
        )
        self.loop_stalls = Counter(
            "codecstream_event_loop_stalls",
            "Times the event loop ran over 0.1 s late, by cause: running (work in the loop, named in the log), "
            "not_running (not scheduled, or waiting for the GIL), unseen (the whole process stalled)",
            ["cause"],
            registry=r,
        )
        self.gc_pause = Histogram(
            "codecstream_gc_pause_seconds",
            "Python garbage collections of the server process, by generation (each blocks the event loop)",
            ["generation"],
            buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0),
            registry=r,
        )
        self.engine_up = Gauge("codecstream_engine_up", "1 while the code source can serve, else 0", registry=r)
        self.engine_start = Gauge(
            "codecstream_engine_start_seconds",
            "Seconds each phase of the engine's last start took: engine (load, compile, graphs), then each warm-up",
            ["phase"],
            registry=r,
        )
        self.engine_restarts = Counter(
            "codecstream_engine_restarts", "Times the code source was restarted after a failure", registry=r
        )

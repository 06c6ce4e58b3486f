"""Methods vLLM mixes into every engine worker (`worker_extension_cls` in the deploy YAMLs).

vLLM adds an extension class's methods to whatever worker class the platform uses (vLLM-Omni's
GPU workers on CUDA, codecstream's CPU workers here), and `AsyncOmni.collective_rpc` calls them
by name (worker_rpc.py, which takes the names from this class), so the server can ask the engine
itself what it holds instead of trusting its own books, and feed text into growing requests
(text_feed.py).
"""

from __future__ import annotations

from codecstream.server.engine.text_feed import TEXT_FEEDS


class EngineIntrospection:
    def codecstream_runner_request_count(self) -> int:
        """Requests whose state (KV-cache blocks, per-request buffers) the model runner holds."""
        return len(self.model_runner.requests)

    def codecstream_text_feeding(self) -> bool:
        """Whether requests can grow here: the scheduler shares this worker's process."""
        return TEXT_FEEDS.scheduler_attached

    def codecstream_text_open(self, request_id: str, text_ids: int, final: bool) -> None:
        TEXT_FEEDS.open(request_id, text_ids, final)

    def codecstream_text_feed(self, request_id: str, ids: list[int], final: bool) -> bool:
        return TEXT_FEEDS.feed(request_id, ids, final)

    def codecstream_text_close(self, request_id: str) -> dict[str, int] | None:
        return TEXT_FEEDS.close(request_id)

    def codecstream_text_requests_opened(self) -> int:
        """Growing requests opened since the engine started (counted by the engine)."""
        return TEXT_FEEDS.opened

    def codecstream_decode_only_steps(self) -> int:
        """Steps this worker's runner prepared on codecstream's decode-only path (decode_step.py)."""
        return getattr(self.model_runner, "decode_only_steps", 0)

    def codecstream_profile_start(self) -> None:
        """Record this worker process's CPU ops and, on CUDA, its GPU kernels until
        `codecstream_profile_stop` (benchmarks/gpu_step_profile.py: where a decode step's time goes).
        Called between steps, as every collective RPC is."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        if getattr(self, "_codecstream_profiler", None) is not None:
            raise RuntimeError("a profile is already being recorded")
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._codecstream_profiler = profile(activities=activities)
        self._codecstream_profiler.start()

    def codecstream_profile_stop(self, trace_path: str) -> None:
        """End the recording and write it as a Chrome trace (JSON) to `trace_path` on this host."""
        profiler, self._codecstream_profiler = getattr(self, "_codecstream_profiler", None), None
        if profiler is None:
            raise RuntimeError("no profile is being recorded")
        profiler.stop()
        profiler.export_chrome_trace(trace_path)

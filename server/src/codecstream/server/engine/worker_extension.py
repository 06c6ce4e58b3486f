"""Methods vLLM mixes into every engine worker (`worker_extension_cls` in the deploy YAMLs).

vLLM adds an extension class's methods to whatever worker class the platform uses (vLLM-Omni's
GPU workers on CUDA, codecstream's CPU workers here), and `AsyncOmni.collective_rpc` calls them
by name, so the server can ask the engine itself what it holds instead of trusting its own books.
"""

from __future__ import annotations


class EngineIntrospection:
    def codecstream_runner_request_count(self) -> int:
        """Requests whose state (KV-cache blocks, per-request buffers) the model runner holds."""
        return len(self.model_runner.requests)

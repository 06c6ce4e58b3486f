"""The talker's entry in vLLM's model registries: named by its path, inspected in the calling process.

vLLM inspects a model registered by path (what it supports: text generation, multimodal inputs and
the like) in a fresh interpreter, so that importing the model cannot initialize CUDA in the caller,
and caches the answer under VLLM_CACHE_ROOT/modelinfos. That interpreter imports torch, vLLM and
vLLM-Omni again: on a host with empty caches it is a whole start's worth of imports (see
docs/server.md, "Start timeline"). The talker's module initializes no CUDA when imported (the
engine's forkserver imports it before it forks, forkserver_preload.py), and every process that
inspects the talker has imported vLLM-Omni already, so it is inspected where it is asked for.
"""

from __future__ import annotations

import dataclasses

from vllm.model_executor.models.registry import _LazyRegisteredModel, _ModelInfo, _ModelRegistry


@dataclasses.dataclass(frozen=True)
class InProcessInspectedModel(_LazyRegisteredModel):
    """vLLM's lazily imported model (imported where vLLM first loads or inspects it), inspected in
    the calling process instead of a subprocess."""

    def inspect_model_cls(self) -> _ModelInfo:
        return _ModelInfo.from_model_cls(self.load_model_cls())


def register(registry: _ModelRegistry, arch: str, class_path: str) -> None:
    """Register `class_path` ("module:Class") under `arch`, as vLLM-Omni fills its own registry."""
    module_name, class_name = class_path.split(":")
    registry.models[arch] = InProcessInspectedModel(module_name=module_name, class_name=class_name)

"""Entry point of the `vllm_omni.general_plugins` group: loaded by vLLM-Omni in every process.

Registers the talker model class under its own architecture name and the talker-only pipeline
under the key that deploy YAMLs name in `pipeline:`. Must be safe to run more than once.
"""

from __future__ import annotations


def register_talker_only_pipeline() -> None:
    # The engine's process configures only vLLM's loggers: codecstream's lines there need their own.
    from codecstream.server.log_setup import log_where_unconfigured

    log_where_unconfigured()
    # Imports stay inside: this module is imported by vLLM-Omni's plugin loader before the engine
    # has configured itself, and importing model code at that point would do work in every process.
    from codecstream.server.engine import talker_registration
    from codecstream.server.engine.pipeline import (
        PIPELINE_NAME,
        TALKER_ARCH,
        TALKER_CLASS_PATH,
        TALKER_ONLY_PIPELINE,
    )
    from vllm.model_executor.models import ModelRegistry
    from vllm_omni.config.pipeline_registry import OMNI_PIPELINES, register_pipeline
    from vllm_omni.model_executor.models.registry import OmniModelRegistry

    # vLLM's ModelConfig validates the architecture against vLLM's global registry, vLLM-Omni's
    # stage configs resolve it through its own: the talker must be known to both.
    for registry in (ModelRegistry, OmniModelRegistry):
        if TALKER_ARCH not in registry.get_supported_archs():
            talker_registration.register(registry, TALKER_ARCH, TALKER_CLASS_PATH)

    if OMNI_PIPELINES.get(PIPELINE_NAME) is not TALKER_ONLY_PIPELINE:
        register_pipeline(TALKER_ONLY_PIPELINE)

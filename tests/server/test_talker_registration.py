"""The talker is inspected where vLLM asks about it, not in a fresh interpreter that imports the stack again."""

from __future__ import annotations

import pytest
from codecstream.server.engine.pipeline import TALKER_ARCH
from codecstream.server.engine.plugin import register_talker_only_pipeline


def _refuse_subprocess(_fn):
    raise AssertionError("the talker was inspected in a subprocess")


@pytest.fixture
def registries(monkeypatch, tmp_path):
    from vllm.model_executor.models import ModelRegistry, registry
    from vllm_omni.model_executor.models.registry import OmniModelRegistry

    # An empty model-info cache, as on a fresh host; a subprocess inspection fails the test.
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.setattr(registry, "_run_in_subprocess", _refuse_subprocess)
    register_talker_only_pipeline()
    return ModelRegistry, OmniModelRegistry


def test_both_registries_inspect_the_talker_in_this_process(registries):
    for registry in registries:
        info = registry.models[TALKER_ARCH].inspect_model_cls()
        assert info.architecture == "CodecStreamingQwen3TTSTalker"
        assert info.is_text_generation_model


def test_the_talker_class_loads_from_its_registered_path(registries):
    from codecstream.server.engine.talker_model import CodecStreamingQwen3TTSTalker

    for registry in registries:
        assert registry.models[TALKER_ARCH].load_model_cls() is CodecStreamingQwen3TTSTalker

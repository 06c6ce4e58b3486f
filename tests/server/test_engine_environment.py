"""The vLLM settings the server gives its engine, and the operator's own values winning over them."""

from __future__ import annotations

import os

import pytest
from codecstream.server.engine.talker_source import set_engine_environment

VARIABLES = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_FLASHINFER_SAMPLER")


@pytest.fixture
def clean_environment(monkeypatch):
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)


@pytest.mark.usefixtures("clean_environment")
def test_the_engine_runs_in_process_and_samples_without_flashinfer_jit():
    set_engine_environment()
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    # FlashInfer's sampler compiles with nvcc at a GPU engine's first start (~100 s at 1.7B).
    assert os.environ["VLLM_USE_FLASHINFER_SAMPLER"] == "0"


@pytest.mark.usefixtures("clean_environment")
def test_an_operators_value_wins(monkeypatch):
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "1")
    set_engine_environment()
    assert os.environ["VLLM_USE_FLASHINFER_SAMPLER"] == "1"

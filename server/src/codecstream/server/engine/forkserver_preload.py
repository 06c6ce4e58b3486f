"""What the engine's forkserver (engine_process.py) runs once, before it forks any engine process.

Importing torch, vLLM and vLLM-Omni by name leaves most of the engine unimported: vLLM's package
loads its parts on first use, and vLLM-Omni resolves its platform (its plugins, the patches it
applies) only when something asks for it, so an engine process forked after that alone still
imported most of the engine before it began (docs/server.md, "Start timeline"). Here the forkserver also
resolves the platforms and imports the modules an engine process runs: its engine core, worker,
model runner, attention backend and the talker's model.

None of it may ask CUDA anything: torch marks every fork of a process that did (its device
count included), and a marked child cannot use CUDA. vLLM resolves its CUDA platform through NVML
and imports its engine without touching the device, but vLLM-Omni asks the device at import (its
FP8 patch reads the compute capability, its diffusion backends the device's name). On a CUDA host
the forkserver therefore imports vLLM's side only, and each engine process imports vLLM-Omni and
the talker itself; engine_process.py checks the forkserver's children before it uses them.
"""

from __future__ import annotations

import importlib
import logging
import time

from codecstream.server.log_setup import log_where_unconfigured

log = logging.getLogger(__name__)

#: The engine process's modules past the packages' own imports, in the order it reaches them; one
#: that cannot be imported here (the CPU platform has no CUDA kernels) is left for the process.
#: On a CUDA host those that import vLLM-Omni (`imports_vllm_omni`) are left to it as well.
ENGINE_MODULES = (
    "vllm.config",
    "vllm.engine.arg_utils",
    "vllm.v1.engine.core",
    "vllm.v1.executor.uniproc_executor",
    "vllm_omni.engine.stage_engine_core_proc",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm_omni.worker.gpu_ar_worker",
    "vllm_omni.worker.gpu_ar_model_runner",
    "codecstream.server.engine.gpu_workers",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.model_executor.model_loader",
    "vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_talker",
    "codecstream.server.engine.talker_model",
    "codecstream.server.engine.code_predictor.triton_ops",
)


def imports_vllm_omni(module: str) -> bool:
    """Whether importing `module` imports vLLM-Omni (its own modules, and codecstream's engine modules
    that build on them)."""
    return module.startswith(("vllm_omni", "codecstream."))


def preload() -> None:
    log_where_unconfigured()  # the forkserver's own process: nothing configured its logging
    began = time.monotonic()
    import vllm.platforms

    # It resolves lazily, on first access: here once, not in every forked process.
    platform = vllm.platforms.current_platform
    on_cuda = platform.is_cuda_alike()
    if not on_cuda:
        import vllm_omni.platforms

        vllm_omni.platforms.current_omni_platform  # noqa: B018 - resolved on first access
    skipped = []
    for name in ENGINE_MODULES:
        if on_cuda and imports_vllm_omni(name):
            skipped.append(name)
            continue
        try:
            importlib.import_module(name)
        except Exception:  # any failure only leaves the import to the engine process
            skipped.append(name)
    log.info(
        "forkserver: %s platform, engine modules imported in %.1f s%s",
        type(platform).__name__,
        time.monotonic() - began,
        f" (left to the engine process: {', '.join(skipped)})" if skipped else "",
    )


preload()

"""One folder for everything the engine compiles once and reuses at every later start.

vLLM keeps its torch.compile / AOT artifacts under VLLM_CACHE_ROOT, Triton its kernels under
TRITON_CACHE_DIR (vLLM's sampler kernels, the "JIT kernel warmup"), FlashInfer its JIT modules and
autotuning under FLASHINFER_WORKSPACE_BASE, and Inductor what vLLM does not redirect under
TORCHINDUCTOR_CACHE_DIR. Left alone they scatter over ~/.cache and ~/.triton; pointed into one
folder, an operator keeps (or mounts, or copies between identical hosts) one thing, and a restart
of the engine, the supervisor's included, starts warm. The stage's engine process inherits the
environment, so setting it before the engine starts is enough. A variable the operator set wins.
"""

from __future__ import annotations

import os
import pathlib

#: Each library's variable and its folder under the engine cache.
VARIABLES = {
    "VLLM_CACHE_ROOT": "vllm",
    "TRITON_CACHE_DIR": "triton",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
}


def default_engine_cache() -> pathlib.Path:
    """$CODECSTREAM_ENGINE_CACHE, or $XDG_CACHE_HOME/codecstream/engine, or ~/.cache/codecstream/engine."""
    if os.environ.get("CODECSTREAM_ENGINE_CACHE"):
        return pathlib.Path(os.environ["CODECSTREAM_ENGINE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "codecstream" / "engine"


def use_engine_cache(folder: pathlib.Path) -> dict[str, str]:
    """Point every library's cache into `folder` (created); return the variables as now set."""
    folder.mkdir(parents=True, exist_ok=True)
    for variable, name in VARIABLES.items():
        os.environ.setdefault(variable, str(folder / name))
    return {variable: os.environ[variable] for variable in VARIABLES}

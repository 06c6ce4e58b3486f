"""vLLM-Omni's AR and generation model runners on vLLM's CPU worker.

Each runner class composes by inheritance: for the talker, codecstream's decode-only step first
(decode_step.py, as in the CUDA worker, gpu_workers.py); then vLLM-Omni's runner (its omni hooks: per-step
multimodal outputs, the talker's MTP code predictor, prompt embeddings), then vLLM's
CPUModelRunner (CPU device handling: no CUDA streams or events, CPU tensors in place of device
buffers, CPU kernels for the Triton helpers), then vLLM's GPUModelRunner underneath both. The
workers are vLLM's CPUWorker (thread binding, gloo, CPU memory accounting) with vLLM-Omni's
worker mixin, mirroring vLLM-Omni's own XPU workers.
"""

from __future__ import annotations

from codecstream.server.engine.decode_step import DecodeStepRunner
from vllm.logger import init_logger
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
from vllm_omni.worker.gpu_generation_model_runner import GPUGenerationModelRunner
from vllm_omni.worker.mixins import OmniWorkerMixin

logger = init_logger(__name__)


class _CudaGraphFreeTalkerMTP:
    """Lets vLLM-Omni size its talker-MTP buffers when no CUDA graphs are captured.

    `_init_talker_mtp` takes max(max_num_reqs, compilation_config.max_cudagraph_capture_size),
    and the latter is None on CPU (vLLM's CpuPlatform clears the capture sizes), which raises a
    TypeError. Treating "no graphs" as size 0 for that call gives buffers of max_num_reqs rows,
    which is all an eager runner needs. An upstream `or 0` in `_init_talker_mtp` would remove this.
    """

    def _init_talker_mtp(self) -> None:
        compilation_config = self.compilation_config
        capture_size = compilation_config.max_cudagraph_capture_size
        if capture_size is not None:
            super()._init_talker_mtp()
            return
        compilation_config.max_cudagraph_capture_size = 0
        try:
            super()._init_talker_mtp()
        finally:
            compilation_config.max_cudagraph_capture_size = capture_size


class CpuARModelRunner(DecodeStepRunner, _CudaGraphFreeTalkerMTP, GPUARModelRunner, CPUModelRunner):
    pass


class CpuGenerationModelRunner(_CudaGraphFreeTalkerMTP, GPUGenerationModelRunner, CPUModelRunner):
    pass


class _OmniCpuWorker(OmniWorkerMixin, CPUWorker):
    model_runner_cls: type

    def init_device(self) -> None:
        super().init_device()
        if self.use_v2_model_runner:
            # vLLM-Omni's hooks live in its v1 runners; its v2 runners target CUDA.
            logger.warning("codecstream CPU workers run vLLM-Omni's v1 model runner; model_runner v2 is ignored.")
            self.use_v2_model_runner = False
        # CPUWorker.init_device built vLLM's plain CPUModelRunner; the stage needs vLLM-Omni's.
        self.model_runner = self.model_runner_cls(self.vllm_config, self.device)


class CpuARWorker(_OmniCpuWorker):
    """Worker for autoregressive stages (the Qwen3-TTS talker)."""

    model_runner_cls = CpuARModelRunner


class CpuGenerationWorker(_OmniCpuWorker):
    """Worker for non-autoregressive generation stages (e.g. a code2wav decoder)."""

    model_runner_cls = CpuGenerationModelRunner

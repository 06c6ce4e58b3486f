"""vLLM-Omni's CUDA worker for the talker stage, its model runner led by codecstream's decode-only
step (decode_step.py). The CUDA deploy YAML names it as the stage's `worker_cls`; the CPU platform
plugin's workers (cpu_workers.py) carry the same runner."""

from __future__ import annotations

from codecstream.server.engine.decode_step import DecodeStepRunner
from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
from vllm_omni.worker.gpu_ar_worker import GPUARWorker


class TalkerGPUModelRunner(DecodeStepRunner, GPUARModelRunner):
    pass


class TalkerGPUWorker(GPUARWorker):
    model_runner_cls = TalkerGPUModelRunner

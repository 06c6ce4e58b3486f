"""ONNX Runtime: the torch-free backend (`pip install 'codecstream-client[onnx]'`).

Uses the CUDA execution provider when the installed onnxruntime offers it (onnxruntime-gpu, or
the Jetson builds), else the CPU provider.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

from codecstream.client.runtimes.program import NumpyTensors, TensorInfo, check_signature, missing_runtime
from codecstream.protocol.chunking import DEFAULT_RAMP
from codecstream.protocol.manifest import Manifest

_ONNX_TYPES = {"tensor(int64)": "int64", "tensor(float)": "float32", "tensor(bfloat16)": "bfloat16"}


def _import_onnxruntime():
    try:
        import onnxruntime
    except ImportError as error:
        raise missing_runtime("ONNX Runtime", "onnx", error) from None
    return onnxruntime


#: Execution providers a decoder runs on, best first; the CPU is always there.
PROVIDERS = ("CUDAExecutionProvider", "CPUExecutionProvider")


def gpu_provider() -> str | None:
    """The GPU execution provider the installed onnxruntime offers, if any."""
    available = _import_onnxruntime().get_available_providers()
    return next((p for p in PROVIDERS if p in available and p != "CPUExecutionProvider"), None)


class OnnxProgram(NumpyTensors):
    # ONNX Runtime's CPU kernels are not specialised per shape: at real size, the first call of
    # each chunk size cost what its second did (2-25 frames; docs/performance.md), so one call,
    # which sets up the session's memory arena, is enough.
    warm_up_sizes = (DEFAULT_RAMP[0],)
    #: Whether idle intra-op threads spin between ops. Spinning saves a wake-up per op on idle
    #: cores, but beside another busy process a spinning thread takes the core the lagging one
    #: needs (benchmarks/contention_bench.py measures both).
    allow_spinning = False

    @classmethod
    def session_options(cls, threads: int | None) -> Any:
        """The session options a decoder runs with (benchmarks/decoder_profile.py profiles the same)."""
        ort = _import_onnxruntime()
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.inter_op_num_threads = 1
        if threads:
            options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if cls.allow_spinning else "0")
        return options

    def __init__(self, path: pathlib.Path, manifest: Manifest, threads: int | None) -> None:
        ort = _import_onnxruntime()
        options = self.session_options(threads)
        available = ort.get_available_providers()
        providers = [p for p in PROVIDERS if p in available]
        self._session = ort.InferenceSession(str(path), options, providers=providers)
        provider = self._session.get_providers()[0].removesuffix("ExecutionProvider")
        if provider != "CPU":
            self.warm_up_sizes = DEFAULT_RAMP  # GPU providers pick kernels per shape
        self.runtime = f"onnxruntime {ort.__version__} ({provider})"
        inputs, outputs = self._session.get_inputs(), self._session.get_outputs()
        check_signature(str(path), manifest, map(_describe, inputs), map(_describe, outputs))
        self._names = [spec.name for spec in manifest.inputs]

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        return self._session.run(None, dict(zip(self._names, inputs, strict=True)))


def _describe(value) -> TensorInfo:
    """(name, shape with a name for a dynamic dimension, dtype) of a session's input or output."""
    return value.name, tuple(value.shape), _ONNX_TYPES.get(value.type, value.type)

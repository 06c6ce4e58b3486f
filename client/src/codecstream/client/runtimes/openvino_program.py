"""OpenVINO: the same `.onnx` artifact on OpenVINO's CPU runtime (`pip install 'codecstream-client[openvino]'`).

OpenVINO reads the ONNX graph itself and compiles it for the CPU it runs on, with its own
kernels and fusions; which of the two runtimes decodes faster is measured, not assumed
(benchmarks/artifact_bench.py, docs/performance.md).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from codecstream.client.runtimes.program import Program, check_signature, dimension_bounds, missing_runtime
from codecstream.protocol.manifest import Manifest, TensorSpec

_OPENVINO_TYPES = {"i64": "int64", "f32": "float32", "bf16": "bfloat16"}


def _import_openvino():
    try:
        import openvino
    except ImportError as error:
        raise missing_runtime("OpenVINO", "openvino", error) from None
    return openvino


class OpenVinoProgram(Program):
    # Each new chunk size compiles its kernels on its first call (15-55 ms more at real size), so
    # the default ramp's sizes are warmed at load, as for the torch runtimes; the last chunk of an
    # utterance may still be a size of its own and pay it once.

    @staticmethod
    def compile_config(threads: int | None) -> dict[str, Any]:
        """What the decoder is compiled with (benchmarks/contention_bench.py measures the threading)."""
        config: dict[str, Any] = {
            # On CPUs with bf16 arithmetic (AVX-512 bf16, AMX) OpenVINO would otherwise run fp32
            # graphs in bf16: a lossy decode the user did not choose.
            "INFERENCE_PRECISION_HINT": "f32",
            # One call at a time, as fast as it goes: a stream's calls follow each other.
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": 1,
            # Beside another busy process, work split in fixed halves over threads pinned to cores
            # waits for the half on the busy core: a call took as long as on one thread. Threads
            # that take work as they are free, on any core, kept the contended p99 near 2x the quiet
            # median (benchmarks/contention_bench.py).
            "TBB_PARTITIONER": "AUTO",
            "ENABLE_CPU_PINNING": False,
        }
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        return config

    def __init__(self, path: pathlib.Path, manifest: Manifest, threads: int | None) -> None:
        openvino = _import_openvino()
        core = openvino.Core()
        self._compiled = core.compile_model(core.read_model(str(path)), "CPU", self.compile_config(threads))
        self._request = self._compiled.create_infer_request()
        version = openvino.__version__.split("-")[0]
        self.runtime = f"OpenVINO {version} (CPU)"
        bounds = dimension_bounds(manifest)
        for kind, specs, ports in (
            ("inputs", manifest.inputs, self._compiled.inputs),
            ("outputs", manifest.outputs, self._compiled.outputs),
        ):
            check_signature(str(path), kind, specs, [_describe(port) for port in ports], bounds)
        self._names = [spec.name for spec in manifest.inputs]

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        # infer() copies the outputs out of the request's memory, which the next call reuses.
        results = self._request.infer(dict(zip(self._names, inputs, strict=True)), share_inputs=True)
        return list(results.values())

    def tensor(self, array: np.ndarray) -> Any:
        return np.ascontiguousarray(array, dtype=np.int64)

    def zeros(self, spec: TensorSpec) -> Any:
        return np.zeros(spec.fixed_shape(), dtype=spec.dtype)

    def samples(self, pcm: Any) -> np.ndarray:
        return np.asarray(pcm, dtype=np.float32)[0]


def _describe(port) -> tuple[str, tuple, str]:
    """(name, shape with None for a dynamic dimension, dtype) of a compiled model's port."""
    shape = tuple(dim.get_length() if dim.is_static else None for dim in port.get_partial_shape())
    element = port.get_element_type().get_type_name()
    return port.get_any_name(), shape, _OPENVINO_TYPES.get(element, element)

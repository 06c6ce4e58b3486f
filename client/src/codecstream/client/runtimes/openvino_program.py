"""OpenVINO: the same `.onnx` artifact on OpenVINO's CPU runtime (`pip install 'codecstream-client[openvino]'`).

OpenVINO reads the ONNX graph itself and compiles it for the CPU it runs on, with its own
kernels and fusions; which of the two runtimes decodes faster is measured, not assumed
(benchmarks/artifact_bench.py, docs/performance.md).

Compiling the real-size decoder takes 1.6-2.5 s, most of a process's time to a ready decoder, so
the compiled program is kept in the client's cache (openvino/sha256-<hex of the artifact>/, one
artifact's program about its own size on disk) and the next process imports it instead. Under the
artifact's sha256 OpenVINO keys it by the file (path, size, time of change), the compile
settings, its own version and the CPU, so a changed file, new settings or a new OpenVINO compile
again. CODECSTREAM_OPENVINO_CACHE=0 turns it off.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np
from codecstream.client.cache import cache_root, digest_folder_name
from codecstream.client.runtimes.program import Program, check_signature, dimension_bounds, missing_runtime
from codecstream.protocol.manifest import Manifest, TensorSpec

log = logging.getLogger(__name__)

_OPENVINO_TYPES = {"i64": "int64", "f32": "float32", "bf16": "bfloat16"}
#: Compiled artifacts kept in the cache; the least recently opened beyond these are removed.
KEPT_COMPILED_ARTIFACTS = 2


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

    def __init__(
        self, path: pathlib.Path, manifest: Manifest, threads: int | None, cache_dir: pathlib.Path | None = None
    ) -> None:
        """`cache_dir`: where OpenVINO keeps and finds the compiled program (None: compile each time)."""
        openvino = _import_openvino()
        self._compiled = _compile(openvino, path, self.compile_config(threads), cache_dir)
        self._request = self._compiled.create_infer_request()
        version = openvino.__version__.split("-")[0]
        cached = ", compiled program from the cache" if self._compiled.get_property("LOADED_FROM_CACHE") else ""
        self.runtime = f"OpenVINO {version} (CPU{cached})"
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


def _compile(openvino, path: pathlib.Path, config: dict[str, Any], cache_dir: pathlib.Path | None):
    if cache_dir is not None:
        core = openvino.Core()
        core.set_property({"CACHE_DIR": str(cache_dir)})
        # The path, not a model read here: from a path OpenVINO imports a cached program without
        # reading the graph first. It then keys the cache by the file's path, size and time of
        # change, so the folder's name is the file's sha256 (compiled_cache_dir), which the loader
        # checks against the manifest.
        try:
            return core.compile_model(str(path), "CPU", config)
        except RuntimeError as error:  # e.g. another process pruned the folder, or the disk is full
            log.warning("OpenVINO compiles without its cache %s: %s", cache_dir, error)
    return openvino.Core().compile_model(str(path), "CPU", config)


def compiled_cache_dir(artifact_sha256: str) -> pathlib.Path | None:
    """The cache folder for the compiled program of the artifact with this sha256, marked as just
    used; the least recently used folders beyond KEPT_COMPILED_ARTIFACTS are removed. None where
    CODECSTREAM_OPENVINO_CACHE=0 or the cache cannot be written (the decoder then compiles)."""
    if os.environ.get("CODECSTREAM_OPENVINO_CACHE", "1") == "0":
        return None
    name = digest_folder_name(artifact_sha256)
    if name is None:
        return None
    parent = cache_root() / "openvino"
    directory = parent / name
    try:
        directory.mkdir(parents=True, exist_ok=True)
        os.utime(directory)
        others = sorted(
            (entry for entry in parent.iterdir() if entry.is_dir() and entry != directory),
            key=lambda entry: entry.stat().st_mtime,
            reverse=True,
        )
    except OSError as error:
        log.warning("OpenVINO compiles without a cache: %s", error)
        return None
    for stale in others[KEPT_COMPILED_ARTIFACTS - 1 :]:
        shutil.rmtree(stale, ignore_errors=True)
    return directory

"""OpenVINO: the same `.onnx` artifact on OpenVINO's CPU runtime (`pip install 'codecstream-client[openvino]'`).

OpenVINO reads the ONNX graph itself and compiles it for the CPU it runs on, with its own
kernels and fusions; which of the two runtimes decodes faster is measured, not assumed
(benchmarks/artifact_bench.py, docs/performance.md). Before compiling, the graph is rewritten
into fewer, larger operations (openvino_fusion): each SnakeBeta becomes codecstream's fused
operation where it can be built (openvino_extension), parallel matrix products one.

Compiling the real-size decoder is most of a process's time to a ready decoder, so
the compiled program is kept in the client's cache (openvino/sha256-<hex of the artifact>/
program-<key>.blob, about the artifact's size on disk) and the next process imports it instead.
The folder is the artifact's sha256, which the loader checks against the manifest; the key is
what else shapes the program: the OpenVINO version, the compile settings and the operations
library. OpenVINO refuses a program compiled for a CPU with instructions this one lacks, and the
decoder then compiles again. CODECSTREAM_OPENVINO_CACHE=0 turns the cache off.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np
from codecstream.client.cache import cache_root, digest_folder_name
from codecstream.client.runtimes.openvino_extension import extension_library, warn_unavailable
from codecstream.client.runtimes.openvino_fusion import (
    REWRITES_VERSION,
    fuse_snake_beta,
    fused_count,
    merge_parallel_matmuls,
)
from codecstream.client.runtimes.openvino_import import import_openvino
from codecstream.client.runtimes.program import NumpyTensors, TensorInfo, check_signature
from codecstream.protocol.manifest import ArtifactFile, Manifest

log = logging.getLogger(__name__)

_OPENVINO_TYPES = {"i64": "int64", "f32": "float32", "bf16": "bfloat16"}
#: Compiled artifacts kept in the cache; the least recently opened beyond these are removed.
KEPT_COMPILED_ARTIFACTS = 2


class OpenVinoProgram(NumpyTensors):
    # Each new chunk size compiles its kernels on its first call (docs/performance.md), so
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

    @classmethod
    def load(
        cls, directory: pathlib.Path, artifact: ArtifactFile, manifest: Manifest, threads: int | None
    ) -> OpenVinoProgram:
        """The program of `artifact`, its compiled copy kept in the cache by the artifact's sha256."""
        return cls(directory / artifact.file, manifest, threads, compiled_cache_dir(artifact.sha256))

    def __init__(
        self, path: pathlib.Path, manifest: Manifest, threads: int | None, cache_dir: pathlib.Path | None = None
    ) -> None:
        """`cache_dir`: where the compiled program is kept and found (None: compile each time)."""
        openvino = import_openvino()
        core, library = _core(openvino)
        version = openvino.__version__.split("-")[0]
        config = self.compile_config(threads)
        blob = cache_dir / f"program-{_program_key(version, config, library)}.blob" if cache_dir else None
        self._compiled, self._mapped_blob = _import(openvino, core, blob, config)
        imported = self._compiled is not None
        if not imported:
            self._compiled = _compile(core, path, config, library, blob)
        self._request = self._compiled.create_infer_request()
        #: SnakeBeta subgraphs run as codecstream's fused operation (0 where it could not be built).
        self.fused_snake_beta = fused_count(self._compiled)
        origin = ", compiled program from the cache" if imported else ""
        self.runtime = f"OpenVINO {version} (CPU, {self.fused_snake_beta} SnakeBeta fused{origin})"
        inputs, outputs = self._compiled.inputs, self._compiled.outputs
        check_signature(str(path), manifest, map(_describe, inputs), map(_describe, outputs))
        self._names = [spec.name for spec in manifest.inputs]

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        # infer() copies the outputs out of the request's memory, which the next call reuses.
        results = self._request.infer(dict(zip(self._names, inputs, strict=True)), share_inputs=True)
        return list(results.values())


def _describe(port) -> TensorInfo:
    """(name, shape with None for a dynamic dimension, dtype) of a compiled model's port."""
    shape = tuple(dim.get_length() if dim.is_static else None for dim in port.get_partial_shape())
    element = port.get_element_type().get_type_name()
    return port.get_any_name(), shape, _OPENVINO_TYPES.get(element, element)


def compile_decoder(path: pathlib.Path, config: dict[str, Any]):
    """The artifact compiled as OpenVinoProgram compiles it, with the fused operations where they
    build, but never kept nor taken from the cache: for benchmarks that add settings (PERF_COUNT)."""
    core, library = _core(import_openvino(), wait=True)
    return _compile(core, path, config, library, None)


def _core(openvino, *, wait: bool = False):
    """(an OpenVINO Core with codecstream's operations, the library they came from or None). `wait`:
    for a library not built yet (a decoder's load does not wait: it is built in the background)."""
    core, library = openvino.Core(), extension_library(openvino, wait=wait)
    if library is None:
        return core, None
    try:
        core.add_extension(str(library))
    except RuntimeError as error:
        warn_unavailable(f"OpenVINO refused {library}: {_first_line(error)}")
        return core, None
    return core, library


def _program_key(version: str, config: dict[str, Any], library: pathlib.Path | None) -> str:
    """What shapes a compiled program besides the artifact: OpenVINO, the settings, the operations
    library (its file name carries the digest of its source and compiler), the graph rewrites."""
    operations = library.name if library is not None else "standard"
    parts = [version, repr(sorted(config.items())), operations, f"rewrites {REWRITES_VERSION}"]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _import(openvino, core, blob: pathlib.Path | None, config: dict[str, Any]):
    """(the compiled program imported from `blob`, the mapped file it lives in), or (None, None)."""
    if blob is None or not blob.is_file():
        return None, None
    try:
        # Mapped rather than read: the program's weights stay in the file's pages, and the program
        # is ready in about half the time (docs/performance.md, "Decoder runtimes on the CPU").
        mapped = np.memmap(blob, dtype=np.uint8, mode="c")
        return core.import_model(openvino.Tensor(mapped, shared_memory=True), "CPU", config), mapped
    except (OSError, ValueError, RuntimeError) as error:
        log.warning("OpenVINO compiles again: the kept program %s cannot be imported: %s", blob, _first_line(error))
        with contextlib.suppress(OSError):
            blob.unlink(missing_ok=True)
        return None, None


def _compile(core, path: pathlib.Path, config: dict[str, Any], library: pathlib.Path | None, blob: pathlib.Path | None):
    model = core.read_model(str(path))
    if library is not None:
        fuse_snake_beta(model, library)
    merge_parallel_matmuls(model)
    compiled = core.compile_model(model, "CPU", config)
    if blob is not None:
        _keep(compiled, blob)
    return compiled


def _keep(compiled, blob: pathlib.Path) -> None:
    """Write the program to `blob` (under a temporary name, then renamed: a process that opens it
    meanwhile never sees half a file) and remove the folder's programs of other keys."""
    staged = blob.with_name(f".{blob.name}.{os.getpid()}")
    try:
        with open(staged, "wb") as file:
            file.write(compiled.export_model().getbuffer())
        os.replace(staged, blob)
    except OSError as error:
        log.warning("OpenVINO could not keep the compiled program in %s: %s", blob.parent, error)
        with contextlib.suppress(OSError):
            staged.unlink(missing_ok=True)
        return
    for other in blob.parent.iterdir():
        if other != blob and other.suffix == ".blob":
            with contextlib.suppress(OSError):  # another process may have it mapped (Windows refuses)
                other.unlink(missing_ok=True)


def _first_line(error: Exception) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


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

"""ExecuTorch `.pte` programs through `executorch.runtime` (`pip install 'codecstream-client[executorch]'`).

The ExecuTorch Python runtime takes and returns torch tensors, so this backend needs torch. Its
outputs live in the program's planned memory and are overwritten by the next call: `run` copies
them out, and runs one call at a time (streams sharing the program share that memory).

A file is checked to be an ExecuTorch program (its flatbuffer's identifier) before the runtime
reads it: ExecuTorch 1.4's loader logs a wrong identifier with the file's raw bytes, its Python
binding fails to decode them as UTF-8, and the exception it throws through C++ aborts the process.
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import pathlib
import re
import sys
import threading
import types
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

from codecstream.client.runtimes.errors import DecoderLoadError
from codecstream.client.runtimes.program import TensorInfo, TorchTensors, check_signature, missing_runtime
from codecstream.protocol.manifest import Manifest

# ExecuTorch ScalarType codes reported by TensorInfo.dtype().
_SCALAR_TYPES = {4: "int64", 6: "float32", 15: "bfloat16"}


class PteProgram(TorchTensors):
    def __init__(self, path: pathlib.Path, manifest: Manifest, threads: int | None) -> None:
        try:
            import torch

            _unsafe_reset_threadpool, Runtime = _runtime()
        except ImportError as error:
            raise missing_runtime("the ExecuTorch runtime", "executorch", error) from None
        self._torch = torch
        check_identifier(path)
        if threads:
            # One XNNPACK thread pool per process: the last decoder opened sets it for all.
            _unsafe_reset_threadpool(threads)
        program = Runtime.get().load_program(path)
        self._method = program.load_method("forward")
        meta = program.metadata("forward")
        inputs = [_describe(meta.input_tensor_meta(i)) for i in range(meta.num_inputs())]
        outputs = [_describe(meta.output_tensor_meta(i)) for i in range(meta.num_outputs())]
        check_signature(str(path), manifest, inputs, outputs)
        self.runtime = f"executorch {version('executorch')} (XNNPACK)"
        self._one_call_at_a_time = threading.Lock()
        self._prime(manifest)

    def _prime(self, manifest: Manifest) -> None:
        """Run the program once on zeros with 2-frame chunks, and throw the output away.

        ExecuTorch 1.4.1 (XNNPACK), real-size stateful decoder: when the program's first execution
        has a 1-frame chunk, as a stream's first chunk has, every later chunk of another size decodes
        wrong (29.7 dB against the eager decoder, Intel Xeon, AVX-512/AMX); a first execution of 2
        frames keeps every later one right (119.1 dB), 1-frame chunks included. Not seen at tiny size.
        """
        frames = min(2, manifest.max_chunk_frames)
        sizes = {"frames": frames, "context_frames": manifest.window.context_frames if manifest.window else frames}
        inputs = []
        for spec in manifest.inputs:
            shape = [d if isinstance(d, int) else sizes.get(d, frames) for d in spec.shape]
            inputs.append(self._torch.zeros(shape, dtype=getattr(self._torch, spec.dtype)))
        self._method.execute(inputs)

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        with self._one_call_at_a_time:
            return [output.clone() for output in self._method.execute(list(inputs))]


def check_identifier(path: pathlib.Path) -> None:
    """Raise DecoderLoadError unless `path` starts as a program of the installed ExecuTorch does:
    a flatbuffer whose file identifier (bytes 4 to 8) is its schema's."""
    expected = _program_identifier()
    if expected is None:
        return  # no schema shipped beside the runtime: the runtime's own check has to do
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError as error:
        raise DecoderLoadError(f"{path} cannot be read: {error.strerror or error}") from None
    if head[4:8] != expected:
        raise DecoderLoadError(
            f"{path} is not an ExecuTorch program: its identifier is {head[4:8]!r}, "
            f"ExecuTorch {version('executorch')} reads {expected!r}"
        )


@functools.cache
def _program_identifier() -> bytes | None:
    """The `file_identifier` of the program schema installed with the runtime (program.fbs)."""
    try:
        schema = (importlib.resources.files("executorch") / "schema" / "program.fbs").read_bytes()
    except (ModuleNotFoundError, OSError):
        return None
    found = re.search(rb'file_identifier\s+"([^"]{4})"', schema)
    return found.group(1) if found else None


def _describe(info) -> TensorInfo:
    """(no name, shape with the upper bound of a dynamic dimension, dtype) of a method's tensor."""
    return None, tuple(info.sizes()), _SCALAR_TYPES.get(info.dtype(), str(info.dtype()))


def _runtime() -> tuple[Any, Any]:
    """ExecuTorch's runtime, without its exporter.

    ExecuTorch 1.4's runtime module imports `executorch.exir._warnings`, and that import runs the
    whole `executorch.exir` package first: torch.export, the capture config and every pass, 6.8 s
    of the client's ready time (Intel Xeon, 2 vCPU) for code only an export uses. While the
    runtime loads, `executorch.exir` is a bare package holding only its path, so just the module
    asked for runs; the real package is imported as usual afterwards, by whoever needs it.
    """
    bare = None
    if "executorch.exir" not in sys.modules:
        spec = importlib.util.find_spec("executorch.exir")
        if spec is not None and spec.submodule_search_locations is not None:
            bare = types.ModuleType("executorch.exir")
            bare.__spec__, bare.__path__ = spec, list(spec.submodule_search_locations)
            sys.modules["executorch.exir"] = bare
    try:
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
        from executorch.runtime import Runtime
    finally:
        if bare is not None:
            import executorch

            if sys.modules.get("executorch.exir") is bare:
                del sys.modules["executorch.exir"]
            if getattr(executorch, "exir", None) is bare:
                del executorch.exir
    return _unsafe_reset_threadpool, Runtime

"""ExecuTorch `.pte` programs (`pip install 'codecstream-client[executorch]'`): which runtime runs
them, and ExecuTorch's Python runtime.

Two runtimes run a `.pte`. codecstream's C++ runtime (`pte_native`, built on first use by
`pte_library`) is ExecuTorch's C++ runtime, the one a phone app runs, and needs no torch: it is
the one `PteProgram.load` opens. ExecuTorch's Python runtime (`executorch.runtime`, this module's
`PteProgram`) takes and returns torch tensors, so it needs torch; it runs where the C++ runtime
cannot be built (no cmake or C++ compiler), with a warning. $CODECSTREAM_PTE_RUNTIME picks one:
"native" or "python" (default "auto", as above). On the C++ runtime a program this client has not
run before runs first in a child process (`pte_trial`): a file from a server can pass every check
ExecuTorch makes at load and still crash when it runs.

The Python runtime's outputs live in the program's planned memory and are overwritten by the next
call: `run` copies them out, and runs one call at a time (streams sharing the program share that
memory).

On the Python runtime, a file is checked to be an ExecuTorch program (its flatbuffer's identifier)
before the runtime reads it: ExecuTorch 1.4's loader logs a wrong identifier with the file's raw
bytes, its Python binding fails to decode them as UTF-8, and the exception it throws through C++
aborts the process.
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import logging
import os
import pathlib
import re
import sys
import threading
import types
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

from codecstream.client.runtimes.errors import DecoderLoadError
from codecstream.client.runtimes.program import Program, TensorInfo, TorchTensors, check_signature, missing_runtime
from codecstream.protocol.manifest import ArtifactFile, Manifest

log = logging.getLogger(__name__)

#: The environment variable that picks the runtime: "auto", "native" or "python".
RUNTIME_VARIABLE = "CODECSTREAM_PTE_RUNTIME"
RUNTIMES = ("auto", "native", "python")

# ExecuTorch ScalarType codes reported by TensorInfo.dtype().
_SCALAR_TYPES = {4: "int64", 6: "float32", 15: "bfloat16"}


class PteProgram(TorchTensors):
    @classmethod
    def load(cls, directory: pathlib.Path, artifact: ArtifactFile, manifest: Manifest, threads: int | None) -> Program:
        """The program on codecstream's C++ runtime, or on ExecuTorch's Python runtime where that
        cannot be built (or where $CODECSTREAM_PTE_RUNTIME asks for it); primed either way."""
        path = directory / artifact.file
        choice = os.environ.get(RUNTIME_VARIABLE, "auto")
        if choice not in RUNTIMES:
            raise DecoderLoadError(f"{RUNTIME_VARIABLE}={choice!r}: expected one of {', '.join(RUNTIMES)}")
        if choice != "python":
            from codecstream.client.runtimes.pte_library import PteRuntimeUnavailable, pte_runtime

            try:
                build = pte_runtime()
            except PteRuntimeUnavailable as reason:
                if choice == "native" or importlib.util.find_spec("torch") is None:
                    raise DecoderLoadError(
                        f"codecstream's ExecuTorch runtime cannot be built here: {reason} "
                        "(ExecuTorch's Python runtime, the other way to run a .pte, needs torch)"
                    ) from None
                _warn_python_runtime(str(reason))
            else:
                from codecstream.client.runtimes.pte_native import NativePteProgram
                from codecstream.client.runtimes.pte_trial import start_trial

                trial = start_trial(directory, artifact)
                try:
                    program = NativePteProgram(path, manifest, threads, build)
                except BaseException:
                    if trial is not None:
                        trial.cancel()
                    raise
                if trial is not None:
                    trial.wait()
                _prime(program, manifest)
                return program
        program = cls(path, manifest, threads)
        _prime(program, manifest)
        return program

    def __init__(self, path: pathlib.Path, manifest: Manifest, threads: int | None) -> None:
        try:
            import torch

            _unsafe_reset_threadpool, Runtime = _runtime()
        except ImportError as error:
            raise missing_runtime("ExecuTorch's Python runtime (with torch)", "executorch", error) from None
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
        self.runtime = f"executorch {version('executorch')} Python runtime (XNNPACK)"
        self._one_call_at_a_time = threading.Lock()

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


def _prime(program: Program, manifest: Manifest) -> None:
    """Run the program once on zeros with 2-frame chunks, and throw the output away.

    ExecuTorch 1.4.1 (XNNPACK), real-size stateful decoder: when the program's first execution
    has a 1-frame chunk, as a stream's first chunk has, every later chunk of another size decodes
    wrong (docs/performance.md, "Measurements behind the code"); a first execution of 2 frames
    keeps every later one right, 1-frame chunks included. Not seen at tiny size,
    nor with the one-partition programs the exporter writes now; kept for `.pte` files exported before.
    """
    import numpy as np

    frames = min(2, manifest.max_chunk_frames)
    sizes = {"frames": frames, "context_frames": manifest.window.context_frames if manifest.window else frames}
    inputs = []
    for spec in manifest.inputs:
        shape = [d if isinstance(d, int) else sizes.get(d, frames) for d in spec.shape]
        inputs.append(program.tensor(np.zeros(shape, np.int64)) if spec.dtype == "int64" else program.zeros(spec))
    program.run(inputs)


def _warn_python_runtime(reason: str) -> None:
    log.warning("a .pte runs on ExecuTorch's Python runtime (torch in the process, slower to start): %s", reason)


def _describe(info) -> TensorInfo:
    """(no name, shape with the upper bound of a dynamic dimension, dtype) of a method's tensor."""
    return None, tuple(info.sizes()), _SCALAR_TYPES.get(info.dtype(), str(info.dtype()))


def _runtime() -> tuple[Any, Any]:
    """ExecuTorch's runtime, without its exporter.

    ExecuTorch 1.4's runtime module imports `executorch.exir._warnings`, and that import runs the
    whole `executorch.exir` package first: torch.export, the capture config and every pass, seconds
    of the client's ready time (docs/performance.md, "Measurements behind the code") for code only
    an export uses. While the runtime loads, `executorch.exir` is a bare package holding only its
    path, so just the module asked for runs; the real package is imported as usual afterwards, by whoever needs it.
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

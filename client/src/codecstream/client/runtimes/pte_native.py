"""ExecuTorch `.pte` programs on codecstream's C++ runtime (pte_runtime/, built by pte_library),
through ctypes: no torch in the process, as on a phone.

ctypes rather than a CPython extension: the library's C interface (codecstream_pte.h) is the one a
phone app calls (from JNI or Swift), so the Python client exercises that very interface; it needs
no Python headers to build, and one build serves every Python version that shares the ExecuTorch
install. A call moves numpy arrays' memory in and copies the outputs out of the program's planned
memory (the next call overwrites it), one call at a time per program.
"""

from __future__ import annotations

import ctypes
import functools
import pathlib
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
from codecstream.client.runtimes.errors import DecoderLoadError
from codecstream.client.runtimes.program import NumpyTensors, TensorInfo, check_signature
from codecstream.client.runtimes.pte_library import PteRuntimeBuild
from codecstream.protocol.manifest import Manifest

MAX_RANK = 8
#: ExecuTorch ScalarType codes -> numpy dtypes (codecstream_pte.h).
DTYPES = {4: np.dtype("int64"), 6: np.dtype("float32")}
_CODES = {dtype: code for code, dtype in DTYPES.items()}
#: Names of the codes the manifest may use but numpy cannot hold here.
_OTHER_DTYPES = {15: "bfloat16"}


class Tensor(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("sizes", ctypes.c_int64 * MAX_RANK),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_size_t),
    ]


class PteRuntimeError(RuntimeError):
    """A call into codecstream's ExecuTorch runtime failed; the message is the runtime's reason."""


@functools.cache
def library(path: pathlib.Path) -> ctypes.CDLL:
    """The built library at `path`, its functions typed (once per process)."""
    lib = ctypes.CDLL(str(path))
    program, tensor = ctypes.c_void_p, ctypes.POINTER(Tensor)
    signatures = {
        "cs_pte_last_error": (ctypes.c_char_p, []),
        "cs_pte_executorch_version": (ctypes.c_char_p, []),
        "cs_pte_set_threads": (ctypes.c_int, [ctypes.c_int32]),
        "cs_pte_threads": (ctypes.c_int32, []),
        "cs_pte_open": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(program)]),
        "cs_pte_close": (None, [program]),
        "cs_pte_num_inputs": (ctypes.c_int32, [program]),
        "cs_pte_num_outputs": (ctypes.c_int32, [program]),
        "cs_pte_describe": (ctypes.c_int, [program, ctypes.c_int32, ctypes.c_int32, tensor]),
        "cs_pte_run": (ctypes.c_int, [program, tensor, ctypes.c_int32]),
        "cs_pte_output": (ctypes.c_int, [program, ctypes.c_int32, tensor]),
        "cs_pte_peak_rss_bytes": (ctypes.c_int64, []),
    }
    for name, (result, arguments) in signatures.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = result, arguments
    return lib


class NativePteProgram(NumpyTensors):
    def __init__(self, path: pathlib.Path, manifest: Manifest, threads: int | None, build: PteRuntimeBuild) -> None:
        self._lib = lib = library(build.library)
        if threads:
            # One thread pool per process, as with ExecuTorch's Python runtime: the last decoder
            # opened sets it for all.
            if lib.cs_pte_set_threads(threads) != 0:
                raise DecoderLoadError(f"{path}: {self._error()}")
        handle = ctypes.c_void_p()
        if lib.cs_pte_open(str(path).encode(), ctypes.byref(handle)) != 0:
            raise DecoderLoadError(self._error())
        self._handle = handle
        self._closer = weakref.finalize(self, lib.cs_pte_close, handle)
        inputs = [self._describe(0, index) for index in range(lib.cs_pte_num_inputs(handle))]
        outputs = [self._describe(1, index) for index in range(lib.cs_pte_num_outputs(handle))]
        check_signature(str(path), manifest, [info for info, _ in inputs], [info for info, _ in outputs])
        for (_, _, dtype), code in inputs + outputs:
            if code not in DTYPES:
                raise DecoderLoadError(f"{path}: a {dtype} tensor, which this runtime's client does not hold")
        self._inputs = (Tensor * len(inputs))()
        self._outputs = len(outputs)
        self._output = Tensor()
        self.runtime = f"executorch {build.executorch_version} C++ runtime (XNNPACK)"
        self._one_call_at_a_time = threading.Lock()

    def _describe(self, output: int, index: int) -> tuple[TensorInfo, int]:
        info = Tensor()
        if self._lib.cs_pte_describe(self._handle, output, index, ctypes.byref(info)) != 0:
            raise DecoderLoadError(self._error())
        dtype = DTYPES.get(info.dtype)
        name = dtype.name if dtype is not None else _OTHER_DTYPES.get(info.dtype, f"ExecuTorch dtype {info.dtype}")
        return (None, tuple(info.sizes[: info.rank]), name), info.dtype

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        arrays = [np.ascontiguousarray(array) for array in inputs]
        with self._one_call_at_a_time:
            if len(arrays) != len(self._inputs):
                raise PteRuntimeError(f"the program takes {len(self._inputs)} inputs, {len(arrays)} given")
            for slot, array in zip(self._inputs, arrays, strict=True):
                if array.dtype not in _CODES or array.ndim > MAX_RANK:
                    raise PteRuntimeError(f"an input of dtype {array.dtype} and rank {array.ndim}")
                slot.dtype, slot.rank = _CODES[array.dtype], array.ndim
                slot.sizes[: array.ndim] = array.shape
                slot.data, slot.nbytes = array.ctypes.data, array.nbytes
            self._check(self._lib.cs_pte_run(self._handle, self._inputs, len(arrays)), "run")
            outputs = []
            for index in range(self._outputs):
                self._check(self._lib.cs_pte_output(self._handle, index, ctypes.byref(self._output)), "output")
                out = self._output
                array = np.empty(tuple(out.sizes[: out.rank]), DTYPES[out.dtype])
                if array.nbytes != out.nbytes:
                    raise PteRuntimeError(f"output {index}: {out.nbytes} bytes for shape {array.shape}")
                ctypes.memmove(array.ctypes.data, out.data, out.nbytes)
                outputs.append(array)
            return outputs

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise PteRuntimeError(f"{what}: {self._error()}")

    def _error(self) -> str:
        return self._lib.cs_pte_last_error().decode(errors="replace")

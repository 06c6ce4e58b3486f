"""`Program`: one loaded graph file, called with the backend's own tensors.

Each backend (ONNX Runtime, OpenVINO, ExecuTorch, torch.export) wraps its runtime in a Program;
the stateful and windowed decoders in `artifact.py` drive any of them the same way. Keeping
tensors native between calls matters: ExecuTorch and .pt2 state stays in torch tensors
(`TorchTensors`: bf16 has no numpy dtype), ONNX Runtime and OpenVINO state in numpy arrays
(`NumpyTensors`).
"""

from __future__ import annotations

import abc
import pathlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from codecstream.client.runtimes.errors import DecoderLoadError
from codecstream.protocol.chunking import DEFAULT_RAMP
from codecstream.protocol.manifest import ArtifactFile, Manifest, TensorSpec


class Program(abc.ABC):
    """A graph file loaded by its runtime. `runtime` names it with its version, for descriptions."""

    runtime: str
    #: Chunk sizes a decoder over this program warms at load (`LoadedDecoder.warm_up_sizes`).
    warm_up_sizes: tuple[int, ...] = DEFAULT_RAMP

    @classmethod
    def load(cls, directory: pathlib.Path, artifact: ArtifactFile, manifest: Manifest, threads: int | None) -> Program:
        """The program of `artifact` in `directory`, run on `threads` CPU threads (None: the runtime's
        default). A runtime that keeps a compiled copy overrides it to key that copy by the artifact."""
        return cls(directory / artifact.file, manifest, threads)

    @abc.abstractmethod
    def run(self, inputs: Sequence[Any]) -> list[Any]:
        """Call the graph; the outputs are owned by the caller (never views of runtime memory)."""

    @abc.abstractmethod
    def tensor(self, array: np.ndarray) -> Any:
        """A native tensor holding `array` (int64 codes or counts)."""

    @abc.abstractmethod
    def zeros(self, spec: TensorSpec) -> Any:
        """A native zero tensor of a fixed-shape spec (a fresh stream's state)."""

    @abc.abstractmethod
    def samples(self, pcm: Any) -> np.ndarray:
        """The (1, n) PCM output as an (n,) float32 numpy array."""


class NumpyTensors(Program):
    """Tensors of runtimes that take and return numpy arrays (ONNX Runtime, OpenVINO)."""

    def tensor(self, array: np.ndarray) -> Any:
        return np.ascontiguousarray(array, dtype=np.int64)

    def zeros(self, spec: TensorSpec) -> Any:
        return np.zeros(spec.fixed_shape(), dtype=spec.dtype)

    def samples(self, pcm: Any) -> np.ndarray:
        return np.asarray(pcm, dtype=np.float32)[0]


class TorchTensors(Program):
    """Tensors of runtimes that take and return torch tensors (torch.export, ExecuTorch).

    `self._torch` is the torch module, which the subclass imports when it loads (this module
    must import without torch)."""

    _torch: Any

    def tensor(self, array: np.ndarray) -> Any:
        return self._torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))

    def zeros(self, spec: TensorSpec) -> Any:
        return self._torch.zeros(spec.fixed_shape(), dtype=getattr(self._torch, spec.dtype))

    def samples(self, pcm: Any) -> np.ndarray:
        return pcm[0].float().numpy()


#: What a runtime reports of one graph input or output: (name or None, shape, dtype).
TensorInfo = tuple[str | None, tuple, str]


def check_signature(
    where: str, manifest: Manifest, inputs: Iterable[TensorInfo], outputs: Iterable[TensorInfo]
) -> None:
    """Raise DecoderLoadError unless the graph's inputs and outputs are the manifest's.

    A dimension the manifest names is compared with its upper bound (`dimension_bounds`) when the
    runtime reports that bound as an int (ExecuTorch), and not compared when the runtime keeps it
    symbolic (ONNX Runtime, OpenVINO, torch.export).
    """
    bounds = dimension_bounds(manifest)
    _check_tensors(where, "inputs", manifest.inputs, list(inputs), bounds)
    _check_tensors(where, "outputs", manifest.outputs, list(outputs), bounds)


def _check_tensors(
    where: str, kind: str, expected: Sequence[TensorSpec], actual: Sequence[TensorInfo], bounds: dict[str, int]
) -> None:
    if len(actual) != len(expected):
        raise DecoderLoadError(
            f"{where} does not match its manifest: the graph has {len(actual)} {kind}, "
            f"the manifest lists {len(expected)}"
        )
    for index, (spec, (name, shape, dtype)) in enumerate(zip(expected, actual, strict=True)):
        label = f"{kind[:-1]} {index} ({spec.name})"
        if name is not None and name != spec.name:
            raise DecoderLoadError(f"{where} does not match its manifest: {label} is named {name!r} in the graph")
        if dtype != spec.dtype:
            raise DecoderLoadError(
                f"{where} does not match its manifest: {label} is {dtype} in the graph, manifest says {spec.dtype}"
            )
        wanted = [dim if isinstance(dim, int) else bounds.get(dim) for dim in spec.shape]
        same_rank = len(shape) == len(wanted)
        if not same_rank or any(
            isinstance(a, int) and w is not None and a != w for a, w in zip(shape, wanted, strict=True)
        ):
            raise DecoderLoadError(
                f"{where} does not match its manifest: {label} has shape {list(shape)} in the graph, "
                f"manifest says {list(spec.shape)}"
            )


def dimension_bounds(manifest: Manifest) -> dict[str, int]:
    """Upper bounds of the named dimensions, as ExecuTorch reports them for memory planning."""
    bounds = {
        "frames": manifest.max_chunk_frames,
        f"frames*{manifest.codec['samples_per_frame']}": manifest.max_chunk_frames
        * manifest.codec["samples_per_frame"],
    }
    if manifest.window:
        bounds["context_frames"] = manifest.window.context_frames
    return bounds


def missing_runtime(what: str, extra: str, error: ImportError) -> DecoderLoadError:
    return DecoderLoadError(f"{what} is not installed ({error}): pip install 'codecstream-client[{extra}]'")

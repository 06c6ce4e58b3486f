"""torch.export `.pt2` programs through `torch.export.load` (`pip install 'codecstream-client[torch]'`).

The loaded graph runs eagerly, op by op, on the CPU (or wherever its tensors were exported), and
rejects a chunk longer than the declared maximum with a Python error.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from codecstream.client.runtimes.program import Program, check_signature, dimension_bounds, missing_runtime
from codecstream.protocol.manifest import Manifest, TensorSpec


class Pt2Program(Program):
    def __init__(self, path: pathlib.Path, manifest: Manifest, threads: int | None) -> None:
        try:
            import torch
        except ImportError as error:
            raise missing_runtime("torch", "torch", error) from None
        self._torch = torch
        if threads:
            torch.set_num_threads(threads)  # process-wide in torch
        exported = torch.export.load(str(path))
        bounds = dimension_bounds(manifest)
        check_signature(str(path), "inputs", manifest.inputs, _user_inputs(exported), bounds)
        check_signature(str(path), "outputs", manifest.outputs, _user_outputs(exported), bounds)
        self._module = exported.module()
        self.runtime = f"torch {torch.__version__}"

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        with self._torch.inference_mode():
            outputs = self._module(*inputs)
        return [outputs] if isinstance(outputs, self._torch.Tensor) else list(outputs)

    def tensor(self, array: np.ndarray) -> Any:
        return self._torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))

    def zeros(self, spec: TensorSpec) -> Any:
        return self._torch.zeros(spec.fixed_shape(), dtype=getattr(self._torch, spec.dtype))

    def samples(self, pcm: Any) -> np.ndarray:
        return pcm[0].float().numpy()


def _describe(value) -> tuple[None, tuple, str]:
    shape = tuple(d if isinstance(d, int) else None for d in value.shape)
    return None, shape, str(value.dtype).removeprefix("torch.")


def _user_inputs(exported) -> list[tuple[None, tuple, str]]:
    names = set(exported.graph_signature.user_inputs)
    return [
        _describe(node.meta["val"]) for node in exported.graph.nodes if node.op == "placeholder" and node.name in names
    ]


def _user_outputs(exported) -> list[tuple[None, tuple, str]]:
    output = next(node for node in exported.graph.nodes if node.op == "output")
    return [_describe(node.meta["val"]) for node in output.args[0]]

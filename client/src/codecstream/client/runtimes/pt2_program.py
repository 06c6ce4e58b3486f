"""torch.export `.pt2` programs through `torch.export.load` (`pip install 'codecstream-client[torch]'`).

The loaded graph runs eagerly, op by op, on the CPU (or wherever its tensors were exported), and
rejects a chunk longer than the declared maximum with a Python error.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

from codecstream.client.runtimes.program import TensorInfo, TorchTensors, check_signature, missing_runtime
from codecstream.protocol.manifest import Manifest


class Pt2Program(TorchTensors):
    def __init__(self, path: pathlib.Path, manifest: Manifest, threads: int | None) -> None:
        try:
            import torch
        except ImportError as error:
            raise missing_runtime("torch", "torch", error) from None
        self._torch = torch
        if threads:
            torch.set_num_threads(threads)  # process-wide in torch
        exported = torch.export.load(str(path))
        check_signature(str(path), manifest, _user_inputs(exported), _user_outputs(exported))
        self._module = exported.module()
        self.runtime = f"torch {torch.__version__}"

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        with self._torch.inference_mode():
            outputs = self._module(*inputs)
        return [outputs] if isinstance(outputs, self._torch.Tensor) else list(outputs)


def _describe(value) -> TensorInfo:
    shape = tuple(d if isinstance(d, int) else None for d in value.shape)
    return None, shape, str(value.dtype).removeprefix("torch.")


def _user_inputs(exported) -> list[TensorInfo]:
    names = set(exported.graph_signature.user_inputs)
    return [
        _describe(node.meta["val"]) for node in exported.graph.nodes if node.op == "placeholder" and node.name in names
    ]


def _user_outputs(exported) -> list[TensorInfo]:
    output = next(node for node in exported.graph.nodes if node.op == "output")
    return [_describe(node.meta["val"]) for node in output.args[0]]

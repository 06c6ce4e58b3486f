"""ExecuTorch `.pte` with the XNNPACK backend, for `executorch.runtime`.

The decoder is captured in the forms of `xnnpack_rewrites`, so that XNNPACK takes its whole body
as one graph; the codebook lookup and the attention mask (before it) and the slicing of the next
state out of each concatenation (after it) stay on ExecuTorch's portable kernels. int8 is
XNNPACK's dynamic quantization (pt2e flow): per-channel int8 weights of the linears and
(transposed) convolutions, int8 activations quantized per call; the rewrite's own linears (norm
means, RoPE's rotation) stay fp32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
from collections.abc import Iterator
from importlib.metadata import version

import torch
from codecstream.export.graphs import Graph
from codecstream.export.xnnpack_rewrites import UNQUANTIZED, delegable, infer_symbolic_reshapes


def capture(graph: Graph, dtype: str) -> torch.export.ExportedProgram:
    """The graph captured for lowering to ExecuTorch (int8: quantized first), its layers in the
    forms XNNPACK delegates (`xnnpack_rewrites`)."""
    graph = dataclasses.replace(graph, module=delegable(graph.module))
    with buffers_as_persistent(graph.module):
        if dtype == "int8":
            return quantize_int8(graph)
        return torch.export.export(graph.module, graph.example_inputs, dynamic_shapes=graph.dynamic_shapes)


@contextlib.contextmanager
def buffers_as_persistent(module: torch.nn.Module) -> Iterator[None]:
    """Every buffer of `module` persistent while it is captured.

    The decoder keeps weights it derives at load time (the sub-pixel convs' `phase_weight` and
    `phase_bias`, SnakeBeta's exponentials) as non-persistent buffers, so that a checkpoint need
    not hold them. XNNPACK takes a conv only with a constant weight and bias, and once it takes
    one, ExecuTorch 1.4's lowering puts that constant in the program's state dict, which its
    verifier refuses for a non-persistent buffer ("... is in the state dict, it should not be").
    """
    kept = [(child, set(child._non_persistent_buffers_set)) for child in module.modules()]
    for child, _ in kept:
        child._non_persistent_buffers_set.clear()
    try:
        yield
    finally:
        for child, names in kept:
            child._non_persistent_buffers_set.update(names)


def quantize_int8(graph: Graph) -> torch.export.ExportedProgram:
    """The graph with XNNPACK dynamic int8 quantization, exported again for lowering."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
    for module_type in UNQUANTIZED:
        quantizer.set_module_type(module_type, None)
    captured = torch.export.export(graph.module, graph.example_inputs, dynamic_shapes=graph.dynamic_shapes).module()
    prepared = prepare_pt2e(captured, quantizer)
    prepared(*graph.example_inputs)  # dynamic activations: this only runs the weight observers
    converted = convert_pt2e(prepared)
    # The converted module takes its inputs flat (no *state), so its dynamic shapes are flat too.
    flat = tuple(spec for group in graph.dynamic_shapes for spec in (group if isinstance(group, tuple) else (group,)))
    return torch.export.export(converted, graph.example_inputs, dynamic_shapes=flat)


def write_pte(graph: Graph, exported: torch.export.ExportedProgram, path: pathlib.Path, dtype: str) -> dict:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    lowered = to_edge_transform_and_lower(
        exported, transform_passes=[infer_symbolic_reshapes], partitioner=[XnnpackPartitioner()]
    )
    path.write_bytes(lowered.to_executorch().buffer)
    quantization = None
    if dtype == "int8":
        quantization = (
            "XNNPACK dynamic int8: per-channel int8 weights (linear, conv, transposed conv), "
            "int8 activations quantized per call"
        )
    versions = {name: version(name) for name in ("torch", "executorch", "torchao")}
    return {"runtime": "executorch", "versions": versions, "quantization": quantization}

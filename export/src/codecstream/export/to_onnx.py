"""ONNX through torch.onnx's dynamo exporter (needs onnxscript), for ONNX Runtime.

int8 is ONNX Runtime's dynamic quantization: weights of MatMul and Conv stored as per-channel
int8, activations quantized to uint8 per call from their observed range (no calibration data);
ConvTranspose and the elementwise ops stay float32.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
from importlib.metadata import version

import torch
from codecstream.export.graphs import Graph

OPSET = 18


def write_onnx(graph: Graph, exported: torch.export.ExportedProgram, path: pathlib.Path, dtype: str) -> dict:
    # The exporter prints its own progress lines; ours already say what is happening.
    with contextlib.redirect_stdout(io.StringIO()):
        program = torch.onnx.export(
            exported,
            (),
            input_names=graph.input_names,
            output_names=graph.output_names,
            opset_version=OPSET,
            dynamo=True,
            optimize=True,
        )
    quantization = None
    if dtype == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        float_path = path.with_suffix(".fp32.onnx")
        program.save(str(float_path), external_data=False)
        try:
            quantize_dynamic(
                float_path, path, op_types_to_quantize=["MatMul", "Conv"], per_channel=True, weight_type=QuantType.QInt8
            )
        finally:
            float_path.unlink(missing_ok=True)
        quantization = (
            "onnxruntime dynamic int8: per-channel int8 weights (MatMul, Conv), uint8 activations quantized per call"
        )
    else:
        program.save(str(path), external_data=False)
    versions = {name: version(name) for name in ("torch", "onnx", "onnxscript", "onnxruntime")}
    return {"runtime": "onnxruntime", "versions": versions, "quantization": quantization, "opset": OPSET}

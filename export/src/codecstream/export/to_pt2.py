"""torch.export `.pt2`: the exported program itself, loadable with `torch.export.load`.

bf16 here is the model's weights and activations in bfloat16 (the state too); bf16-mixed has
bfloat16 weights and matrix products only, everything else and the state in float32
(`codecstream.decoder.precision`). PCM comes out as float32 in both. On CPUs with AMX or AVX-512
BF16 oneDNN runs the bf16 products natively; on AVX2-only CPUs bf16 takes torch's reference
kernels, two orders of magnitude slower than fp32 (docs/performance.md).
"""

from __future__ import annotations

import pathlib

import torch
from codecstream.export.graphs import Graph


def write_pt2(graph: Graph, exported: torch.export.ExportedProgram, path: pathlib.Path, dtype: str) -> dict:
    torch.export.save(exported, str(path))
    return {"runtime": "torch", "versions": {"torch": torch.__version__}, "quantization": None}

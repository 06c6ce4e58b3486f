"""Mixed precision: bf16 weights and matrix products where they are cheap, fp32 where error grows.

Plain bf16 (`model.to(torch.bfloat16)`) rounds every activation, residual sum and state tensor
to 8 significant bits, and parity falls far (docs/performance.md, "Precision"). `mixed_precision` puts only
the weights and matrix products of chosen layers in bf16 (inputs rounded, products accumulated
in fp32 by oneDNN or cuBLAS, outputs back to fp32); activations, SnakeBeta, norms, residual
sums, the KV caches and the conv histories stay fp32. That alone gains little: most of the error
enters in the 8 and 24 kHz conv blocks and the output conv, whose rounding reaches the waveform
through few layers, so those stay fp32 by default (benchmarks/precision_bench.py measures each
choice). The bf16 part is the front and the 400 Hz and 2 kHz blocks: ~95% of the weight
bytes a call reads (what bounds small chunks) and about half the multiply-adds.
"""

from __future__ import annotations

import copy

import torch
from codecstream.decoder.layers import CausalConv1d, CausalTransposedConv1d
from codecstream.decoder.model import Qwen3TTSDecoder
from torch import nn

#: Modules `mixed_precision` keeps in fp32 by default: the 8 and 24 kHz conv blocks and the
#: output SnakeBeta and conv (Qwen3TTSDecoder.decoder[3:]).
FP32_BY_DEFAULT = ("decoder.3", "decoder.4", "decoder.5", "decoder.6")


class LowPrecisionLinear(nn.Linear):
    """nn.Linear with weights in a low-precision dtype: computes in it, returns the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to(self.weight.dtype)).to(x.dtype)


def mixed_precision(model: Qwen3TTSDecoder, dtype: torch.dtype = torch.bfloat16,
                    keep: tuple[str, ...] = FP32_BY_DEFAULT) -> Qwen3TTSDecoder:  # fmt: skip
    """A copy of the fp32 `model` whose conv and linear weights are in `dtype`, except modules
    whose name is one of `keep` or inside one (those stay fp32). The state stays fp32."""
    mixed = copy.deepcopy(model)
    for name, module in mixed.named_modules():
        if any(name == kept or name.startswith(kept + ".") for kept in keep):
            continue
        if isinstance(module, (CausalConv1d, CausalTransposedConv1d)):
            module.conv.to(dtype)
            if isinstance(module, CausalTransposedConv1d):
                module.refresh()
        elif type(module) is nn.Linear:
            module.__class__ = LowPrecisionLinear
            module.to(dtype)
    return mixed

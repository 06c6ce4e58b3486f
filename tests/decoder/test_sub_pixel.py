"""The sub-pixel form of the transposed convolution computes what the overlap-add computes."""

from __future__ import annotations

import copy

import pytest
import torch
from codecstream.decoder.layers import CausalTransposedConv1d
from codecstream.decoder.precision import mixed_precision


@pytest.mark.parametrize(("in_channels", "out_channels", "stride"), [(24, 12, 3), (16, 8, 4), (10, 10, 2)])
def test_the_sub_pixel_transposed_conv_equals_the_overlap_add(in_channels, out_channels, stride):
    torch.manual_seed(0)
    layer = CausalTransposedConv1d(in_channels, out_channels, 2 * stride, stride)
    layer.refresh()
    assert layer.sub_pixel
    x, carry = torch.randn(2, in_channels, 37), [torch.randn(2, in_channels, 1)]
    with torch.no_grad():
        sub_pixel = (layer(x), *layer.step(x, carry))
        layer.sub_pixel = False
        overlap_add = (layer(x), *layer.step(x, carry))
    torch.testing.assert_close(sub_pixel[0], overlap_add[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(sub_pixel[1], overlap_add[1], rtol=0, atol=1e-5)
    assert torch.equal(sub_pixel[2][0], overlap_add[2][0])  # the carry is the input's last column either way


def test_the_sub_pixel_weights_follow_a_cast_and_a_reload(tiny_model):
    mixed = mixed_precision(tiny_model, keep=())
    layers = [m for m in mixed.modules() if isinstance(m, CausalTransposedConv1d) and m.sub_pixel]
    assert layers and all(layer.phase_weight.dtype == torch.bfloat16 for layer in layers)
    reloaded = copy.deepcopy(tiny_model)
    first = next(m for m in reloaded.modules() if isinstance(m, CausalTransposedConv1d) and m.sub_pixel)
    state = {name: tensor.clone() for name, tensor in reloaded.state_dict().items()}
    state["upsample.0.0.conv.weight"] = torch.zeros_like(state["upsample.0.0.conv.weight"])
    reloaded.load_state_dict(state)
    assert not first.phase_weight.any()

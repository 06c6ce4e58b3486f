"""The ExecuTorch `.pte` runs its convolutions in the XNNPACK delegate, not on ExecuTorch's portable
kernels (naive loops): on main the six sub-pixel transposed convs, whose bias was repeated per
call, stayed outside it, and a real-size 2-frame chunk took 1.4 s instead of 0.32 s (issue 41)."""

from __future__ import annotations

import pytest

pytest.importorskip("executorch")

#: Kernels that must run inside the delegate: outside it each is a portable loop over the whole signal.
HEAVY_KERNELS = {"aten::convolution", "aten::convolution_backward", "aten::_convolution"}


@pytest.mark.parametrize("mode", ["stateful", "windowed"])
def test_every_convolution_of_the_pte_runs_in_the_xnnpack_delegate(artifacts, mode):
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = artifacts[("pte", mode, "fp32")] / "decoder.pte"
    program = deserialize_pte_binary(pte.read_bytes())
    plan = getattr(program, "program", program).execution_plan[0]
    outside = {operator.name for operator in plan.operators}
    assert plan.delegates, "nothing was delegated to XNNPACK"
    assert not outside & HEAVY_KERNELS, f"outside the delegate: {sorted(outside & HEAVY_KERNELS)}"

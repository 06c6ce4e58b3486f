"""Which chunk ramp to default to: the earliest first audio with no underrun, for a client decoding beside a busy core.

    .venv/bin/python benchmarks/ramp_bench.py          # 5 ramps x 4 streams of 8 s, ~4 minutes
    .venv/bin/python benchmarks/ramp_bench.py --ramps "1,2,4,8 2,4,8,16,25" --repeats 3
    .venv/bin/python benchmarks/ramp_bench.py --quiet --out benchmarks/results/ramp_bench_quiet.json

A replay server streams a recorded utterance at a talker's pace (--fps; default 25 frames/s, twice
real time: a GPU talker streams at least that fast) through the real server's chunker and gRPC. One
client decodes it with the default backend (the real-size ONNX artifact on `open_decoder`'s first
choice, default threading; --backend picks another) and plays it into stream_bench's simulated
speaker through the adaptive jitter buffer, while another process spins on one core (`while True:
pass`), as a laptop's other work would (--quiet: without it, the baseline). Each candidate ramp
(the first chunk, then the sizes that follow; the last repeats) runs --repeats times, interleaved
with the others. Per ramp: playback start (the first audio heard) median and max, underruns and
stall time summed over the repeats, and the first chunk's decode time. The record's choice: the
earliest median playback start among the ramps without an underrun in any repeat, in its condition;
the default ramp weighs the busy and the quiet record (docs/performance.md says how).

Writes benchmarks/results/ramp_bench.json and .png.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from bench_record import RESULTS, machine, random_codes, versions, write_record
from bench_servers import ServerProcess
from stream_bench import ROOT, build_checkpoint, export_decoder, one_stream

#: First chunk 1 or 2 frames, then ramps that stop growing at 8, 16 or 25 frames (the last: the
#: default before this benchmark chose 1, 2, 4, 8).
RAMPS = ((1, 2, 4, 8), (2, 4, 8), (1, 2, 4, 8, 16), (1, 2, 4, 8, 16, 25), (2, 4, 8, 16, 25))
UTTERANCE_FRAMES = 100  # 8 s of audio


def parse_ramps(text: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(size) for size in ramp.split(",")) for ramp in text.split())


def summarize(streams: list[dict]) -> dict:
    starts = [stream["playback_start_ms"] for stream in streams]
    first_decode = [stream["chunks"][0]["decode_ms"] for stream in streams]
    return {
        "playback_start_ms_median": round(float(np.median(starts)), 1),
        "playback_start_ms_max": round(max(starts), 1),
        "first_chunk_decode_ms_median": round(float(np.median(first_decode)), 1),
        "underruns": sum(stream["underruns"] for stream in streams),
        "stall_ms": round(sum(stream["stall_ms"] for stream in streams), 1),
        "playout_delay_ms_median": round(float(np.median([stream["playout_delay_ms"] for stream in streams])), 1),
        "decode_rtf_median": round(float(np.median([stream["decode_rtf"] for stream in streams])), 3),
    }


def choose(rows: list[dict]) -> dict | None:
    clean = [row for row in rows if row["summary"]["underruns"] == 0]
    return min(clean, key=lambda row: row["summary"]["playback_start_ms_median"]) if clean else None


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = record["ramps"]
    names = [",".join(map(str, row["ramp"])) for row in rows]
    figure, axis = plt.subplots(figsize=(10, 4.5), constrained_layout=True)
    colors = ["tab:green" if row["summary"]["underruns"] == 0 else "tab:red" for row in rows]
    medians = [row["summary"]["playback_start_ms_median"] for row in rows]
    axis.bar(names, medians, color=colors)
    for index, row in enumerate(rows):
        starts = [stream["playback_start_ms"] for stream in row["streams"]]
        axis.plot([index] * len(starts), starts, "k.", markersize=5)
        axis.text(index, max(starts), f"{row['summary']['underruns']} underruns", ha="center", va="bottom", fontsize=8)
    chosen = record["chosen_ramp"]
    beside = "quiet machine" if record["contention"] == "none" else "beside a busy core"
    axis.set(
        ylabel="playback start, ms after the request",
        title=f"first audio per ramp, {beside} ({record['fps']:g} frames/s server, green: no underrun; "
        f"chosen {','.join(map(str, chosen)) if chosen else 'none'})",
    )
    axis.tick_params(axis="x", rotation=15)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ramps", type=parse_ramps, default=RAMPS, help='e.g. "1,2,4,8 2,4,8,16,25"')
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--fps", type=float, default=25.0, help="the replay server's pace in frames per second")
    parser.add_argument("--frames", type=int, default=UTTERANCE_FRAMES)
    parser.add_argument("--quiet", action="store_true", help="no busy process beside the client (the baseline)")
    parser.add_argument("--backend", default="auto", help="the client's decoder backend (auto: the default)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "ramp_bench.json")
    args = parser.parse_args()
    # A SIGTERM unwinds like Ctrl-C, so the server and the spinning process below are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    checkpoint = build_checkpoint("tiny", "real")
    decoder_dir = export_decoder(checkpoint, "onnx")
    folder = tempfile.TemporaryDirectory()
    codes = pathlib.Path(folder.name) / "codes.npy"
    np.save(codes, random_codes(args.frames, 7))
    server = ServerProcess(
        ["--replay", str(codes), "--replay-checkpoint", str(checkpoint), "--replay-fps", str(args.fps)]
    )
    busy = None if args.quiet else subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rows = [{"ramp": list(ramp), "streams": []} for ramp in args.ramps]
    load_before = os.getloadavg()[0]
    try:
        time.sleep(0.5)
        for repeat in range(args.repeats):
            for row in rows:
                result: dict = {}
                one_stream(server.target, decoder_dir, args.backend, "replayed", repeat, result,
                           chunking=tuple(row["ramp"]), threads=None)  # fmt: skip
                row["streams"].append(result)
                print(f"[ramp_bench] {row['ramp']} #{repeat}: playback at {result['playback_start_ms']:.0f} ms, "
                      f"{result['underruns']} underruns", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        if busy:
            busy.kill()
            busy.wait()
        server.close()
        folder.cleanup()
    for row in rows:
        row["summary"] = summarize(row["streams"])
    chosen = choose(rows)
    record = {
        "benchmark": "ramp_bench",
        "server": f"replay of {args.frames} frames at {args.fps:g} frames/s (real-size decoder's checkpoint)",
        "client": "real-size stateful fp32 ONNX artifact, default threading, jitter buffer with adaptive delay",
        "decoder": rows[0]["streams"][0]["decoder"],
        "contention": "none" if args.quiet else "one other process spinning on one core (`while True: pass`)",
        "fps": args.fps,
        "repeats": args.repeats,
        "machine": machine(),
        "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "versions": versions("onnxruntime", "openvino", "numpy", "grpcio"),
        "command": shlex.join([sys.executable.replace(str(ROOT) + "/", ""), *sys.argv]),
        "chosen_ramp": chosen["ramp"] if chosen else None,
        "ramps": rows,
    }
    write_record(record, args.out, plot)
    print(f"[ramp_bench] chosen: {record['chosen_ramp']}; wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""End to end on this machine: codecstream-server (real vLLM-Omni talker on the CPU) → gRPC → client decode → playback.

For each client count, every client synthesizes the same text at once and plays it into a
simulated speaker (a thread pulling 20 ms blocks at real-time pace from the client's jitter
buffer). Recorded per stream: server time to first frame, client time to first chunk and to first
PCM, playback start, per-chunk arrival and decode times, stall time, decode RTF, bytes on the wire
per second of audio. Writes JSON and a PNG timeline under benchmarks/results/.

    .venv/bin/python benchmarks/stream_bench.py                      # tiny talker, real-size decoder
    .venv/bin/python benchmarks/stream_bench.py --export onnx        # clients run an exported artifact
    .venv/bin/python benchmarks/stream_bench.py --decoder-size tiny --clients 1   # quick run
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import threading
import time

import numpy as np
from artifact_bench import ensure_exported, export_artifact
from bench_record import RESULTS, machine, write_record
from bench_servers import ServerProcess
from codecstream.client import Client
from codecstream.client.jitter_buffer import JitterBuffer
from codecstream.client.runtimes import open_decoder
from codecstream.protocol.chunking import ChunkSchedule

ROOT = pathlib.Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "bench"
BLOCK_S = 0.02


def build_checkpoint(talker: str, decoder_size: str) -> pathlib.Path:
    """A random Qwen3-TTS checkpoint: `talker` shape, speech-tokenizer decoder of `decoder_size`."""
    from codecstream.testing.random_checkpoint import write_qwen3_tts_checkpoint, write_speech_tokenizer_with_encoder

    path = CACHE / f"talker-{talker}-decoder-{decoder_size}"
    if not (path / "speech_tokenizer" / "model.safetensors").exists():
        print(f"building {path} ...", flush=True)
        write_qwen3_tts_checkpoint(path, preset=talker, seed=0)
        write_speech_tokenizer_with_encoder(path / "speech_tokenizer", decoder_size, seed=0)
    return path


class SimulatedSpeaker(threading.Thread):
    """Pulls 20 ms blocks at real-time pace, as a sound card would."""

    def __init__(self, buffer: JitterBuffer, epoch: float) -> None:
        super().__init__(daemon=True)
        self.buffer = buffer
        self.epoch = epoch
        self.playback_start_s: float | None = None

    def run(self) -> None:
        due = time.monotonic()
        while not self.buffer.finished:
            block = self.buffer.pull(int(BLOCK_S * self.buffer.sample_rate))
            if self.playback_start_s is None and block.any():
                self.playback_start_s = time.monotonic() - self.epoch
            due += BLOCK_S
            time.sleep(max(0.0, due - time.monotonic()))


def export_decoder(checkpoint: pathlib.Path, fmt: str) -> pathlib.Path:
    """The checkpoint's stateful fp32 decoder exported once to `fmt`, as a client would ship it."""
    out = CACHE / "artifacts" / f"{checkpoint.name}-stateful-fp32-{fmt}"

    def export() -> None:
        print(f"exporting {checkpoint.name}'s decoder to {fmt} under {out} ...", flush=True)
        export_artifact(checkpoint / "speech_tokenizer", out, fmt)

    ensure_exported(out, export)
    return out


def one_stream(target: str, decoder_dir: pathlib.Path, backend: str, text: str, seed: int, result: dict,
               chunking: tuple[int, ...] | None = None, threads: int | None = 1) -> None:  # fmt: skip
    """One stream played into a SimulatedSpeaker; `result` gets its timings. `chunking`: the ramp to
    ask for (None: the server's default); `threads`: the decoder's (None: the runtime's default)."""
    decoder = open_decoder(decoder_dir, backend=backend, threads=threads)
    buffer = JitterBuffer(schedule=ChunkSchedule(chunking) if chunking else None)
    with Client(target) as client:
        epoch = time.monotonic()
        speaker = SimulatedSpeaker(buffer, epoch)
        speaker.start()
        stream = client.synthesize(text, decoder=decoder, voice="ryan", seed=seed, chunking=chunking)
        chunks = []
        for chunk in stream:
            buffer.push(chunk.samples, chunk.decode_s, chunk.arrived_s)
            chunks.append({"seq": chunk.seq, "frames": chunk.num_frames, "arrived_ms": chunk.arrived_s * 1000,
                           "decoded_ms": chunk.decoded_s * 1000, "decode_ms": chunk.decode_s * 1000})  # fmt: skip
        buffer.end_of_stream()
        speaker.join(timeout=600)
    stats = stream.stats
    result.update(
        server_time_to_first_frame_ms=stream.end.stats.time_to_first_frame_us / 1000,
        time_to_first_chunk_ms=stats.time_to_first_chunk_s * 1000,
        time_to_first_audio_ms=stats.time_to_first_audio_s * 1000,
        playback_start_ms=(speaker.playback_start_s or 0) * 1000,
        playout_delay_ms=buffer.stats.playout_delay_s * 1000,
        stall_ms=buffer.stats.stall_s * 1000,
        underruns=buffer.stats.underruns,
        audio_s=stats.audio_s,
        decode_rtf=stats.decode_rtf,
        wire_bytes=stats.wire_bytes,
        wire_bytes_per_audio_second=stats.wire_bytes_per_audio_second,
        end_reason=int(stream.end.reason),
        decoder=decoder.description,
        chunks=chunks,
    )


def run_clients(target: str, decoder_dir: pathlib.Path, backend: str, text: str, clients: int) -> list[dict]:
    results = [{} for _ in range(clients)]
    threads = [
        threading.Thread(target=one_stream, args=(target, decoder_dir, backend, text, i, results[i]))
        for i in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def summarize(streams: list[dict]) -> dict:
    def median(key: str) -> float:
        return float(np.median([s[key] for s in streams]))

    return {key: median(key) for key in (
        "server_time_to_first_frame_ms", "time_to_first_chunk_ms", "time_to_first_audio_ms", "playback_start_ms",
        "stall_ms", "decode_rtf", "wire_bytes_per_audio_second", "audio_s")}  # fmt: skip


def plot_timeline(report: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.8 * len(runs)), squeeze=False)
    for axis, run in zip(axes[:, 0], runs, strict=True):
        for index, stream in enumerate(run["streams"]):
            for chunk in stream["chunks"]:
                axis.barh(
                    index,
                    chunk["decoded_ms"] - chunk["arrived_ms"],
                    left=chunk["arrived_ms"],
                    height=0.5,
                    color="tab:orange",
                )
                axis.plot(chunk["arrived_ms"], index, "|", color="tab:blue", markersize=12)
            axis.plot(stream["server_time_to_first_frame_ms"], index, "v", color="tab:green")
            axis.plot(stream["playback_start_ms"], index, "*", color="tab:red", markersize=10)
        axis.set_title(f"{run['clients']} concurrent client(s): chunk arrival (|), decoding (bar), "
                       f"server first frame (▼), playback start (★)")  # fmt: skip
        axis.set_xlabel("ms since request")
        axis.set_ylabel("stream")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--talker", default="tiny", choices=["tiny", "0.6b"])
    parser.add_argument("--decoder-size", default="real", choices=["tiny", "real"])
    parser.add_argument(
        "--decoder", type=pathlib.Path, help="client decoder artifact (default: eager torch on the checkpoint)"
    )
    parser.add_argument("--backend", default="auto")
    parser.add_argument(
        "--export", choices=["onnx", "pt2", "pte"], help="export the checkpoint's decoder to this format and use it"
    )
    parser.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    parser.add_argument("--text", default="Codec tokens cross the network; the audio is made on the device.")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "stream_bench.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    checkpoint = build_checkpoint(args.talker, args.decoder_size)
    decoder_dir = args.decoder or checkpoint / "speech_tokenizer"
    if args.export:
        decoder_dir, args.backend = export_decoder(checkpoint, args.export), args.export
    server = ServerProcess(["--model", str(checkpoint)])
    print(f"server ready after {server.start_s:.1f} s on {server.target}", flush=True)
    runs = []
    try:
        for clients in args.clients:
            streams = run_clients(server.target, decoder_dir, args.backend, args.text, clients)
            summary = summarize(streams)
            print(f"{clients} client(s): " + ", ".join(f"{k} {v:.1f}" for k, v in summary.items()), flush=True)
            runs.append({"clients": clients, "median": summary, "streams": streams})
    finally:
        server.close()
    report = {
        "benchmark": "stream_bench",
        "talker": args.talker,
        "decoder_size": args.decoder_size,
        "server_startup_s": server.start_s,
        "machine": {**machine(), "client_decode_threads": 1, "load_average_1m_at_end": os.getloadavg()[0]},
        "runs": runs,
    }
    write_record(report, args.out, plot_timeline)
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

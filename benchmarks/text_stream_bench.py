"""Streamed text into the real (tiny, random-weight) talker: one growing request against segments.

A simulated LLM writes a reply token by token into `stream_text`, on a server that grows one talker
request per stream (`--streamed-text grow`, the default) and on one that speaks each sentence or
clause as its own request (`--streamed-text segments`), one after the other in the same run. For a
31-token one-sentence reply and a three-sentence reply, at 5, 15, 40 and 100 tokens/s:

- first audio: from the first token written to the first PCM chunk;
- engine requests (prefills) per stream: 1 for a growing stream (counted by the engine in
  tests/server/test_growing_text.py), one per segment otherwise (the segments the chunks name);
- chunk gaps after the first chunk (p99), and the underrun a player starting at the first chunk
  would hear (the audio arriving later than it is due, summed);
- cancel: once the first audio of a streamed reply played, `cancel(played_frames)`; the time until
  the server's End(CANCELLED) arrives.
Writes benchmarks/results/text_stream_bench.json and .png.

    .venv/bin/python benchmarks/text_stream_bench.py          # ~8 min on 2 cores

Random weights: a segment ends at EOS (random) or its frame cap, a growing stream after the whole
text has been read; the timings are about the pipeline, not the voice.
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import re
import statistics
import sys
import threading
import time

import numpy as np
from bench_record import RESULTS, machine, write_record
from bench_servers import ServerProcess
from codecstream.protocol.decoding import FRAME_SECONDS

ROOT = pathlib.Path(__file__).resolve().parent.parent
REPLIES = {
    "one sentence": "Sure, I can help with that: the next train to the airport leaves at nine from platform four.",
    "three sentences": (
        "Sure, I can help with that. The train to Lyon leaves at nine fifteen from platform four. "
        "Would you like me to book a seat for you?"
    ),
}
MODES = ("grow", "segments")


def tokens_of(text: str) -> list[str]:
    """LLM-like pieces: words with their leading space, punctuation on its own."""
    return re.findall(r" ?[\w']+| ?[^\w\s]", text)


def write_tokens(push, tokens: list[str], rate: float, started: float) -> None:
    for index, token in enumerate(tokens):
        time.sleep(max(0.0, started + index / rate - time.monotonic()))
        push(token)


def streamed(client, decoder, tokens: list[str], rate: float, seed: int, cancel: bool) -> dict:
    stream = client.stream_text(decoder=decoder, voice="ryan", seed=seed)
    started = time.monotonic()
    stream.open()

    def writer():
        write_tokens(stream.push_text, tokens, rate, started)
        stream.end_input()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    first = next(stream)
    first_at = time.monotonic()
    result = {"first_audio_s": first_at - started, "first_chunk_text": stream.text[first.text_start : first.text_end]}
    if cancel:
        asked = time.monotonic()
        end = stream.cancel(played_frames=first.num_frames)
        result["cancel_to_end_s"] = time.monotonic() - asked
        result["end_reason"] = end.reason
        thread.join(30)
        return result
    arrivals, frames = [first_at], [first.num_frames]
    spans = {(first.text_start, first.text_end)}
    for chunk in stream:
        arrivals.append(time.monotonic())
        frames.append(chunk.num_frames)
        spans.add((chunk.text_start, chunk.text_end))
    thread.join(30)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    # A player that starts at the first chunk: chunk i is due once the audio before it has played.
    late, delay = 0.0, 0.0
    for index in range(1, len(arrivals)):
        due = first_at + delay + sum(frames[:index]) * FRAME_SECONDS
        if arrivals[index] > due:
            delay += arrivals[index] - due
    late = delay
    result.update(
        frames=sum(frames),
        chunks=len(frames),
        gap_p99_ms=float(np.percentile(gaps, 99)) * 1000 if gaps else 0.0,
        underrun_ms=late * 1000,
        text_spans=len(spans),
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[5.0, 15.0, 40.0, 100.0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "text_stream_bench.json")
    args = parser.parse_args()
    from codecstream.client import Client
    from codecstream.client.runtimes import open_decoder
    from codecstream.testing.random_checkpoint import write_qwen3_tts_checkpoint

    checkpoint = ROOT / ".cache" / "bench-checkpoints" / "qwen3-tts-tiny"
    if not (checkpoint / "config.json").is_file():
        write_qwen3_tts_checkpoint(checkpoint, preset="tiny", seed=0)
    decoder = open_decoder(checkpoint / "speech_tokenizer", backend="torch")
    runs = []
    for mode in MODES:
        server = ServerProcess(["--model", str(checkpoint), "--streamed-text", mode])
        print(f"engine server ready after {server.start_s:.0f} s", flush=True)
        try:
            with Client(server.target) as client:
                streamed(client, decoder, ["Warm", " up", "."], 1000.0, seed=99, cancel=False)
                for reply_name, reply in REPLIES.items():
                    tokens = tokens_of(reply)
                    for rate in args.rates:
                        for repeat in range(args.repeats):
                            seed = 1 + repeat
                            entry = {
                                "mode": mode,
                                "reply": reply_name,
                                "tokens": len(tokens),
                                "tokens_per_s": rate,
                                "repeat": repeat,
                                "streamed": streamed(client, decoder, tokens, rate, seed, cancel=False),
                                "cancelled": streamed(client, decoder, tokens, rate, seed, cancel=True),
                            }
                            entry["engine_requests"] = 1 if mode == "grow" else entry["streamed"]["text_spans"]
                            runs.append(entry)
                            done = entry["streamed"]
                            print(
                                f"{mode:8s} {reply_name:15s} {rate:4.0f} tok/s #{repeat}: first audio "
                                f"{done['first_audio_s'] * 1000:5.0f} ms, {entry['engine_requests']} requests, "
                                f"gap p99 {done['gap_p99_ms']:4.0f} ms, underrun {done['underrun_ms']:5.0f} ms, "
                                f"cancel -> End {entry['cancelled']['cancel_to_end_s'] * 1000:3.0f} ms",
                                flush=True,
                            )
        finally:
            server.close()
    summary = {}
    for mode in MODES:
        for reply_name in REPLIES:
            for rate in args.rates:
                mine = [r for r in runs if (r["mode"], r["reply"], r["tokens_per_s"]) == (mode, reply_name, rate)]
                summary[f"{mode} / {reply_name} / {rate:g}"] = {
                    "first_audio_ms": statistics.median(r["streamed"]["first_audio_s"] for r in mine) * 1000,
                    "engine_requests": statistics.median(r["engine_requests"] for r in mine),
                    "gap_p99_ms": statistics.median(r["streamed"]["gap_p99_ms"] for r in mine),
                    "underrun_ms": statistics.median(r["streamed"]["underrun_ms"] for r in mine),
                    "cancel_to_end_ms": statistics.median(r["cancelled"]["cancel_to_end_s"] for r in mine) * 1000,
                }
    report = {
        "machine": machine(),
        "engine": "vLLM-Omni talker, tiny random-weight Qwen3-TTS checkpoint, CPU",
        "replies": REPLIES,
        "rates": args.rates,
        "summary_median": summary,
        "runs": runs,
    }
    write_record(report, args.out, plot)
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


def plot(report: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, rates = report["summary_median"], report["rates"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    for axis, key, label in (
        (axes[0], "first_audio_ms", "first audio after the first token (ms)"),
        (axes[1], "underrun_ms", "underrun a real-time player hears (ms)"),
    ):
        for mode, style in (("grow", "-o"), ("segments", "--s")):
            for reply in report["replies"]:
                values = [summary[f"{mode} / {reply} / {rate:g}"][key] for rate in rates]
                axis.plot(rates, values, style, label=f"{mode}, {reply}")
        axis.set_xscale("log")
        axis.set_xticks(rates, [f"{rate:g}" for rate in rates])
        axis.set_xlabel("LLM tokens/s")
        axis.set_ylabel(label)
        axis.legend(fontsize=7)
    fig.suptitle(f"streamed text: one growing request vs segments ({report['machine']['cpu']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())

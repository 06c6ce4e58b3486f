"""Streamed text into the real (tiny, random-weight) talker: a simulated LLM writes a three-sentence
reply token by token; how soon audio starts, against waiting for the whole reply; how soon a
cancel silences it. Writes benchmarks/results/text_stream_bench.json and .png.

    .venv/bin/python benchmarks/text_stream_bench.py                 # 15 and 40 tokens/s, ~5 min

- streamed: `stream_text`, every token pushed as the LLM "writes" it; first audio is measured from
  the first token.
- whole text: the same reply sent with `synthesize` once the last token is written (what a client
  of a text-at-once API does); first audio measured from the first token too, so it includes the
  writing time.
- cancel: once the first audio of a streamed reply played, `cancel(played_frames)`; the time until
  the server's End(CANCELLED) arrives, after which no more audio exists (the client drops what it
  holds at once).
Random weights: the talker's EOS comes at random, so each segment runs to its frame cap
(ServerLimits.segment_frame_cap) or EOS; the timings are about the pipeline, not the voice.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from bench_record import RESULTS, machine, write_record

ROOT = pathlib.Path(__file__).resolve().parent.parent
REPLY = (
    "Sure, I can help with that. The train to Lyon leaves at nine fifteen from platform four. "
    "Would you like me to book a seat for you?"
)


def tokens_of(text: str) -> list[str]:
    """LLM-like pieces: words with their leading space, punctuation on its own."""
    return re.findall(r" ?[\w']+| ?[^\w\s]", text)


class EngineServer:
    """codecstream-server on the tiny talker, in its own process."""

    def __init__(self, checkpoint: pathlib.Path) -> None:
        self._folder = tempfile.TemporaryDirectory()
        port_file = pathlib.Path(self._folder.name) / "port"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "codecstream.server.cli", "--model", str(checkpoint), "--port", "0",
             "--port-file", str(port_file), "--log-level", "WARNING"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        started = time.monotonic()
        while not (port_file.exists() and port_file.read_text()):
            if self.process.poll() is not None or time.monotonic() - started > 600:
                raise RuntimeError("the engine server did not start")
            time.sleep(0.5)
        print(f"engine server ready after {time.monotonic() - started:.0f} s", flush=True)
        self.target = f"127.0.0.1:{port_file.read_text()}"

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(120)
        self._folder.cleanup()


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
    first_audio_s = time.monotonic() - started
    result = {"first_audio_s": first_audio_s, "first_chunk_text": stream.text[first.text_start : first.text_end]}
    if cancel:
        asked = time.monotonic()
        end = stream.cancel(played_frames=first.num_frames)
        result["cancel_to_end_s"] = time.monotonic() - asked
        result["end_reason"] = end.reason
    else:
        chunks = [first, *stream]
        result["frames"] = sum(c.num_frames for c in chunks)
        result["segments"] = len({(c.text_start, c.text_end) for c in chunks})
    thread.join(30)
    return result


def whole(client, decoder, tokens: list[str], rate: float, seed: int) -> dict:
    started = time.monotonic()
    written: list[str] = []
    write_tokens(written.append, tokens, rate, started)
    stream = client.synthesize("".join(written), decoder=decoder, voice="ryan", seed=seed)
    next(stream)
    first_audio_s = time.monotonic() - started
    stream.cancel()
    return {"first_audio_s": first_audio_s, "writing_s": (len(tokens) - 1) / rate}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[15.0, 40.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "text_stream_bench.json")
    args = parser.parse_args()
    from codecstream.client import Client
    from codecstream.client.runtimes import open_decoder
    from codecstream.testing.random_checkpoint import write_qwen3_tts_checkpoint

    checkpoint = ROOT / ".cache" / "bench-checkpoints" / "qwen3-tts-tiny"
    if not (checkpoint / "config.json").is_file():
        write_qwen3_tts_checkpoint(checkpoint, preset="tiny", seed=0)
    tokens = tokens_of(REPLY)
    server = EngineServer(checkpoint)
    runs = []
    try:
        decoder = open_decoder(checkpoint / "speech_tokenizer", backend="torch")
        with Client(server.target) as client:
            whole(client, decoder, tokens[:3], 1000.0, seed=99)  # warm-up: first request, first shapes
            for rate in args.rates:
                for repeat in range(args.repeats):
                    seed = 1 + repeat
                    entry = {
                        "tokens_per_s": rate,
                        "repeat": repeat,
                        "streamed": streamed(client, decoder, tokens, rate, seed, cancel=False),
                        "whole_text": whole(client, decoder, tokens, rate, seed),
                        "streamed_cancelled": streamed(client, decoder, tokens, rate, seed, cancel=True),
                    }
                    runs.append(entry)
                    print(
                        f"{rate:4.0f} tok/s #{repeat}: first audio streamed "
                        f"{entry['streamed']['first_audio_s'] * 1000:.0f} ms "
                        f"(first chunk speaks {entry['streamed']['first_chunk_text']!r}), whole text "
                        f"{entry['whole_text']['first_audio_s'] * 1000:.0f} ms; cancel -> End "
                        f"{entry['streamed_cancelled']['cancel_to_end_s'] * 1000:.0f} ms",
                        flush=True,
                    )
    finally:
        server.close()
    summary = {}
    for rate in args.rates:
        mine = [r for r in runs if r["tokens_per_s"] == rate]
        summary[f"{rate:g}"] = {
            "streamed_first_audio_ms": statistics.median(r["streamed"]["first_audio_s"] for r in mine) * 1000,
            "whole_text_first_audio_ms": statistics.median(r["whole_text"]["first_audio_s"] for r in mine) * 1000,
            "cancel_to_end_ms": statistics.median(r["streamed_cancelled"]["cancel_to_end_s"] for r in mine) * 1000,
        }
    report = {
        "machine": machine(),
        "engine": "vLLM-Omni talker, tiny random-weight Qwen3-TTS checkpoint, CPU",
        "reply": REPLY,
        "tokens": len(tokens),
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
    import numpy as np

    rates = list(report["summary_median"])
    summary = report["summary_median"]
    fig, axis = plt.subplots(figsize=(7, 4))
    x = np.arange(len(rates))
    for offset, key, label in (
        (-0.27, "streamed_first_audio_ms", "streamed text: first audio"),
        (0.0, "whole_text_first_audio_ms", "whole text at the end: first audio"),
        (0.27, "cancel_to_end_ms", "cancel → End (silence)"),
    ):
        axis.bar(x + offset, [summary[r][key] for r in rates], 0.27, label=label)
    axis.set_xticks(x, [f"LLM at {r} tokens/s" for r in rates])
    axis.set_ylabel("ms from the first text token (cancel: from the cancel)")
    axis.set_title(f"{report['tokens']}-token reply into the tiny talker ({report['machine']['cpu']})", fontsize=9)
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())

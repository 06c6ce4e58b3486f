"""First audio and cancel of the voice-agent plugins, inside their frameworks, against real servers.

An LLM writes a two-sentence reply at 20 tokens/s into each plugin as its framework feeds it
(Pipecat: LLMTextFrames through a real pipeline; LiveKit: `stream().push_text`), and into the
client library itself (`AsyncClient.stream_text`) as the baseline the plugins add to. Each
decodes with the server's own decoder (`decoder="auto"`, an ONNX export of the checkpoint's
decoder the server offers, downloaded once before the runs). Two servers, one after the other:

- the tiny random-weight talker engine (vLLM-Omni on the CPU; one growing request per reply);
- a replay server at the codec's real-time pace (12.5 frames/s): the plugin's own cost, with the
  engine's out of the way.

Three modes, all in the record:

- warm: a turn of a plugin whose decoder is loaded and which has spoken a turn before. Per run:
  first audio (from the first token written to the first audio leaving the plugin), then, 0.5 s
  after the whole reply was written, an interruption (Pipecat InterruptionFrame, LiveKit
  `aclose()`, the library's `cancel`): the time until the server has ended the stream CANCELLED
  (its metrics, polled every 2 ms), the audio that still left the plugin after the interruption,
  and the frames reported played against the audio handed out.
- cold: the first turn of a fresh process with an empty client cache (the decoder never loaded,
  codecstream's OpenVINO operations never built: the decoder runs unfused while they build in the
  background), its first token written the moment the TTS starts (Pipecat's pipeline started,
  LiveKit's `prewarm()` called, the library's `open_decoder()` called): first audio from then, so
  it counts the decoder's download, its runtime's import and its compile, as much as the plugin
  leaves inside the turn. The framework and the plugin are imported before the clock starts, as
  an agent process has them by its first call.
- cold, operations built: the same, the OpenVINO operations built ahead as an install script does
  (`python -m codecstream.client.runtimes.openvino_extension`), the decoder still never loaded.

The record names the other processes that used the CPU at the start, between the modes and at
the end (this machine's cores may be shared).

Writes benchmarks/results/plugin_bench.json and .png.

    .venv/bin/python benchmarks/plugin_bench.py          # ~10 min on 2 cores (engine start included)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

from bench_record import (
    RESULTS,
    build_openvino_operations,
    machine,
    other_processes,
    percentiles,
    random_codes,
    versions,
    write_record,
)
from bench_servers import ServerProcess
from codecstream.protocol.decoding import FRAME_SECONDS, FRAMES_PER_SECOND, SAMPLES_PER_FRAME

ROOT = pathlib.Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "bench-checkpoints"
REPLY = "Sure, I can help with that. The next train to the airport leaves at nine from platform four."
TOKENS_PER_S = 20.0
LISTEN_S = 0.5
CLIENTS = ("library", "pipecat", "livekit")
#: The cold modes: whether the OpenVINO operations were built ahead.
COLD_MODES = {"cold": False, "cold, operations built": True}
CANCELLED = 'codecstream_streams_ended_total{reason="cancelled"}'


def tokens_of(text: str) -> list[str]:
    return re.findall(r" ?[\w']+| ?[^\w\s]", text)


async def write_tokens(push, tokens: list[str], started: float) -> None:
    for index, token in enumerate(tokens):
        await asyncio.sleep(max(0.0, started + index / TOKENS_PER_S - time.monotonic()))
        push(token)


async def cancel_seen(server: ServerProcess) -> float:
    """The monotonic time at which the server counts one more cancelled stream than now."""
    before = server.metrics((CANCELLED,)).get(CANCELLED, 0.0)
    while server.metrics((CANCELLED,)).get(CANCELLED, 0.0) <= before:
        await asyncio.sleep(0.002)
    return time.monotonic()


async def run_library(server: ServerProcess, tokens: list[str], seed: int) -> dict:
    from codecstream.client import AsyncClient

    async with AsyncClient(server.target) as client:
        await client.open_decoder()
        watcher = asyncio.ensure_future(cancel_seen(server))
        stream = client.stream_text(voice="ryan", seed=seed)
        started = time.monotonic()
        await stream.open()
        writer = asyncio.ensure_future(write_tokens(stream.push_text, tokens, started))
        writer.add_done_callback(lambda _: stream.end_input())
        interrupt_at = started + len(tokens) / TOKENS_PER_S + LISTEN_S
        first_audio, handed = None, 0
        async for chunk in stream:
            first_audio = first_audio or time.monotonic()
            handed += chunk.num_frames
            if time.monotonic() >= interrupt_at:
                break
        asked = time.monotonic()
        played = min(handed, int((asked - first_audio) / FRAME_SECONDS))
        end = await stream.cancel(played)
        confirmed = await asyncio.wait_for(watcher, 10)
    return result(first_audio - started, confirmed - asked, 0, played, handed, end.text_offset_played if end else None)


async def run_pipecat(server: ServerProcess, tokens: list[str], seed: int) -> dict:
    from codecstream.client.plugins.pipecat import CodecstreamTTSService
    from codecstream.testing.pipecat_pipeline import Pause, Pushed, Until, run_script
    from pipecat.frames.frames import (
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
    )

    tts = CodecstreamTTSService(server=server.target, settings=CodecstreamTTSService.Settings(voice="ryan", seed=seed))
    script: list = [LLMFullResponseStartFrame(), Pushed("first token")]
    for token in tokens:
        script += [LLMTextFrame(token), Pause(1 / TOKENS_PER_S)]
    script += [LLMFullResponseEndFrame(), Until(TTSAudioRawFrame, timeout_s=60), Pause(LISTEN_S)]
    script += [Pushed("interrupt"), InterruptionFrame()]
    watcher = asyncio.ensure_future(cancel_seen(server))
    outcome = await run_script(tts, script)
    confirmed = await asyncio.wait_for(watcher, 10)
    audio = [(t, f) for f, t in zip(outcome.frames, outcome.times, strict=True) if isinstance(f, TTSAudioRawFrame)]
    interrupt = outcome.marks["interrupt"]
    handed = sum(len(f.audio) for _, f in audio) // (2 * SAMPLES_PER_FRAME)
    after = sum(len(f.audio) for t, f in audio if t > interrupt) // (2 * SAMPLES_PER_FRAME)
    played = min(handed, int((interrupt - audio[0][0]) / FRAME_SECONDS))
    return result(audio[0][0] - outcome.marks["first token"], confirmed - interrupt, after, played, handed, None)


async def run_livekit(server: ServerProcess, tokens: list[str], seed: int) -> dict:
    from codecstream.client.plugins.livekit import CodecstreamTTS

    engine = CodecstreamTTS(server=server.target, voice="ryan", seed=seed)
    await engine._ready()  # the decoder loaded, as prewarm() has it by the first turn
    watcher = asyncio.ensure_future(cancel_seen(server))
    stream = engine.stream()
    started = time.monotonic()
    writer = asyncio.ensure_future(write_tokens(stream.push_text, tokens, started))
    writer.add_done_callback(lambda _: stream.end_input())
    interrupt_at = started + len(tokens) / TOKENS_PER_S + LISTEN_S
    first_audio, handed_s = None, 0.0
    async for event in stream:
        first_audio = first_audio or time.monotonic()
        handed_s += event.frame.duration
        if time.monotonic() >= interrupt_at:
            break
    asked = time.monotonic()
    await stream.aclose()
    confirmed = await asyncio.wait_for(watcher, 10)
    await engine.aclose()
    handed = round(handed_s / FRAME_SECONDS)
    played = min(handed, int((asked - first_audio) / FRAME_SECONDS))
    return result(first_audio - started, confirmed - asked, 0, played, handed, None)


def result(first_audio_s, cancel_s, frames_after, played, handed, heard) -> dict:
    return {
        "first_audio_ms": first_audio_s * 1000,
        "cancel_to_server_end_ms": cancel_s * 1000,
        "frames_after_interrupt": frames_after,
        "played_frames_estimate": played,
        "handed_out_frames": handed,
        "text_offset_played": heard,
    }


RUNNERS = {"library": run_library, "pipecat": run_pipecat, "livekit": run_livekit}


async def cold_library(target: str, tokens: list[str], seed: int) -> float:
    from codecstream.client import AsyncClient

    started = time.monotonic()
    async with AsyncClient(target) as client:
        await client.open_decoder()
        stream = client.stream_text(voice="ryan", seed=seed)
        await stream.open()
        writer = asyncio.ensure_future(write_tokens(stream.push_text, tokens, started))
        async for _ in stream:
            first_audio = time.monotonic()
            break
        writer.cancel()
        await stream.cancel(0)
    return first_audio - started


async def cold_pipecat(target: str, tokens: list[str], seed: int) -> float:
    from codecstream.client.plugins.pipecat import CodecstreamTTSService
    from codecstream.testing.pipecat_pipeline import Pause, Pushed, Until, run_script
    from pipecat.frames.frames import (
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
    )

    tts = CodecstreamTTSService(server=target, settings=CodecstreamTTSService.Settings(voice="ryan", seed=seed))
    script: list = [LLMFullResponseStartFrame(), Pushed("first token")]
    for token in tokens:
        script += [LLMTextFrame(token), Pause(1 / TOKENS_PER_S)]
    script += [LLMFullResponseEndFrame(), Until(TTSAudioRawFrame, timeout_s=120), InterruptionFrame()]
    outcome = await run_script(tts, script)
    first = next(t for f, t in zip(outcome.frames, outcome.times, strict=True) if isinstance(f, TTSAudioRawFrame))
    return first - outcome.marks["start"]  # the decoder's load begins with the pipeline's start


async def cold_livekit(target: str, tokens: list[str], seed: int) -> float:
    from codecstream.client.plugins.livekit import CodecstreamTTS

    engine = CodecstreamTTS(server=target, voice="ryan", seed=seed)
    started = time.monotonic()
    engine.prewarm()  # what LiveKit's session calls at its start
    stream = engine.stream()
    writer = asyncio.ensure_future(write_tokens(stream.push_text, tokens, started))
    writer.add_done_callback(lambda _: stream.end_input())
    async for _ in stream:
        first_audio = time.monotonic()
        break
    await stream.aclose()
    await engine.aclose()
    return first_audio - started


COLD_RUNNERS = {"library": cold_library, "pipecat": cold_pipecat, "livekit": cold_livekit}


def cold_turn(server: ServerProcess, client: str, seed: int, operations_built: bool) -> dict:
    """One cold first turn in a fresh process with an empty client cache, but for the OpenVINO
    operations if `operations_built` (see the module's docstring)."""
    with tempfile.TemporaryDirectory() as cache:
        if operations_built:
            build_openvino_operations(cache)
        done = subprocess.run(
            [sys.executable, __file__, "--cold-turn", client, "--target", server.target, "--seed", str(seed)],
            env={**os.environ, "CODECSTREAM_CACHE_DIR": cache},
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
    return {"first_audio_ms": float(done.stdout.strip().splitlines()[-1]) * 1000}


def run_cold_turn(client: str, target: str, seed: int) -> None:
    # Imported before the clock starts, as an agent process has them by its first call.
    import codecstream.client.plugins.livekit
    import codecstream.client.plugins.pipecat  # noqa: F401

    print(asyncio.run(COLD_RUNNERS[client](target, tokens_of(REPLY), seed)))


def export_onnx(checkpoint: pathlib.Path) -> pathlib.Path:
    out = CACHE / "qwen3-tts-tiny-decoder-onnx"
    if not (out / "manifest.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "codecstream.client.cli", "export-decoder", str(checkpoint / "speech_tokenizer"),
             "--format", "onnx", "--mode", "stateful", "--out", str(out)],
            check=True, capture_output=True,
        )  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8, help="warm turns per client and server")
    parser.add_argument("--cold-repeats", type=int, default=5, help="cold first turns per client and server")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "plugin_bench.json")
    parser.add_argument("--cold-turn", choices=CLIENTS, help=argparse.SUPPRESS)  # one cold turn, in a child
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cold_turn:
        run_cold_turn(args.cold_turn, args.target, args.seed)
        return 0
    started_on = machine()  # before the run: its load average is the one at the start
    from codecstream.protocol import save_codes_file
    from codecstream.testing.random_checkpoint import write_qwen3_tts_checkpoint

    checkpoint = CACHE / "qwen3-tts-tiny"
    if not (checkpoint / "config.json").is_file():
        write_qwen3_tts_checkpoint(checkpoint, preset="tiny", seed=0)
    artifact = export_onnx(checkpoint)
    folder = tempfile.TemporaryDirectory()
    codes = pathlib.Path(folder.name) / "codes.npy"
    save_codes_file(codes, random_codes(200, 0))
    os.environ["CODECSTREAM_CACHE_DIR"] = str(pathlib.Path(folder.name) / "client-cache")
    replay = ["--replay", str(codes), "--replay-checkpoint", str(checkpoint), "--replay-fps", str(FRAMES_PER_SECOND)]
    servers = {"engine": ["--model", str(checkpoint)], f"replay {FRAMES_PER_SECOND:g} fps": replay}
    tokens = tokens_of(REPLY)
    runs = []
    others = {"start": other_processes()}
    for server_name, server_args in servers.items():
        server = ServerProcess([*server_args, "--decoder-artifact", str(artifact)])
        print(f"{server_name}: serving after {server.start_s:.1f} s", flush=True)
        try:
            for repeat in range(args.cold_repeats):
                for mode, built in COLD_MODES.items():
                    for client in CLIENTS:
                        entry = {"server": server_name, "client": client, "mode": mode, "repeat": repeat}
                        entry.update(cold_turn(server, client, seed=200 + repeat, operations_built=built))
                        runs.append(entry)
                        print(
                            f"{server_name:16s} {client:8s} {mode} #{repeat}: "
                            f"first audio {entry['first_audio_ms']:5.0f} ms",
                            flush=True,
                        )
            others[f"{server_name}: after the cold turns"] = other_processes()
            for client in CLIENTS:  # warm-up turn each: the decoder download and first-shape costs
                asyncio.run(RUNNERS[client](server, tokens, seed=99))
            for repeat in range(args.repeats):
                for client in CLIENTS:  # interleaved: every client sees the same machine
                    entry = {"server": server_name, "client": client, "mode": "warm", "repeat": repeat}
                    entry.update(asyncio.run(RUNNERS[client](server, tokens, seed=1 + repeat)))
                    runs.append(entry)
                    print(
                        f"{server_name:16s} {client:8s} #{repeat}: first audio {entry['first_audio_ms']:5.0f} ms, "
                        f"interrupt -> server End {entry['cancel_to_server_end_ms']:4.0f} ms, "
                        f"{entry['frames_after_interrupt']} frames after, played {entry['played_frames_estimate']} "
                        f"of {entry['handed_out_frames']} handed out",
                        flush=True,
                    )
            others[f"{server_name}: after the warm turns"] = other_processes()
        finally:
            server.close()
    summary = {}
    for server_name in servers:
        for client in CLIENTS:
            for mode in COLD_MODES:
                cold = [r for r in runs if (r["server"], r["client"], r["mode"]) == (server_name, client, mode)]
                summary[f"{server_name} / {client} / {mode}"] = {
                    "first_audio_ms": percentiles([r["first_audio_ms"] for r in cold]),
                }
            mine = [r for r in runs if (r["server"], r["client"], r["mode"]) == (server_name, client, "warm")]
            summary[f"{server_name} / {client} / warm"] = {
                "first_audio_ms": percentiles([r["first_audio_ms"] for r in mine]),
                "cancel_to_server_end_ms": percentiles([r["cancel_to_server_end_ms"] for r in mine]),
                "frames_after_interrupt_max": max(r["frames_after_interrupt"] for r in mine),
                "played_vs_handed_out_median": statistics.median(
                    r["played_frames_estimate"] / max(1, r["handed_out_frames"]) for r in mine
                ),
            }
    record = {
        "machine": started_on,
        "versions": versions("pipecat-ai", "livekit-agents", "onnxruntime", "grpcio", "vllm-omni"),
        "reply": REPLY,
        "tokens_per_s": TOKENS_PER_S,
        "listen_before_interrupt_s": LISTEN_S,
        "decoder": "decoder='auto': the server's ONNX stateful fp32 export of the tiny checkpoint",
        "modes": {
            "cold": "the first turn of a fresh process, empty client cache (decoder never loaded, OpenVINO "
            "operations never built: built in the background, the decoder unfused), first token at the TTS's "
            "start; first audio from that start (download, runtime import, compile, turn)",
            "cold, operations built": "the same with the OpenVINO operations built ahead (an install script)",
            "warm": "decoder loaded, one turn spoken before; first audio from the first token, then an interruption",
        },
        # Other work on the 2 cores during the run (load at the start: machine).
        "load_average_1m_at_end": os.getloadavg()[0],
        "other_processes_using_the_cpu": others,
        "summary": summary,
        "runs": runs,
    }
    write_record(record, args.out, plot)
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = sorted({run["server"] for run in record["runs"]})
    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    for axis, mode, key, label in (
        (axes[0], "cold", "first_audio_ms", "cold first turn, empty cache: first audio after the TTS's start (ms)"),
        (axes[1], "cold, operations built", "first_audio_ms", "cold first turn, OpenVINO operations built (ms)"),
        (axes[2], "warm", "first_audio_ms", "warm: first audio after the first token (ms)"),
        (axes[3], "warm", "cancel_to_server_end_ms", "warm: interruption to the server's End(CANCELLED) (ms)"),
    ):
        positions, values, names = [], [], []
        for s_index, server in enumerate(servers):
            for c_index, client in enumerate(CLIENTS):
                mine = [
                    r[key] for r in record["runs"] if (r["server"], r["client"], r["mode"]) == (server, client, mode)
                ]
                positions.append(s_index * (len(CLIENTS) + 1) + c_index)
                values.append(mine)
                names.append(f"{client}\n{server}")
        axis.boxplot(values, positions=positions, widths=0.7)
        axis.set_xticks(positions, names, fontsize=6)
        axis.set_ylabel(label, fontsize=8)
    cpu = record["machine"].get("lscpu", {})
    name = cpu.get("Model name", record["machine"]["cpu"])
    name += f" family {cpu.get('CPU family', '?')} model {cpu.get('Model', '?')}"
    fig.suptitle(f"voice-agent plugins vs the client library ({name})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())

"""The main job on an embedded default, end to end on this machine.

1. builds a tiny random-weight Qwen3-TTS checkpoint in the official layout (no download possible
   or needed), 2. exports its decoder to an ONNX artifact (`codecstream export-decoder`),
3. starts `codecstream-server` on it (the real vLLM-Omni talker on the CPU), 4. speaks a sentence
with `codecstream say`: codes over gRPC, decoded on the client with ONNX Runtime, written to a WAV,
5. proves with `codecstream parity e2e` that the client's audio equals the reference decode,
6. pipes a simulated LLM's reply into `codecstream say -`, which speaks it while it is written.

Run through `scripts/demo` (which sets up .venv first). Everything lands in .cache/demo/.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORK = ROOT / ".cache" / "demo"
BIN = pathlib.Path(sys.executable).parent


def step(message: str) -> None:
    print(f"\n== {message}", flush=True)


def run(*command: str) -> None:
    print("$ " + " ".join(command), flush=True)
    subprocess.run(command, check=True)


def start_server(checkpoint: pathlib.Path) -> tuple[subprocess.Popen, str]:
    port_file = WORK / "server.port"
    port_file.unlink(missing_ok=True)
    log = open(WORK / "server.log", "w")
    command = [
        str(BIN / "codecstream-server"),
        "--model",
        str(checkpoint),
        "--port",
        "0",
        "--port-file",
        str(port_file),
    ]
    print("$ " + " ".join(command) + f"  (log: {log.name})", flush=True)
    server = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    started, shown = time.monotonic(), -10.0
    while not (port_file.exists() and port_file.read_text()):
        if server.poll() is not None:
            raise SystemExit(f"server exited with {server.returncode}; see {log.name}")
        waited = time.monotonic() - started
        if sys.stdout.isatty():
            print(f"\r   engine starting ... {waited:4.0f} s", end="", flush=True)
        elif waited - shown >= 10:
            print(f"   engine starting ... {waited:4.0f} s", flush=True)
            shown = waited
        time.sleep(1)
    print(f"\r   engine ready after {time.monotonic() - started:.0f} s", flush=True)
    return server, f"127.0.0.1:{port_file.read_text()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default="Codec tokens travel over the network; the audio is made right here.")
    parser.add_argument("--voice", default="ryan")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    checkpoint = WORK / "qwen3-tts-tiny"
    artifact = WORK / "decoder-onnx"

    step("1/6 random-weight Qwen3-TTS checkpoint (tiny talker, official layout)")
    if not (checkpoint / "speech_tokenizer" / "model.safetensors").exists():
        run(str(BIN / "python"), "-m", "codecstream.testing.random_checkpoint", str(checkpoint), "--preset", "tiny")
    else:
        print(f"   reusing {checkpoint}")

    step("2/6 export the decoder for the client (stateful, ONNX)")
    if not (artifact / "manifest.json").exists():
        run(
            str(BIN / "codecstream"),
            "export-decoder",
            str(checkpoint),
            "--format",
            "onnx",
            "--mode",
            "stateful",
            "--out",
            str(artifact),
        )
    else:
        print(f"   reusing {artifact}")

    step("3/6 codecstream-server on the real vLLM-Omni talker (CPU)")
    server, target = start_server(checkpoint)
    try:
        step("4/6 codecstream say: codes over gRPC, decoded here (the .onnx file on OpenVINO, else ONNX Runtime)")
        run(str(BIN / "codecstream"), "say", args.text, "--server", target, "--voice", args.voice, "--seed", "7",
            "--decoder", str(artifact), "--out", str(WORK / "demo.wav"))  # fmt: skip
        step("5/6 parity: the client's audio vs the reference decode of the same codes")
        run(str(BIN / "codecstream"), "parity", "e2e", "--server", target, "--text", args.text, "--voice", args.voice,
            "--seed", "7", "--decoder", str(artifact), "--checkpoint", str(checkpoint),
            "--json", str(WORK / "parity_e2e.json"), "--plot", str(WORK / "parity_e2e.png"))  # fmt: skip
        step("6/6 streamed text: a simulated LLM writes its reply at 15 tokens/s, spoken while it writes")
        llm = [str(BIN / "python"), str(ROOT / "examples" / "simulated_llm.py"), "--tokens-per-second", "15"]
        say = [str(BIN / "codecstream"), "say", "-", "--server", target, "--voice", args.voice, "--seed", "7",
               "--decoder", str(artifact), "--out", str(WORK / "streamed.wav")]  # fmt: skip
        print("$ " + " ".join(llm) + " | " + " ".join(say), flush=True)
        writer = subprocess.Popen(llm, stdout=subprocess.PIPE)
        subprocess.run(say, stdin=writer.stdout, check=True)
        writer.wait(60)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    print(
        f"\nDone: {WORK / 'demo.wav'} (random weights: it sounds like noise, by design), "
        f"parity report {WORK / 'parity_e2e.png'}, streamed text {WORK / 'streamed.wav'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

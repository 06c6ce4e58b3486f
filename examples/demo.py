"""Round trip of the codecstream.v1 contract on loopback: a replay server streams codes to the client.

Run through `scripts/demo`. Starts `codecstream-server --replay` on a recorded (here: random)
codes file, streams one utterance with the Python client and prints the chunk timeline.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

from codecstream.client import Client
from codecstream.protocol import save_codes_file


def wait_for_port(port_file: pathlib.Path, process: subprocess.Popen, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text():
            return int(port_file.read_text())
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}")
        time.sleep(0.05)
    raise SystemExit("server did not start in time")


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        codes_file = pathlib.Path(folder) / "utterance.npy"
        save_codes_file(codes_file, np.random.default_rng(0).integers(0, 2048, (50, 16), dtype=np.int16))
        port_file = pathlib.Path(folder) / "port"
        server = subprocess.Popen(
            [sys.executable, "-m", "codecstream.server.cli", "--replay", str(codes_file), "--port", "0",
             "--port-file", str(port_file), "--log-level", "WARNING"],
        )  # fmt: skip
        try:
            port = wait_for_port(port_file, server)
            with Client(f"127.0.0.1:{port}") as client:
                started = time.monotonic()
                stream = client.stream_codes("Hello from codecstream.", voice="vivian")
                for chunk in stream:
                    arrived_ms = (time.monotonic() - started) * 1000
                    print(f"chunk {chunk.seq:2d}: frames {chunk.first_frame:3d}..{chunk.first_frame + chunk.num_frames - 1:3d} "
                          f"({chunk.num_frames:2d}) arrived at {arrived_ms:7.1f} ms, {len(chunk.codes.tobytes())} bytes")  # fmt: skip
            end = stream.end
            seconds = end.frames_generated * 0.08
            print(f"end: {end.frames_generated} frames = {seconds:.2f} s of audio, reason EOS={end.reason == 1}; "
                  f"payload {end.frames_generated * 32 / seconds:.0f} B/s (16-bit PCM would be 48000 B/s)")  # fmt: skip
        finally:
            server.terminate()
            server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())

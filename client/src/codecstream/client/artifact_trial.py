"""A decoder that came from a server is opened first in a child process, then in the client's.

What a server sends is data, but a runtime reading a hostile file can do worse than raise: a .pte
of random bytes aborts ExecuTorch 1.4's Python runtime (SIGABRT), and any runtime's native parser
may crash on a file made to break it. So a downloaded artifact is opened, and decoded once, by a
child process running the runtime the client will run it with; only a file the child opened is kept
and opened by the client. The verdict is kept beside the file (one stamp per runtime), so each file
is tried once, and a cache filled before this check existed is tried at its next use.

    python -m codecstream.client.artifact_trial_child DIRECTORY RUNTIME     # exit 0: it opened and decoded
"""

from __future__ import annotations

import asyncio
import pathlib
import signal
import subprocess
import sys

from codecstream.client.runtimes.errors import DecoderLoadError

#: How the child says why the artifact did not open: the last line of its stderr that starts so
#: (a runtime may write lines of its own before it).
REASON_PREFIX = "artifact_trial: "
#: The longest reason repeated from the child: its message may quote bytes a server chose.
_MAX_REASON_CHARS = 300


def stamp_path(directory: pathlib.Path, runtime: str) -> pathlib.Path:
    return directory / f".opened-by-{runtime}"


async def try_open(directory: pathlib.Path, runtime: str, timeout_s: float) -> None:
    """Raise DecoderLoadError unless a child process opens `directory` with `runtime` and decodes
    with it (open_decoder with its warm-up) within `timeout_s`; stamp the directory when it does."""
    stamp = stamp_path(directory, runtime)
    if stamp.exists():
        return
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "codecstream.client.artifact_trial_child",
        str(directory),
        runtime,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _, stderr = await asyncio.wait_for(child.communicate(), timeout_s)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        child.kill()
        await child.wait()
        raise
    if child.returncode == 0:
        stamp.touch()
        return
    raise DecoderLoadError(f"it does not open on {runtime}: {_reason(child.returncode, stderr)}")


def _reason(returncode: int, stderr: bytes) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the runtime crashed ({name}) opening it in a child process"
    lines = stderr.decode("utf-8", "replace").splitlines()
    reasons = [line[len(REASON_PREFIX) :] for line in lines if line.startswith(REASON_PREFIX)]
    reason = reasons[-1] if reasons else f"the child process that opened it exited with status {returncode}"
    return reason if len(reason) <= _MAX_REASON_CHARS else reason[: _MAX_REASON_CHARS - 3] + "..."

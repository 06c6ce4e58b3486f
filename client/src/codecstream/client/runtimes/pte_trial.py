"""A `.pte` runs first in a child process, once, before it runs in the client's.

ExecuTorch's checks at load (the header, the flatbuffer's verification, the method's own checks of
what it resolves) do not cover what the program's instructions do when they run: of 600 copies of
the tiny test program with a few bits flipped in their flatbuffer, 2 passed every check at load
and crashed the process at their first execution (a jump to a wild address; a kernel's own check
aborting on an argument of the wrong kind). A server may send any file, and a crash would take the
client's app down with it, so a program this client has not run before is opened in a child
process the way the client opens it, decodes a chunk of each warm-up size and the largest chunk,
and only then runs in the client's process (the parent loads its own copy meanwhile). A program
the child ran is remembered in the cache under its manifest digest and the file's identity (device,
inode, size, modification time), so the next open skips the child. A decoder the client downloaded
was tried so already (`codecstream.client.artifact_trial`, which opens it in a child process with
the runtime the client will use): its stamp stands for this trial, and that child runs no trial of
its own.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import signal
import subprocess
import sys

from codecstream.client.artifact_trial import stamp_path
from codecstream.client.cache import cache_root
from codecstream.client.runtimes.errors import DecoderLoadError
from codecstream.protocol.manifest import ArtifactFile

#: Set in the child: it is the trial, and runs no trial of its own.
CHILD_VARIABLE = "CODECSTREAM_PTE_TRIAL"
TIMEOUT_S = 300


class Trial:
    """A child process running a program's trial; `wait` raises DecoderLoadError unless it passed."""

    def __init__(self, process: subprocess.Popen, path: pathlib.Path, mark: pathlib.Path) -> None:
        self._process, self._path, self._mark = process, path, mark

    def wait(self) -> None:
        try:
            _, errors = self._process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.cancel()
            raise DecoderLoadError(
                f"{self._path}: its trial run in a child process took more than {TIMEOUT_S} s; not opened"
            ) from None
        status = self._process.returncode
        if status == 0:
            try:
                self._mark.parent.mkdir(parents=True, exist_ok=True)
                self._mark.touch()
            except OSError:
                pass  # not remembered: the next open runs the trial again
            return
        if status < 0:
            raise DecoderLoadError(
                f"{self._path}: the program crashed the ExecuTorch runtime ({_signal_name(-status)}) when a child "
                "process ran it; it is not opened in this one"
            )
        reason = (errors.strip().splitlines() or ["no reason given"])[-1]
        raise DecoderLoadError(f"{self._path}: failed its trial run in a child process: {reason}")

    def cancel(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self._process.communicate()


def start_trial(directory: pathlib.Path, artifact: ArtifactFile) -> Trial | None:
    """The trial of `artifact` started in a child process; None where none is needed (this is
    the child, or the program passed one before)."""
    if os.environ.get(CHILD_VARIABLE) or stamp_path(directory, "pte").exists():
        return None
    path = directory / artifact.file
    stat = path.stat()
    identity = f"{artifact.sha256}\0{stat.st_dev}\0{stat.st_ino}\0{stat.st_size}\0{stat.st_mtime_ns}"
    mark = cache_root() / "pte-runtime" / "trials" / hashlib.sha256(identity.encode()).hexdigest()[:32]
    if mark.is_file():
        return None
    # The child imports the same codecstream as this process, however this one found it.
    environment = {**os.environ, CHILD_VARIABLE: "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    command = [sys.executable, "-m", "codecstream.client.runtimes.pte_trial_child", str(directory)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environment)
    return Trial(process, path, mark)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"

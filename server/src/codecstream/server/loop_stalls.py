"""Names what stalled the event loop: a watchdog thread that looks at the loop's thread while it is late.

The loop-lag histogram says how often the loop ran late, not why. When the loop misses its
heartbeat by more than `threshold_s`, the watchdog takes the loop thread's Python stack (where it
is stuck) and its CPU clock; once the loop runs again it logs one warning per stall with its
length, how much of it the loop thread spent on the CPU, and that stack. A thread that ran
throughout was blocked by work in the loop (the stack names it); one that barely ran was not
scheduled or waited for the GIL (another thread, a collection, or a busy core). A stall in C code
that holds the GIL holds the watchdog off as well: it is reported once it ends, as unseen.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
import traceback

log = logging.getLogger(__name__)

#: A stall whose thread spent at least this share of it on the CPU was work done in the loop: a
#: thread that waits (sleeps, or for the GIL) uses next to none, and a busy one shares its core
#: with whatever else runs there.
RUNNING_SHARE = 0.25


@dataclasses.dataclass(frozen=True)
class Stall:
    #: How late the loop's heartbeat came.
    seconds: float
    #: From when the watchdog noticed the stall to the heartbeat: the part it could watch.
    watched_seconds: float
    #: CPU time the loop thread used while watched.
    cpu_seconds: float
    #: The loop thread's innermost frames when the stall was noticed, outermost first; empty when
    #: the watchdog could not look (`cause` "unseen").
    stack: tuple[str, ...]

    @property
    def cause(self) -> str:
        """Why: "running" (work in the loop), "not_running" (not scheduled, or waiting for the GIL)
        or "unseen" (the watchdog was held off as well)."""
        if not self.stack:
            return "unseen"
        return "running" if self.cpu_seconds >= RUNNING_SHARE * self.watched_seconds else "not_running"

    def describe(self) -> str:
        if self.cause == "unseen":
            return (
                f"the server process stalled {self.seconds:.3f} s, the stall watchdog's thread with it "
                "(C code holding the GIL, or the process not scheduled)"
            )
        why = "blocked by work in the loop" if self.cause == "running" else "not scheduled, or waiting for the GIL"
        return (
            f"event loop stalled {self.seconds:.3f} s; its thread was on the CPU {self.cpu_seconds:.3f} s "
            f"of the {self.watched_seconds:.3f} s watched ({why}); it was in: {' <- '.join(reversed(self.stack))}"
        )


class LoopStallWatchdog:
    """`beat()` from the loop (at least every `period_s`); `start()` and `stop()` from anywhere.

    `on_stall` is called from the watchdog thread with each Stall once the loop beats again.
    """

    def __init__(self, period_s: float, threshold_s: float = 0.1, on_stall=None, frames: int = 6) -> None:
        self.period_s = period_s
        self.threshold_s = threshold_s
        self._on_stall = on_stall or (lambda stall: log.warning("%s", stall.describe()))
        self._frames = frames
        self._loop_thread: int | None = None
        self._last_beat = time.monotonic()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        self._loop_thread = threading.get_ident()
        self._last_beat = time.monotonic()

    def start(self) -> None:
        self.beat()
        self._thread = threading.Thread(target=self._watch, name="loop-stall-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()

    def _cpu_seconds(self, thread: int) -> float:
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(thread))
        except (AttributeError, OSError):  # not on Linux, or the thread is gone
            return float("nan")

    def _watch(self) -> None:
        poll_s = self.threshold_s / 2
        woke = time.monotonic()
        while not self._stopped.wait(poll_s):
            slept, woke = time.monotonic() - woke, time.monotonic()
            if slept > poll_s + self.threshold_s:
                # This thread was held off too: by C code holding the GIL, or the whole process
                # not being scheduled. Whatever the loop thread did then cannot be seen.
                self._on_stall(Stall(slept - poll_s, 0.0, float("nan"), ()))
                continue
            beat, thread = self._last_beat, self._loop_thread
            if thread is None or time.monotonic() - beat < self.period_s + self.threshold_s:
                continue
            # Late: look at the loop thread now, while it is stuck, then wait for it to beat again.
            noticed, cpu_at_notice = time.monotonic(), self._cpu_seconds(thread)
            frame = sys._current_frames().get(thread)
            entries = traceback.extract_stack(frame)[-self._frames :] if frame is not None else []
            stack = tuple(f"{path_tail(entry.filename)}:{entry.lineno} {entry.name}" for entry in entries) or ("?",)
            del frame
            while self._last_beat == beat:
                if self._stopped.wait(poll_s):
                    return
            # The CPU clock and the watched time are read together, so both cover the same span.
            cpu, watched = self._cpu_seconds(thread) - cpu_at_notice, time.monotonic() - noticed
            self._on_stall(Stall(self._last_beat - beat - self.period_s, watched, cpu, stack))
            woke = time.monotonic()


def path_tail(filename: str, parts: int = 2) -> str:
    """The last `parts` components of a path: enough to name a module without the install prefix."""
    return "/".join(filename.replace("\\", "/").split("/")[-parts:])

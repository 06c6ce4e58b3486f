"""A progress display for steps that take tens of seconds: numbered stages with elapsed time.

On a terminal the current stage's clock ticks in place; elsewhere (CI logs, pipes) each stage
prints one line when it starts and one when it ends, so the log shows where the time went.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.index = 0
        self.live = enabled and self.stream.isatty()
        self.started = time.monotonic()

    @contextlib.contextmanager
    def stage(self, title: str) -> Iterator[None]:
        """Show `title` while the block runs, then how long it took."""
        self.index += 1
        prefix = f"[{self.index}/{self.total}] {title}"
        began = time.monotonic()
        stop = threading.Event()
        ticker = None
        if self.live:
            ticker = threading.Thread(target=self._tick, args=(prefix, began, stop), daemon=True)
            ticker.start()
        elif self.enabled:
            print(f"{prefix} ...", file=self.stream, flush=True)
        try:
            yield
        except BaseException:
            self._finish(stop, ticker, f"{prefix}: failed after {time.monotonic() - began:.1f} s")
            raise
        self._finish(stop, ticker, f"{prefix}: done in {time.monotonic() - began:.1f} s")

    def note(self, text: str) -> None:
        if self.enabled:
            print(f"      {text}", file=self.stream, flush=True)

    def _tick(self, prefix: str, began: float, stop: threading.Event) -> None:
        while not stop.wait(0.5):
            print(f"\r{prefix} ... {time.monotonic() - began:.0f} s", end="", file=self.stream, flush=True)

    def _finish(self, stop: threading.Event, ticker: threading.Thread | None, line: str) -> None:
        stop.set()
        if ticker is not None:
            ticker.join()
            print("\r\033[K", end="", file=self.stream)
        if self.enabled:
            print(line, file=self.stream, flush=True)

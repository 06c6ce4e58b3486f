"""The engine's construction in a thread that a stop does not wait for.

`AsyncOmni(...)` takes tens of seconds (minutes on a GPU's first start) and cannot be interrupted.
A server told to stop meanwhile ends the start instead of waiting for it: it kills the processes
the start spawned (vLLM's start-up handshake then fails at once), leaves the thread, a daemon, to
end by itself, and shuts down an engine that still comes up while the process lives. What the
start's code then reports of the kill (vLLM's and vLLM-Omni's errors with their tracebacks, its
threads' uncaught exceptions: 65 ERROR lines and 3 tracebacks on the CPU engine) is muted: the
operator asked for the stop, and the process is on its way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psutil

log = logging.getLogger(__name__)

Engine = TypeVar("Engine")


async def create_engine(create: Callable[[], Engine], shutdown: Callable[[Engine], None]) -> Engine:
    """`create()` in a daemon thread; on cancellation, end what it started (see the module docstring)."""
    loop = asyncio.get_running_loop()
    created: asyncio.Future = loop.create_future()
    began = time.time()

    def run() -> None:
        try:
            outcome = (create(), None)
        except BaseException as error:  # handed to the waiting coroutine
            outcome = (None, error)
        try:
            loop.call_soon_threadsafe(_settle, created, *outcome)
        except RuntimeError:  # the loop is closed: nobody waits for the engine any more
            if outcome[0] is not None:
                shutdown(outcome[0])

    threading.Thread(target=run, name="engine-start", daemon=True).start()
    try:
        return await asyncio.shield(created)
    except asyncio.CancelledError:
        _mute_abandoned_start()
        killed = _kill_children_since(began)
        log.info("stopped while the engine was starting: killed %d engine processes", killed)
        created.add_done_callback(lambda done: _shut_down_if_up(done, shutdown))
        raise


def _settle(future: asyncio.Future, engine, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(engine)


def _shut_down_if_up(done: asyncio.Future, shutdown: Callable) -> None:
    if done.cancelled() or done.exception() is not None:
        return
    threading.Thread(target=shutdown, args=(done.result(),), name="engine-shutdown", daemon=True).start()


def _mute_abandoned_start() -> None:
    """Silence the engine's loggers and the uncaught exceptions of threads from now on."""
    muted = logging.CRITICAL + 1
    names = [name for name in logging.Logger.manager.loggerDict if name.split(".")[0] in _ENGINE_LOGGERS]
    for name in {*_ENGINE_LOGGERS, *names}:
        logger = logging.getLogger(name)
        logger.setLevel(muted)
        for handler in logger.handlers:
            handler.setLevel(muted)
    threading.excepthook = _after_the_stop


def _after_the_stop(args: threading.ExceptHookArgs) -> None:
    thread = args.thread.name if args.thread is not None else "a thread"
    log.debug("after the stop, %s ended with %s", thread, args.exc_type.__name__)


#: The top-level loggers of the engine's code (vLLM's, vLLM-Omni's).
_ENGINE_LOGGERS = ("vllm", "vllm_omni")


def _kill_children_since(began: float) -> int:
    """Kill this process's descendants created at or after `began` (the engine's processes)."""
    victims = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.create_time() >= began - 1.0:  # create_time has a coarse clock on some systems
                child.kill()
                victims.append(child)
    psutil.wait_procs(victims, timeout=5)
    return len(victims)

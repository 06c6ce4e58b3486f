"""The engine's process forked from one that imported the engine's stack once, instead of spawned.

vLLM-Omni starts the talker stage's engine core in a process of its own and forces `spawn` for it:
a fresh interpreter that imports torch, vLLM and vLLM-Omni again, on every start and on every
restart of the engine after a crash (the largest phase of each, docs/server.md, "Start
timeline"). Here (on unless `CODECSTREAM_ENGINE_FORKSERVER=0`) the server starts a
multiprocessing forkserver before it imports the stack itself, so that the two imports run side by
side, and the forkserver preloads the stack once; each engine process is then forked from it,
and a restart pays no import at all.

A child of a process that asked CUDA anything (the device count included) cannot use CUDA: torch
marks every fork of one. The preload avoids what asks (forkserver_preload.py), and on a CUDA host a
probe forked from the forkserver before the first engine process reports whether its children are
marked; where they are, the engine process is spawned, as vLLM-Omni does, and the log says why. (A
CPU engine never uses CUDA, so a mark there, which a CUDA build of torch leaves after its device
count, changes nothing.)

A forked child inherits the environment the forkserver had when it began, not the server's when
the engine starts. vLLM-Omni and vLLM set variables for their engine process just before starting
it, and tests start engines with different settings in one process, so each engine process is
given the server's environment of that moment before it runs anything.

vLLM-Omni takes its process context from vLLM's `get_mp_context` (by the name it imported), whose
choices are spawn and fork only: this module replaces that name in vLLM-Omni's process manager, the
one place it starts engine processes, with a context that still runs vLLM's own checks first.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

#: On by default: engine processes are forked from a forkserver that preloaded the stack. "0"
#: spawns each, as vLLM-Omni does, to measure the difference (docs/server.md, "Start timeline").
ENABLE_VARIABLE = "CODECSTREAM_ENGINE_FORKSERVER"
#: What the forkserver imports once, heaviest first (the last one resolves the platforms and imports
#: the engine's own modules, vLLM-Omni's only off CUDA hosts); a module it cannot import is skipped.
PRELOAD = ("torch", "transformers", "vllm", "codecstream.server.engine.forkserver_preload")
#: The longest the probe of the forkserver's children waits for its answer (the forkserver may
#: still be importing when the first engine starts).
PROBE_TIMEOUT_S = 600.0


def enabled() -> bool:
    return os.environ.get(ENABLE_VARIABLE, "1") != "0"


def start_forkserver() -> None:
    """Begin the forkserver's imports now (they run beside the caller's own); a no-op when off
    or already running."""
    if not enabled():
        return
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    server = _stdlib_forkserver()
    running = server._forkserver_pid
    server.ensure_running()
    if server._forkserver_pid != running:  # not the one a restart reuses
        log.info("engine processes fork from a forkserver that imports %s once", ", ".join(PRELOAD))


def stop_forkserver() -> None:
    """End the forkserver with the server's process, at once: it may still be importing (then it
    reads nothing from the server yet), and it writes to the server's stderr, whose last line is
    the server's reason for exiting. A no-op when none runs."""
    server = _stdlib_forkserver()
    pid = server._forkserver_pid
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    # Closes its pipe and reaps it; a stopped start's cleanup may have reaped it already.
    with contextlib.suppress(ChildProcessError):
        server._stop()


def _stdlib_forkserver() -> Any:
    """The stdlib's one forkserver of this process: no public handle exists to its pid or its stop."""
    from multiprocessing import forkserver

    return forkserver._forkserver


def use_forkserver_for_engines() -> None:
    """Make vLLM-Omni start engine processes from the forkserver (when on)."""
    if not enabled():
        return
    from vllm_omni.engine import stage_engine_core_proc_manager as manager

    if isinstance(getattr(manager.get_mp_context, "__self__", None), EngineProcessContext):
        return
    manager.get_mp_context = EngineProcessContext(manager.get_mp_context).checked


def _run_in_environment(environment: Mapping[str, str], target: Callable, args: tuple, kwargs: dict) -> Any:
    """The child's first step: the environment its parent had when it asked for this process, and
    its name where `ps` and psutil read it."""
    os.environ.clear()
    os.environ.update(environment)
    _name_this_process(multiprocessing.current_process().name)
    return target(*args, **kwargs)


def _name_this_process(name: str) -> None:
    """vLLM titles its engine process with setproctitle, which has no effect in a forkserver's
    child (its command line stays the forkserver's): the kernel's name for the process (15 bytes,
    "StageEngineCore" for vLLM-Omni's) is what tools see instead."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


#: prctl's option that sets the calling thread's name (linux/prctl.h).
_PR_SET_NAME = 15


def _report_cuda_usable(sender: Any) -> None:
    """The probe's body, in a child of the forkserver: whether torch did not mark it a bad fork (its
    parent asked CUDA), which would make its first CUDA call fail."""
    import sys

    torch = sys.modules.get("torch")
    sender.send(torch is None or not torch.cuda._is_in_bad_fork())
    sender.close()


def children_may_use_cuda(context: Any) -> bool:
    """Whether a process forked from the forkserver of `context` may use CUDA (one probe, forked)."""
    receiver, sender = context.Pipe(duplex=False)
    probe = context.Process(target=_report_cuda_usable, args=(sender,), name="codecstream-cuda-probe")
    probe.start()
    sender.close()
    try:
        return bool(receiver.recv()) if receiver.poll(PROBE_TIMEOUT_S) else False
    except EOFError:  # the probe died before it answered
        return False
    finally:
        receiver.close()
        probe.join(10)


class EngineProcessContext:
    """The forkserver context, its processes started in their parent's current environment."""

    def __init__(self, vllm_get_mp_context: Callable[[], Any]) -> None:
        self._vllm_get_mp_context = vllm_get_mp_context
        self._context = multiprocessing.get_context("forkserver")
        #: The forkserver whose children were probed (its pid) and the answer.
        self._probed: tuple[int | None, bool] | None = None

    def checked(self) -> Any:
        # vLLM's own checks and environment fixes first; its choice stands where it is not spawn.
        # Where CUDA is initialized in this process vLLM forces spawn because a fork of this
        # process would inherit it; a forkserver's child inherits nothing of this process, only
        # the forkserver's state, which the probe checks. On a GPU host the server's process has
        # CUDA initialized by the time it starts an engine, so that check must not apply here.
        vllm_context = self._vllm_get_mp_context()
        if vllm_context.get_start_method() != "spawn":
            log.info("the engine process starts by %s, vLLM's choice", vllm_context.get_start_method())
            return vllm_context
        from vllm.platforms import current_platform

        if current_platform.is_cuda_alike() and not self._children_may_use_cuda():
            log.warning(
                "the engine process is spawned: the forkserver asked CUDA while importing,"
                " so no process forked from it may use CUDA"
            )
            return vllm_context
        log.info("the engine process forks from the forkserver")
        return self

    def _children_may_use_cuda(self) -> bool:
        """The probe's answer for the forkserver running now (a new one, after a stop, is probed again)."""
        _stdlib_forkserver().ensure_running()
        pid = _stdlib_forkserver()._forkserver_pid
        if self._probed is None or self._probed[0] != pid:
            self._probed = (pid, children_may_use_cuda(self._context))
        return self._probed[1]

    def Process(self, *, target: Callable, args: tuple = (), kwargs: dict | None = None, **options: Any):
        carried = (dict(os.environ), target, tuple(args), dict(kwargs or {}))
        return self._context.Process(target=_run_in_environment, args=carried, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

"""Engine processes forked from a forkserver (engine/engine_process.py): each runs in the environment
its parent had when it asked for it, under its own name, vLLM's own choice of start method is kept where it is not
spawn, and the switch is on unless set to 0."""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys

import pytest
from codecstream.server.engine import engine_process
from codecstream.server.engine.engine_process import ENABLE_VARIABLE, EngineProcessContext


def write_probe(path: str, name: str) -> None:
    with open("/proc/self/comm") as comm, open(path, "w") as out:
        out.write(f"{os.environ.get(name)} {comm.read().strip()}")


def test_an_engine_process_runs_in_the_environment_of_the_moment_it_was_asked_for(tmp_path, monkeypatch):
    context = EngineProcessContext(lambda: multiprocessing.get_context("spawn")).checked()
    assert isinstance(context, EngineProcessContext)
    # Set after the forkserver may already run (another test, or the server's start): the child
    # must see it anyway, and must not see what the parent removed.
    monkeypatch.setenv("CODECSTREAM_PROBE", "set late")
    monkeypatch.delenv("CODECSTREAM_PROBE_GONE", raising=False)
    os.environ["CODECSTREAM_PROBE_GONE"] = "x"
    del os.environ["CODECSTREAM_PROBE_GONE"]
    out = tmp_path / "probe"
    # vLLM-Omni's name for it: what ps and psutil show (setproctitle has no effect here).
    name = "StageEngineCoreProc_stage0_replica0"
    process = context.Process(target=write_probe, args=(str(out), "CODECSTREAM_PROBE"), name=name)
    process.start()
    process.join(120)
    assert process.exitcode == 0
    assert out.read_text() == "set late StageEngineCore"
    gone = tmp_path / "gone"
    process = context.Process(target=write_probe, kwargs={"path": str(gone), "name": "CODECSTREAM_PROBE_GONE"})
    process.start()
    process.join(120)
    assert gone.read_text().startswith("None")


def test_vllm_s_start_method_stands_where_it_is_not_spawn():
    fork = multiprocessing.get_context("fork")
    assert EngineProcessContext(lambda: fork).checked() is fork


def test_engines_fork_from_the_forkserver_where_the_caller_has_initialized_cuda(monkeypatch):
    # On a GPU host the server's own process has CUDA initialized by the time it starts an engine
    # (the H100 lane, 12b9d0d: every engine process was spawned, 37 s of imports each). A forkserver's
    # child does not inherit its caller's CUDA state, only the forkserver's, which never touches CUDA.
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    context = EngineProcessContext(lambda: multiprocessing.get_context("spawn")).checked()
    assert isinstance(context, EngineProcessContext)


#: A fresh process's forkserver, preloading the modules named as arguments: may its children use CUDA?
_PROBE = """
import multiprocessing, sys
from codecstream.server.engine.engine_process import children_may_use_cuda
context = multiprocessing.get_context("forkserver")
context.set_forkserver_preload(sys.argv[1:])
print(children_may_use_cuda(context))
"""


def test_the_probe_finds_the_forkserver_s_children_marked_where_its_imports_asked_cuda(tmp_path):
    import torch

    if not hasattr(torch._C, "_cuda_isInBadFork"):
        pytest.skip("a CPU build of torch marks no fork")
    # torch marks every fork of a process that asked CUDA anything, its device count included (on a
    # host without a GPU as well): the mark the H100 lane at f75d9fc hit, where vLLM-Omni's imports
    # in the forkserver asked for the device's capability.
    (tmp_path / "asks_cuda.py").write_text("import torch\ntorch.cuda.is_available()\n")
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}

    def probe(*preload: str) -> str:
        run = subprocess.run(
            [sys.executable, "-c", _PROBE, *preload], env=environment, capture_output=True, text=True, timeout=300
        )
        return run.stdout.split()[-1] if run.stdout.split() else run.stderr[-2000:]

    assert probe("torch") == "True"
    assert probe("asks_cuda") == "False"


def test_on_a_cuda_host_an_engine_process_is_spawned_where_the_forkserver_s_children_cannot_use_cuda(
    monkeypatch, caplog
):
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cuda_alike", lambda: True)
    spawn = multiprocessing.get_context("spawn")
    monkeypatch.setattr(engine_process, "children_may_use_cuda", lambda context: False)
    with caplog.at_level(logging.WARNING, logger=engine_process.__name__):
        assert EngineProcessContext(lambda: spawn).checked() is spawn
    assert "the forkserver asked CUDA while importing" in caplog.text
    monkeypatch.setattr(engine_process, "children_may_use_cuda", lambda context: True)
    assert isinstance(EngineProcessContext(lambda: spawn).checked(), EngineProcessContext)


#: The forkserver's preload in a fresh interpreter, with vLLM's platform answering that it is CUDA.
_PRELOAD_ON_CUDA = """
import sys
import vllm.platforms
vllm.platforms.current_platform.is_cuda_alike = lambda: True
import codecstream.server.engine.forkserver_preload
print(sorted({name.split(".")[0] for name in sys.modules if name.startswith("vllm_omni")}))
"""


def test_on_a_cuda_host_the_forkserver_imports_nothing_of_vllm_omni():
    # vLLM-Omni creates a CUDA context at import (its FP8 patch reads the device's capability).
    result = subprocess.run(
        [sys.executable, "-c", _PRELOAD_ON_CUDA], capture_output=True, text=True, timeout=600, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stderr[-3000:]
    assert "left to the engine process: vllm_omni.engine.stage_engine_core_proc" in result.stderr


def test_on_unless_set_to_0(monkeypatch):
    monkeypatch.delenv(ENABLE_VARIABLE, raising=False)
    assert engine_process.enabled()
    monkeypatch.setenv(ENABLE_VARIABLE, "0")
    assert not engine_process.enabled()
    engine_process.start_forkserver()  # a no-op: nothing started, nothing replaced


@pytest.mark.engine
def test_with_the_forkserver_a_killed_engine_is_forked_again_and_serves(tmp_path, monkeypatch):
    """The real server on the CPU engine, its engine process forked from the forkserver: killed, it
    comes back (from the same forkserver, without the imports) and serves a stream to its end."""
    import asyncio

    from codecstream.client import AsyncClient
    from codecstream.testing.random_checkpoint import write_qwen3_tts_checkpoint
    from codecstream.testing.server_process import NOT_SERVING, SERVING, ServerProcess
    from codecstream.testing.waiting import wait_for

    monkeypatch.setenv(ENABLE_VARIABLE, "1")  # the server process inherits it
    checkpoint = write_qwen3_tts_checkpoint(tmp_path / "qwen3-tts-tiny", preset="tiny", seed=0)
    with ServerProcess(["--model", str(checkpoint)], log=tmp_path / "server.log") as server:
        server.wait_until_serving(600)
        cores = server.engine_cores()
        assert len(cores) == 1, server.log_tail()
        forkserver = cores[0].parent()
        assert forkserver.pid != server.process.pid and forkserver.parent().pid == server.process.pid
        cores[0].kill()
        wait_for(lambda: server.health() == NOT_SERVING, 60, "health NOT_SERVING after the kill")
        wait_for(lambda: server.health() == SERVING, 600, "health SERVING after the restart", step_s=0.5)
        assert server.metric("codecstream_engine_restarts_total") == 1
        again = server.engine_cores()
        assert len(again) == 1 and again[0].pid != cores[0].pid and again[0].parent().pid == forkserver.pid

        async def one_stream() -> int:
            async with AsyncClient(server.target) as client:
                stream = client.stream_codes("After the restart.", voice="ryan", seed=1, max_frames=6)
                return sum([chunk.num_frames async for chunk in stream])

        assert asyncio.run(one_stream()) > 0
        # What codecstream's modules log inside the engine's process reaches the server's log.
        assert "INFO codecstream.server.engine.talker_model: codecstream's code predictor:" in server.output()
        # The restart reused the forkserver, and the log says it started one only once.
        assert server.output().count("engine processes fork from a forkserver") == 1
        # Each engine process says how it started (on the H100 the fall-back to spawn went unseen).
        assert server.output().count("the engine process forks from the forkserver") == 2

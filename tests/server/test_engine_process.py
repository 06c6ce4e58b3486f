"""`codecstream-server --model` as an operator runs it, on the real CPU engine: a dead engine is
visible at once (health, metrics, statuses) and comes back, or the process exits for its supervisor."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import grpc
import psutil
import pytest
from codecstream.client import Client, StreamEnded, Unavailable
from codecstream.testing.random_checkpoint import write_qwen3_tts_checkpoint
from codecstream.testing.server_process import (
    NOT_SERVING,
    SERVER,
    SERVING,
    ServerProcess,
    free_port,
)
from codecstream.testing.waiting import eventually, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc

pytestmark = pytest.mark.engine

#: Several times the engine's start on a loaded 2-core machine (docs/performance.md).
START_TIMEOUT_S = 300
#: What vLLM-Omni names the stage's engine-core process.
ENGINE_CORE = "StageEngineCoreProc"


@pytest.fixture(scope="module")
def long_checkpoint(tmp_path_factory):
    # Utterances of ~5000 frames on average: a stream is still running when the engine is killed.
    return write_qwen3_tts_checkpoint(tmp_path_factory.mktemp("qwen3-tts-long"), preset="tiny", mean_frames=5000)


def test_a_killed_engine_is_reported_at_once_restarted_and_after_the_last_restart_the_process_exits_3(
    long_checkpoint, tmp_path
):
    # One restart allowed: the first kill is survived, the second ends the process for its supervisor.
    server = ServerProcess(["--model", str(long_checkpoint), "--engine-restarts", "1"])
    engine_processes = []
    try:
        server.wait_until_serving(START_TIMEOUT_S)
        assert server.health() == SERVING
        assert server.metric("codecstream_engine_up") == 1
        with Client(server.target) as client:
            stream = client.stream_codes("A long text.", voice="ryan", seed=1, chunking=[1])
            next(stream)
            engine_processes += server.children()
            (core,) = server.engine_cores()
            core.kill()
            not_serving_after = wait_for(lambda: server.health() == NOT_SERVING, 10, "health NOT_SERVING")
            with pytest.raises(StreamEnded) as ended:
                for _ in stream:
                    pass
            with pytest.raises(Unavailable, match="the engine failed"):
                client.stream_codes("Hi.", voice="ryan").open()
        print(f"health NOT_SERVING {not_serving_after:.3f} s after the EngineCore was killed")
        assert not_serving_after <= 1.0, f"health turned NOT_SERVING {not_serving_after:.2f} s after the kill"
        message = ended.value.end.message
        assert "\n" not in message and "engine" in message and len(message) < 300
        assert server.metric("codecstream_engine_up") == 0

        wait_for(lambda: server.health() == SERVING, START_TIMEOUT_S, "health SERVING again", step_s=0.5)
        assert server.metric("codecstream_engine_up") == 1
        assert server.metric("codecstream_engine_restarts_total") == 1
        with Client(server.target) as client:
            assert next(iter(client.stream_codes("Back again.", voice="ryan", seed=2))).num_frames > 0

        engine_processes += server.children()
        for core in server.engine_cores():
            core.kill()
        server.process.wait(timeout=120)
    finally:
        code = server.stop(timeout_s=60)
    assert code == 3, server.errors()[-2000:]
    assert "codecstream-server: error: the engine failed and could not be restarted" in server.errors()
    _, alive = psutil.wait_procs(engine_processes, timeout=30)
    assert not alive, f"engine processes left after the exit: {alive}"


def test_a_busy_port_fails_before_the_engine_starts(long_checkpoint):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = subprocess.run(
            [*SERVER, "--model", str(long_checkpoint), "--port", str(port)], capture_output=True, text=True, timeout=300
        )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"codecstream-server: error: cannot serve gRPC on 127.0.0.1:{port}: Address already in use"
    )
    assert ENGINE_CORE not in result.stdout + result.stderr, "the engine was started although the port was busy"


def test_an_engine_that_fails_to_start_exits_1_with_one_line_and_leaves_nothing_running(long_checkpoint, tmp_path):
    deploy = tmp_path / "broken.yaml"
    deploy.write_text("pipeline: qwen3_tts_talker_only\nstages:\n  - stage_id: 0\n    max_model_len: -5\n")
    server = ServerProcess(["--model", str(long_checkpoint), "--deploy-config", str(deploy)])
    try:
        wait_for(lambda: server.children() or server.process.poll() is not None, 120, "the engine's start or an exit")
        children = server.children()
        server.process.wait(START_TIMEOUT_S)
    finally:
        server.stop()
    assert server.process.returncode == 1
    assert server.errors().strip().splitlines()[-1].startswith("codecstream-server: error: the engine did not start: ")
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"processes left after a failed start: {alive}"


def test_a_signal_while_the_engine_starts_stops_the_start_instead_of_waiting_for_it(long_checkpoint, tmp_path):
    """SIGTERM during the engine's start (tens of seconds on this CPU): the process ends the start it
    no longer needs, leaves no engine process behind and exits 0, instead of waiting for the
    engine to come up only to shut it down (52 s here), and what the killed start reports is not an
    error of the server's: on main vLLM-Omni wrote 3 tracebacks (65 ERROR lines) after the stop.
    The bound is a hang check: a fraction of a start."""
    began = time.time()
    server = ServerProcess(["--model", str(long_checkpoint)], port=free_port(), log=tmp_path / "server.log")
    try:
        wait_for(lambda: starting(server.target), START_TIMEOUT_S, "listening, the engine not up", step_s=0.1)
        # Well into the start: the engine core's process is being built.
        wait_for(server.engine_cores, START_TIMEOUT_S, "the engine core's process", step_s=0.1)
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(20)
    finally:
        server.stop()  # kills what a failed check left; after an exit, nothing (the check below is on them)
    out = server.output()
    assert code == 0, out[-2000:]
    assert "codecstream-server: stopped while starting" in out
    assert not server.port_file.exists()
    after_the_stop = out[out.index("stopped while the engine was starting") :]
    assert "Traceback" not in after_the_stop and "ERROR" not in after_the_stop, after_the_stop[-3000:]
    # Bounded by what a process ending with the server takes: one alive after it is an orphan.
    if not eventually(lambda: not orphans_since(began), 2):
        left = [(orphan.pid, orphan.info["name"]) for orphan in orphans_since(began)]
        raise AssertionError(f"processes the start left behind: {left}")


def orphans_since(began: float) -> list[psutil.Process]:
    """Processes made since `began` whose parent is gone (reparented to init)."""
    return [
        process
        for process in psutil.process_iter(["create_time", "ppid", "name"])
        if process.info["create_time"] >= began and process.info["ppid"] == 1
    ]


def starting(target: str) -> bool:
    """Whether a server listens at `target` and answers NOT_SERVING (its engine is starting)."""
    try:
        with grpc.insecure_channel(target) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1).status
    except grpc.RpcError:
        return False
    return status == health_pb2.HealthCheckResponse.NOT_SERVING

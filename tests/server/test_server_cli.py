"""`codecstream-server` as an operator runs it: a real process, real port, clean errors and shutdown."""

import socket
import subprocess
import sys

import numpy as np
import pytest
from codecstream.client import Client
from codecstream.protocol import save_codes_file
from codecstream.testing.server_process import SERVER, ServerProcess

from tests.conftest import random_codes


def run_server(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVER, *args], capture_output=True, text=True, timeout=timeout)


def test_missing_codes_file_exits_1_with_one_line(tmp_path):
    result = run_server("--replay", str(tmp_path / "none.npy"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"codecstream-server: error: {tmp_path / 'none.npy'}: no such codes file"
    ]


def test_corrupt_codes_file_exits_1_naming_the_problem(tmp_path):
    bad = tmp_path / "bad.npy"
    np.save(bad, np.full((3, 16), 4000, dtype=np.int16))
    result = run_server("--replay", str(bad))
    assert result.returncode == 1
    assert "codes out of range: frame 0 codebook 0 has 4000" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_chunking_flag_exits_1(tmp_path):
    codes = tmp_path / "c.npy"
    save_codes_file(codes, random_codes(3))
    result = run_server("--replay", str(codes), "--chunking", "2,0")
    assert result.returncode == 1 and "chunk size 1 is 0 frames" in result.stderr


def test_a_negative_per_client_stream_limit_exits_1_with_one_line(tmp_path):
    codes = tmp_path / "c.npy"
    save_codes_file(codes, random_codes(3))
    result = run_server("--replay", str(codes), "--max-streams-per-client", "-1")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "codecstream-server: error: --max-streams-per-client must be >= 0, got -1"
    ]


@pytest.mark.parametrize(
    ("flag", "value", "rule"),
    [
        ("--max-streams", "0", ">= 1"),
        ("--max-frames", "-5", ">= 1"),
        ("--max-text-chars", "0", ">= 1"),
        ("--max-instructions-chars", "-1", ">= 0"),
        ("--rate-limit", "-1", ">= 0"),
        ("--resume-window", "-2", ">= 0"),
        ("--max-reference-seconds", "-1", ">= 0"),
        ("--stalled-client-timeout", "0", "> 0"),
        ("--keepalive", "-1", "> 0"),
        ("--replay-fps", "-1", ">= 0"),
        ("--port", "70000", "0-65535"),
    ],
)
def test_a_numeric_flag_out_of_its_range_exits_1_with_one_line(tmp_path, flag, value, rule):
    codes = tmp_path / "c.npy"
    save_codes_file(codes, random_codes(3))
    result = run_server("--replay", str(codes), flag, value)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"codecstream-server: error: {flag} must be {rule}, got {value}"]


def test_usage_error_exits_2():
    assert run_server().returncode == 2


def test_replay_server_process_serves_and_shuts_down_on_sigterm(tmp_path):
    codes_file = tmp_path / "c.npy"
    codes = random_codes(30)
    save_codes_file(codes_file, codes)
    server = ServerProcess(["--replay", str(codes_file), "--replay-fps", "0"])
    try:
        server.wait_until_serving(30)
        with Client(server.target) as client:
            received = np.concatenate([c.codes for c in client.stream_codes("Hi.")])
        np.testing.assert_array_equal(received, codes)
    finally:
        code = server.stop(timeout_s=30)
    assert code == 0, server.errors()
    assert "shutting down" in server.output()


def busy_port() -> socket.socket:
    """A listening socket on a free loopback port (close it to free the port)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_busy_grpc_port_exits_1_with_one_line_naming_it(tmp_path):
    codes = tmp_path / "c.npy"
    save_codes_file(codes, random_codes(3))
    with busy_port() as sock:
        port = sock.getsockname()[1]
        result = run_server("--replay", str(codes), "--port", str(port))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"codecstream-server: error: cannot serve gRPC on 127.0.0.1:{port}: Address already in use"
    ]


def test_a_busy_metrics_port_exits_1_naming_the_metrics_port_not_the_grpc_one(tmp_path):
    codes = tmp_path / "c.npy"
    save_codes_file(codes, random_codes(3))
    with busy_port() as sock:
        port = sock.getsockname()[1]
        result = run_server("--replay", str(codes), "--port", "0", "--metrics-port", str(port))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"codecstream-server: error: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    ]


def test_a_model_directory_that_is_not_a_checkpoint_exits_1_with_one_line(tmp_path):
    result = run_server("--model", str(tmp_path), timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"codecstream-server: error: {tmp_path} has no config.json: not a Qwen3-TTS checkpoint"
    ]


def test_a_missing_engine_exits_1_saying_how_to_install_it(tmp_path):
    from codecstream.testing.random_checkpoint import write_qwen3_tts_checkpoint

    checkpoint = write_qwen3_tts_checkpoint(tmp_path / "tiny", preset="tiny")
    # The engine's absence, simulated: importing vllm_omni fails as it does where it is not installed.
    code = (
        "import sys; sys.modules['vllm_omni'] = None; from codecstream.server.cli import main; "
        f"sys.exit(main(['--model', {str(checkpoint)!r}]))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("codecstream-server: error: the vLLM-Omni engine is not installed")
    assert "scripts/setup-dev-env" in lines[0]


def test_without_flags_the_server_runs_with_the_library_s_own_defaults():
    from codecstream.server.app import ServerOptions
    from codecstream.server.cli import build_options, build_parser

    args = build_parser().parse_args(["--replay", "codes.npy"])
    assert build_options(args) == ServerOptions()
    assert args.replay_fps == 12.5  # the codec's own frame rate: real time

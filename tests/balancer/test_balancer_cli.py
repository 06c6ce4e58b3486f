"""`codecstream-balancer` as an operator runs it: one line and exit 1 for what it cannot do, and a
printed configuration that nginx itself accepts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

BALANCER = [sys.executable, "-m", "codecstream.server.balancer"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*BALANCER, *args], capture_output=True, text=True, timeout=60)


def run_with_path(path, *args: str) -> subprocess.CompletedProcess:
    """The balancer with `path` as its whole PATH (where nvidia-smi is, or is not)."""
    env = {**os.environ, "PATH": str(path)}
    return subprocess.run([*BALANCER, *args], capture_output=True, text=True, timeout=60, env=env)


def test_a_malformed_replica_exits_1_with_one_line_that_names_the_flag():
    result = run("--replica", "R0=nowhere")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "codecstream-balancer: --replica 'R0=nowhere': expected NAME=HOST:PORT, NAME of 1-32 lowercase "
        "letters, digits or '-'"
    ]


def test_two_replicas_with_one_name_are_refused():
    result = run("--replica", "a=127.0.0.1:1", "--replica", "a=127.0.0.1:2")
    assert result.returncode == 1 and "every replica needs its own name" in result.stderr


def test_a_missing_nginx_is_named_with_how_to_install_it():
    result = run("--replica", "a=127.0.0.1:1", "--nginx", "no-such-nginx")
    assert result.returncode == 1
    assert "'no-such-nginx' not found: install nginx" in result.stderr and "Traceback" not in result.stderr


def test_the_printed_configuration_is_one_nginx_accepts(tmp_path):
    result = run("--replica", "r0=127.0.0.1:50061", "--replica", "r1=10.0.0.2:50051", "--print-config",
                 "--runtime-dir", str(tmp_path))  # fmt: skip
    assert result.returncode == 0, result.stderr
    config = tmp_path / "nginx.conf"
    config.write_text(result.stdout)
    for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp_path / name).mkdir()
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    check = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(config), "-e", str(tmp_path / "error.log")],
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert "server 10.0.0.2:50051;" in result.stdout and "least_conn;" in result.stdout


def test_gpus_and_replicas_together_are_refused():
    result = run("--gpus", "0,1", "--replica", "a=127.0.0.1:1")
    assert result.returncode == 1 and "either --replica" in result.stderr


def test_a_malformed_gpu_list_names_what_it_expects():
    result = run("--gpus", "0,one")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "codecstream-balancer: --gpus '0,one': expected 'all' or device indexes such as 0,1"
    )


def test_server_arguments_may_not_set_the_ports_the_balancer_gives_each_replica():
    result = run("--gpus", "0", "--", "--replay", "codes.npy", "--port=50051")
    assert result.returncode == 1
    assert "server argument --port: the balancer sets" in result.stderr


def test_gpus_all_takes_the_devices_nvidia_smi_lists(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-a)'\necho 'GPU 1: NVIDIA H100 (UUID: GPU-b)'\n")
    fake.chmod(0o755)
    result = run_with_path(tmp_path, "--gpus", "all", "--replica-port", "50071", "--print-config")
    assert result.returncode == 0, result.stderr
    assert "upstream codecstream_replica_gpu0 { server 127.0.0.1:50071; }" in result.stdout
    assert "upstream codecstream_replica_gpu1 { server 127.0.0.1:50072; }" in result.stdout


def test_gpus_all_without_nvidia_smi_says_to_name_the_devices(tmp_path):
    result = run_with_path(tmp_path, "--gpus", "all")
    assert result.returncode == 1
    assert "nvidia-smi not found; name the devices instead (--gpus 0,1)" in result.stderr

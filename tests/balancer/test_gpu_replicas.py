"""`codecstream-balancer --gpus 0,1`: the balancer starts one codecstream-server per device, each
seeing that device alone, puts its nginx in front, and restarts a replica whose process dies while
the other keeps serving. Here the replicas are `--replay` servers (no engine) and the devices are
names: the same code path as on a GPU host, where the device is what CUDA_VISIBLE_DEVICES selects."""

from __future__ import annotations

import collections
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys

import numpy as np
import psutil
import pytest
from codecstream.protocol import save_codes_file
from codecstream.testing.server_process import free_port
from codecstream.testing.waiting import wait_for

from tests.balancer.test_nginx_balancer import CODES, join, start_streams

pytestmark = pytest.mark.skipif(
    not (shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK)), reason="the balancer runs nginx"
)


def first_of_free_ports(count: int) -> int:
    """A port P such that P..P+count-1 are free now (the balancer gives replica i port P+i)."""
    while True:
        first = free_port()
        try:
            for port in range(first, first + count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first


class GpuDeployment:
    """`codecstream-balancer --gpus 0,1 -- --replay CODES ...`, as an operator starts it."""

    def __init__(self, folder: pathlib.Path, fps: float) -> None:
        codes_file = folder / "codes.npy"
        save_codes_file(codes_file, CODES)
        self.target = f"127.0.0.1:{free_port()}"
        self.log = open(folder / "balancer.log", "w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "codecstream.server.balancer", "--listen", self.target, "--gpus", "0,1",
             "--replica-port", str(first_of_free_ports(2)), "--replica-metrics-port", str(first_of_free_ports(2)),
             "--health-interval", "0.2", "--runtime-dir", str(folder / "nginx"),
             "--", "--replay", str(codes_file), "--replay-fps", str(fps), "--log-level", "WARNING"],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        wait_for(lambda: "listening on" in self.output(), 30, "the balancer to listen")
        wait_for(lambda: self.pool_is("gpu0, gpu1"), 60, "both replicas in the pool")

    def output(self) -> str:
        self.log.flush()
        return pathlib.Path(self.log.name).read_text()

    def pool_is(self, names: str) -> bool:
        """Whether the balancer's latest pool is `names` ("gpu0, gpu1")."""
        pools = [line.split("pool: ", 1)[1] for line in self.output().splitlines() if "pool: " in line]
        return bool(pools) and pools[-1].startswith(f"{names} (")

    def replicas(self) -> dict[str, psutil.Process]:
        """The replicas' processes by device, from what each sees (CUDA_VISIBLE_DEVICES in /proc/PID/environ)."""
        found = {}
        for child in psutil.Process(self.process.pid).children():
            if "--replay" in child.cmdline():
                environ = pathlib.Path(f"/proc/{child.pid}/environ").read_bytes().split(b"\0")
                devices = [
                    entry.split(b"=", 1)[1].decode() for entry in environ if entry.startswith(b"CUDA_VISIBLE_DEVICES=")
                ]
                found[devices[0] if devices else None] = child
        return found

    def close(self) -> None:
        children = psutil.Process(self.process.pid).children(recursive=True)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(90)
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"the balancer left {alive} running"
        self.log.close()


@pytest.fixture
def gpus(tmp_path):
    started = GpuDeployment(tmp_path, fps=25.0)  # 60 frames: 2.4 s per stream
    yield started
    started.close()


def test_each_replica_sees_its_own_device_and_both_serve(gpus):
    replicas = gpus.replicas()
    assert sorted(replicas, key=str) == ["0", "1"], replicas
    results: dict = {}
    join(start_streams(gpus.target, 4, results))
    for _, codes, _ in results.values():
        np.testing.assert_array_equal(codes, CODES)
    assert collections.Counter(replica for replica, _, _ in results.values()) == {"gpu0": 2, "gpu1": 2}


def test_a_killed_replica_is_restarted_while_the_other_keeps_its_streams(gpus):
    killed = gpus.replicas()["1"]
    running, playing = {}, []
    threads = start_streams(gpus.target, 4, running, playing)
    wait_for(lambda: len(playing) == 4, 10, "four streams to play")
    killed.kill()
    wait_for(lambda: gpus.pool_is("gpu0"), 5, "the balancer to drain gpu1")
    # Streams asked for while gpu1 is down go to gpu0 and are whole.
    meanwhile: dict = {}
    join(start_streams(gpus.target, 2, meanwhile))
    assert {replica for replica, _, _ in meanwhile.values()} == {"gpu0"}
    join(threads)
    on_survivor = [codes for replica, codes, _ in running.values() if replica == "gpu0"]
    assert on_survivor and len(on_survivor) < 4, running  # streams were playing on both
    for codes in on_survivor:
        np.testing.assert_array_equal(codes, CODES)  # no stream on gpu0 was lost
    # gpu1 comes back: a new process, on its device, serving again.
    wait_for(lambda: gpus.pool_is("gpu0, gpu1"), 30, "gpu1 to be restarted and rejoin the pool")
    restarted = gpus.replicas()["1"]
    assert restarted.pid != killed.pid
    assert "replica gpu1: exited with status -9" in gpus.output()
    again: dict = {}
    join(start_streams(gpus.target, 4, again))
    assert collections.Counter(replica for replica, _, _ in again.values()) == {"gpu0": 2, "gpu1": 2}
    for _, codes, _ in again.values():
        np.testing.assert_array_equal(codes, CODES)

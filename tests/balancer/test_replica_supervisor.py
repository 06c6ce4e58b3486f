"""The replica supervisor's restart rule, on a stand-in server that exits at once and a clock the
test moves: a replica that keeps dying right after its start waits twice as long each time (up to
the cap), one that ran a while is restarted after the first backoff again."""

from __future__ import annotations

import sys

import psutil
import pytest
from codecstream.server import replica_supervisor
from codecstream.server.replica_supervisor import ReplicaSupervisor, replica_specs


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(replica_supervisor.time, "monotonic", fake)
    return fake


def dying_replica(tmp_path) -> ReplicaSupervisor:
    # A "server" that exits with status 3 whatever it is given.
    supervisor = ReplicaSupervisor(sys.executable, replica_specs(("0",), 1, 2), ["-c", "raise SystemExit(3)"], tmp_path)
    supervisor.start_all()
    return supervisor


def waits_before_restarts(supervisor: ReplicaSupervisor, clock: Clock, count: int, ran_s: float) -> list[float]:
    state = supervisor.replicas["gpu0"]
    waits = []
    for _ in range(count):
        state.process.wait(30)
        clock.now += ran_s
        supervisor.check()
        waits.append(state.restart_at - clock.now)
        clock.now = state.restart_at
        supervisor.check()
    return waits


def test_a_replica_that_keeps_dying_at_start_waits_twice_as_long_each_time_up_to_the_cap(tmp_path, clock):
    supervisor = dying_replica(tmp_path)
    assert waits_before_restarts(supervisor, clock, 7, ran_s=0.5) == [1, 2, 4, 8, 16, 30, 30]
    assert supervisor.replicas["gpu0"].restarts == 7


def test_a_replica_that_ran_a_minute_is_restarted_after_the_first_backoff(tmp_path, clock):
    supervisor = dying_replica(tmp_path)
    waits_before_restarts(supervisor, clock, 3, ran_s=0.5)
    assert waits_before_restarts(supervisor, clock, 1, ran_s=replica_supervisor.STABLE_S) == [1]


def test_each_replica_is_told_its_own_ports_on_loopback(tmp_path):
    specs = replica_specs(("2", "5"), 50061, 9101)
    supervisor = ReplicaSupervisor("codecstream-server", specs, ["--model", "m"], tmp_path)
    assert [supervisor.command(spec)[3:] for spec in specs] == [
        ["--host", "127.0.0.1", "--port", "50061", "--metrics-port", "9101"],
        ["--host", "127.0.0.1", "--port", "50062", "--metrics-port", "9102"],
    ]
    assert [spec.name for spec in specs] == ["gpu2", "gpu5"]


def test_what_a_dead_replica_started_is_killed_before_it_restarts(tmp_path, clock):
    # A "server" that leaves a child behind (as vLLM's engine core can, holding the GPU's memory).
    orphan_file = tmp_path / "orphan"
    leaves_a_child = (
        f"import subprocess; child = subprocess.Popen(['sleep', '300']); "
        f"open({str(orphan_file)!r}, 'w').write(str(child.pid)); raise SystemExit(3)"
    )
    supervisor = ReplicaSupervisor(sys.executable, replica_specs(("0",), 1, 2), ["-c", leaves_a_child], tmp_path)
    supervisor.start_all()
    supervisor.replicas["gpu0"].process.wait(30)
    orphan = psutil.Process(int(orphan_file.read_text()))
    supervisor.check()
    orphan.wait(10)
    assert not orphan.is_running()

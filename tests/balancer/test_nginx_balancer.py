"""Three codecstream-server replicas behind codecstream-balancer (a real nginx) on loopback: new
streams spread, a drained replica takes no new streams while its own finish, a killed replica's
streams end with a clear status and nobody hangs, and Resume reaches the replica holding the stream."""

from __future__ import annotations

import collections
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from codecstream.client import Client, StreamNotFound, Unavailable
from codecstream.protocol import save_codes_file
from codecstream.testing.server_process import ServerProcess, free_port
from codecstream.testing.waiting import wait_for
from grpc_health.v1 import health_pb2

from tests.conftest import random_codes

FRAMES = 60
#: What docs/server.md asks of replicas behind the balancer: NOT_SERVING for a while before the
#: port closes, longer than the balancer's health poll plus a reload.
DRAIN_DELAY_S = 2.0
CODES = random_codes(FRAMES, seed=21)


class Replica(ServerProcess):
    """`codecstream-server --replay` in its own process."""

    def __init__(self, name: str, folder: pathlib.Path, fps: float) -> None:
        self.name = name
        codes_file = folder / f"{name}.npy"
        save_codes_file(codes_file, CODES)
        super().__init__(
            ["--replay", str(codes_file), "--replay-fps", str(fps), "--shutdown-grace", "20",
             "--drain-delay", str(DRAIN_DELAY_S), "--log-level", "WARNING"],
        )  # fmt: skip
        self.wait_until_serving(30)

    def health_name(self) -> str:
        """SERVING or NOT_SERVING, or the gRPC status where nothing answers (UNAVAILABLE)."""
        try:
            status = self.health("codecstream.v1.SynthesisService", timeout_s=1)
        except grpc.RpcError as error:
            return error.code().name
        return health_pb2.HealthCheckResponse.ServingStatus.Name(status)


class Deployment:
    """Replicas r0..r2 and the balancer in front of them."""

    def __init__(self, folder: pathlib.Path, fps: float) -> None:
        self.replicas = {name: Replica(name, folder, fps) for name in ("r0", "r1", "r2")}
        self.target = f"127.0.0.1:{free_port()}"
        self.log = open(folder / "balancer.log", "w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "codecstream.server.balancer", "--listen", self.target,
             "--health-interval", "0.2", "--runtime-dir", str(folder / "nginx"),
             *(f"--replica={r.name}={r.target}" for r in self.replicas.values())],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        wait_for(lambda: "listening on" in self.output(), 30, "the balancer to listen")

    def output(self) -> str:
        self.log.flush()
        return pathlib.Path(self.log.name).read_text()

    def pool_without(self, name: str) -> bool:
        return any(line.endswith(f"left: {name})") for line in self.output().splitlines())

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)
        for replica in self.replicas.values():
            replica.kill()
        self.log.close()


@pytest.fixture
def deployment(tmp_path):
    started = Deployment(tmp_path, fps=25.0)  # 60 frames: 2.4 s per stream
    yield started
    started.close()


def play(client: Client, results: dict, key, playing: list) -> None:
    """One whole stream; results[key] = (replica, codes, End reason or the error). `key` joins
    `playing` once the stream's first chunk is in."""
    stream = client.stream_codes("Hello.")
    try:
        chunks = [next(stream)]
        playing.append(key)
        chunks += list(stream)
        results[key] = (stream.replica, np.concatenate([chunk.codes for chunk in chunks]), stream.end.reason)
    except Exception as error:  # the test looks at what each stream ended with
        results[key] = (stream.replica, None, error)


def start_streams(target: str, count: int, results: dict, playing: list | None = None) -> list[threading.Thread]:
    playing = [] if playing is None else playing
    threads = []
    for index in range(count):
        client = Client(target)
        thread = threading.Thread(
            target=lambda c=client, i=index: (play(c, results, i, playing), c.close()), daemon=True
        )
        thread.start()
        threads.append(thread)
    return threads


def join(threads: list[threading.Thread], timeout: float = 60.0) -> None:
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a client hung"


def test_new_streams_spread_over_the_replicas_and_each_is_whole(deployment):
    results: dict = {}
    threads = start_streams(deployment.target, 9, results)
    join(threads)
    assert len(results) == 9
    for replica, codes, _ in results.values():
        assert replica in deployment.replicas
        np.testing.assert_array_equal(codes, CODES)  # the reassembler checked seq, offsets and End
    spread = collections.Counter(replica for replica, _, _ in results.values())
    # Concurrent streams go to the replica with the fewest open calls: 3 each.
    assert sorted(spread.values()) == [3, 3, 3], spread


def test_a_draining_replica_takes_no_new_streams_and_finishes_its_own(deployment):
    running, playing = {}, []
    threads = start_streams(deployment.target, 3, running, playing)
    wait_for(lambda: len(playing) == 3, 10, "three streams to play, one per replica")
    drained = deployment.replicas["r1"]
    drained.process.send_signal(signal.SIGTERM)
    wait_for(lambda: drained.health_name() == "NOT_SERVING", DRAIN_DELAY_S, "NOT_SERVING")
    wait_for(lambda: deployment.pool_without("r1"), DRAIN_DELAY_S, "the balancer to drop r1")
    # Streams asked for during the drain delay are taken, wherever they land.
    during: dict = {}
    during_threads = start_streams(deployment.target, 3, during)
    # Then the port closes; every new stream goes to the others, none is refused.
    wait_for(lambda: drained.health_name() == "UNAVAILABLE", 5, "r1 to stop listening")
    later: dict = {}
    join(start_streams(deployment.target, 6, later))
    assert {replica for replica, _, _ in later.values()} <= {"r0", "r2"}, later
    join(during_threads + threads)
    for outcome in (*running.values(), *during.values(), *later.values()):
        np.testing.assert_array_equal(outcome[1], CODES)  # the drained replica's stream finished too
    assert "r1" in {replica for replica, _, _ in running.values()}
    assert drained.process.wait(30) == 0


def test_a_killed_replica_ends_its_streams_clearly_and_the_others_take_new_ones(deployment):
    running, playing = {}, []
    threads = start_streams(deployment.target, 3, running, playing)
    wait_for(lambda: len(playing) == 3, 10, "three streams to play, one per replica")
    deployment.replicas["r2"].process.kill()
    join(threads, timeout=30)
    outcomes = {replica: outcome for replica, _, outcome in running.values()}
    # Its stream's Resume finds the replica gone: NOT_FOUND from the balancer, not a hang.
    assert isinstance(outcomes["r2"], StreamNotFound), outcomes["r2"]
    assert "gone" in str(outcomes["r2"])
    wait_for(lambda: deployment.pool_without("r2"), 5, "the balancer to drop r2")
    later: dict = {}
    join(start_streams(deployment.target, 4, later))
    assert {replica for replica, _, _ in later.values()} <= {"r0", "r1"}
    assert all(codes is not None and len(codes) == FRAMES for _, codes, _ in later.values())


def test_resume_after_a_cut_before_the_balancer_reaches_the_stream_s_replica(deployment, proxy_factory):
    proxy = proxy_factory(int(deployment.target.rsplit(":", 1)[1]))
    with Client(proxy.target) as client:
        stream = client.stream_codes("Hello.")
        received = [next(stream).codes]
        replica = stream.replica
        proxy.cut()
        received += [chunk.codes for chunk in stream]
    assert stream.resumes >= 1 and stream.replica == replica
    np.testing.assert_array_equal(np.concatenate(received), CODES)


def test_resume_to_a_replica_that_is_gone_is_not_found_and_a_new_stream_starts_cleanly(deployment, proxy_factory):
    proxy = proxy_factory(int(deployment.target.rsplit(":", 1)[1]))
    with Client(proxy.target) as client:
        stream = client.stream_codes("Hello.")
        next(stream)
        deployment.replicas[stream.replica].process.kill()
        proxy.cut()
        with pytest.raises(StreamNotFound):
            for _ in stream:
                pass
        again = np.concatenate([chunk.codes for chunk in client.stream_codes("Hello.")])
    np.testing.assert_array_equal(again, CODES)


def test_with_every_replica_gone_a_new_stream_is_unavailable_at_once(deployment):
    for replica in deployment.replicas.values():
        replica.process.kill()
    started = time.monotonic()
    with Client(deployment.target) as client, pytest.raises(Unavailable):
        client.stream_codes("Hello.").open()
    assert time.monotonic() - started < 10

"""Connection faults and clients that misbehave, over real sockets (replay server): every stream
ends, nothing leaks, and the server's books balance."""

from __future__ import annotations

import logging
import random
import subprocess
import sys
import textwrap
import threading
import time

import grpc
from codecstream.client import Client
from codecstream.server.app import TRANSPORT_CLOSE_TIMEOUT_S, Keepalive
from codecstream.server.limits import ServerLimits
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc

from tests.conftest import random_codes, sample


def ended_total(server) -> float:
    reasons = ("eos", "cancelled", "max_frames", "error")
    return sum(sample(server, "codecstream_streams_ended_total", reason=reason) for reason in reasons)


def rejected_total(server) -> float:
    return sum(
        metric.value
        for family in server.server.metrics.registry.collect()
        if family.name == "codecstream_requests_rejected"
        for metric in family.samples
        if metric.name.endswith("_total")
    )


def test_a_client_process_killed_mid_stream_has_its_stream_cancelled(replay_server_factory):
    server = replay_server_factory(codes=random_codes(4000), fps=25.0)
    script = textwrap.dedent(
        f"""
        from codecstream.client import Client
        with Client({server.target!r}) as client:
            for chunk in client.stream_codes("A long text."):
                print("reading", flush=True)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "reading"
        assert len(server.service.sessions) == 1
        process.kill()
    finally:
        process.wait(10)
    assert server.wait_until(lambda: not server.service.sessions and server.live_requests() == 0)
    assert sample(server, "codecstream_streams_ended_total", reason="cancelled") == 1


def test_a_half_open_connection_is_noticed_by_keepalive_and_its_stream_cancelled(replay_server_factory, proxy_factory):
    keepalive = Keepalive(time_s=0.5, timeout_s=0.5)
    server = replay_server_factory(codes=random_codes(4000), fps=25.0, keepalive=keepalive)
    proxy = proxy_factory(server.server.port)
    client = Client(proxy.target)
    try:
        stream = client.stream_codes("A long text.", resumable=False)
        next(stream)
        proxy.freeze()  # the peer vanishes without a FIN or RST: only keepalive can tell
        frozen = time.monotonic()
        assert server.wait_until(lambda: not server.service.sessions, timeout=15)
        noticed_after = time.monotonic() - frozen
    finally:
        stream.abandon()
        proxy.cut()
        client.close()
    assert server.live_requests() == 0
    assert sample(server, "codecstream_streams_ended_total", reason="cancelled") == 1
    # Noticed within keepalive time + timeout (measured: 1.9 s for 1 s + 1 s), with slack for a loaded machine.
    assert noticed_after < 5 * (keepalive.time_s + keepalive.timeout_s), noticed_after


def test_a_client_that_never_reads_is_dropped_after_the_stall_timeout_and_its_memory_stays_bounded(
    replay_server_factory, proxy_factory, caplog
):
    # 19 MB of codes in 24,000 messages: far more than the socket and HTTP/2 buffers hold, and few
    # enough messages that the stream reaches the full buffers quickly even in a slow process.
    limits = ServerLimits(stalled_client_timeout_s=1.0, max_frames=600_000)
    server = replay_server_factory(
        codes=random_codes(600_000), fps=0.0, limits=limits, keepalive=Keepalive(time_s=600, timeout_s=600)
    )
    proxy = proxy_factory(server.server.port)
    channel = grpc.insecure_channel(proxy.target)
    responses = synthesis_pb2_grpc.SynthesisServiceStub(channel).Synthesize(
        iter(
            [
                pb.SynthesizeRequest(
                    start=pb.Start(
                        text="A long text.", chunking=pb.ChunkingPolicy(first_chunk_frames=25, ramp_frames=[25])
                    )
                )
            ]
        ),
        timeout=60,
    )
    header = next(responses).header
    proxy.freeze_to_client()
    retained: list[int] = []

    def ended() -> bool:
        session = server.service.sessions.get(header.stream_id)
        if session is None:
            return True
        retained.append(session.retained_chunks)
        return False

    try:
        assert server.wait_until(ended, timeout=30)
    finally:
        responses.cancel()
        channel.close()
    assert sample(server, "codecstream_stalled_clients_total") == 1
    assert ended_total(server) == 1 and server.live_requests() == 0
    # Unsent chunks are bounded by the stream's frame budget (32 bytes a frame), never more.
    assert max(retained) <= header.max_frames
    # Dropping the client is the server's own decision: no error (ExecuteBatchError) is logged.
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_storm_of_cancels_disconnects_and_cut_connections_keeps_the_books_balanced(
    replay_server_factory, proxy_factory
):
    server = replay_server_factory(codes=random_codes(600), fps=100.0, limits=ServerLimits(max_concurrent_streams=12))
    proxy = proxy_factory(server.server.port)
    calls = 48
    rng = random.Random(7)
    actions = [rng.choice(("cancel", "abandon", "read", "cut")) for _ in range(calls)]

    def run(action: str) -> None:
        target = proxy.target if action == "cut" else server.target
        with Client(target, resume_timeout_s=0) as client:
            stream = client.stream_codes("Hi.", chunking=[2])
            try:
                next(stream)
                if action == "cancel":
                    stream.cancel(played_frames=2)
                elif action == "abandon":
                    stream.abandon()
                elif action == "cut":
                    proxy.cut()
                for _ in stream:
                    pass
            except Exception:  # refusals and broken streams are the point of the storm
                pass

    threads = [threading.Thread(target=run, args=(action,)) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert server.wait_until(lambda: not server.service.sessions and server.live_requests() == 0, timeout=20)
    started = sample(server, "codecstream_streams_started_total")
    assert started == ended_total(server), "every started stream ended exactly once"
    received = sample(server, "codecstream_calls_total")
    abandoned = sample(server, "codecstream_calls_abandoned_total")
    assert started + rejected_total(server) + abandoned == received, "every call started, was refused or was left"
    # A cut can break a connection before its Start reaches the server; most calls do reach it.
    assert calls / 2 < received <= calls
    assert sample(server, "codecstream_streams_active") == 0


def test_the_server_stops_within_its_grace_while_a_client_that_stopped_reading_holds_its_connection(
    replay_server_factory, proxy_factory
):
    # The client's connection keeps unsent data the server can never write; with keepalive at ten
    # minutes, gRPC's own shutdown would wait for that connection as long.
    limits = ServerLimits(stalled_client_timeout_s=1.0, max_frames=600_000)
    server = replay_server_factory(
        codes=random_codes(600_000), fps=0.0, limits=limits, keepalive=Keepalive(time_s=600, timeout_s=600)
    )
    proxy = proxy_factory(server.server.port)
    channel = grpc.insecure_channel(proxy.target)
    responses = synthesis_pb2_grpc.SynthesisServiceStub(channel).Synthesize(
        iter(
            [
                pb.SynthesizeRequest(
                    start=pb.Start(
                        text="A long text.", chunking=pb.ChunkingPolicy(first_chunk_frames=25, ramp_frames=[25])
                    )
                )
            ]
        ),
        timeout=120,
    )
    next(responses)
    proxy.freeze_to_client()
    try:
        assert server.wait_until(lambda: not server.service.sessions, timeout=30)  # dropped as stalled
        # Returns, rather than raising TimeoutError: the grace, the drain's second, the transport's
        # bounded close, and room for a slow machine.
        server.loop.run(server.server.stop(grace_s=0.5), timeout=0.5 + 1.0 + TRANSPORT_CLOSE_TIMEOUT_S + 10)
    finally:
        responses.cancel()
        channel.close()

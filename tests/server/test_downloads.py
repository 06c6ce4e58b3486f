"""Decoder downloads as a shared resource: a client that stops reading is dropped like a stalled
stream, one client holds at most `max_downloads_per_client` at once, a download cancelled mid-write
leaves no traceback, and refusals end the call without context.abort (whose exception kept the
request alive until a full collection). Real replay servers on loopback sockets, an artifact of
random bytes large enough to fill every buffer between the two sides."""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from collections.abc import Callable

import grpc
import pytest
from codecstream.server.limits import ServerLimits
from codecstream.testing.waiting import wait_for
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc

from tests.conftest import random_codes, sample
from tests.malicious_server import DIGEST, manifest_json

SIZE = 48 << 20  # far over the kernel's socket buffers and HTTP/2's windows


def settled(value: Callable[[], float]) -> Callable[[], bool]:
    """A condition that holds once `value()` is what it was when last asked: what it counts stopped."""
    last: list[float] = []

    def unchanged() -> bool:
        now = value()
        held = last == [now]
        last[:] = [now]
        return held

    return unchanged


@pytest.fixture(scope="module")
def large_artifact(tmp_path_factory):
    """An artifact directory of the test digest whose one file is SIZE random bytes."""
    directory = tmp_path_factory.mktemp("artifact")
    data = os.urandom(SIZE)
    (directory / "decoder.onnx").write_bytes(data)
    (directory / "manifest.json").write_text(manifest_json("onnx", "decoder.onnx", data))
    return directory, json.loads((directory / "manifest.json").read_text())["artifacts"]["onnx"]["sha256"]


@pytest.fixture
def offering(replay_server_factory, large_artifact):
    def start(**limits):
        directory, _ = large_artifact
        return replay_server_factory(
            codes=random_codes(8),
            decoder_digest=DIGEST,
            decoder_artifacts=(directory,),
            limits=ServerLimits(**limits),
        )

    return start


def test_a_download_whose_client_stops_reading_is_dropped_after_the_stall_timeout_without_a_traceback(
    offering, large_artifact, proxy_factory, caplog
):
    server = offering(stalled_client_timeout_s=0.5)
    proxy = proxy_factory(server.server.port)
    _, sha256 = large_artifact
    with grpc.insecure_channel(proxy.target) as channel:
        parts = synthesis_pb2_grpc.SynthesisServiceStub(channel).DownloadDecoderArtifact(
            pb.DownloadDecoderArtifactRequest(sha256=sha256)
        )
        next(parts)
        proxy.freeze_to_client()  # the client reads nothing more
        assert server.wait_until(lambda: sample(server, "codecstream_stalled_clients_total") == 1, timeout=20)
        assert server.wait_until(lambda: sample(server, "codecstream_decoder_artifact_downloads_running") == 0)
        # Reading again, the client gets what was in flight, then the status saying why it ended (a
        # cancel here instead raced the status's send: gRPC logs the send it could not finish).
        proxy.thaw_to_client()
        with pytest.raises(grpc.RpcError) as ended:
            for _ in parts:
                pass
        assert ended.value.code() == grpc.StatusCode.ABORTED and "stalled_client_timeout_s" in ended.value.details()
    # Dropping the client is the server's own decision: no error (ExecuteBatchError) is logged.
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_one_client_holds_at_most_its_share_of_downloads(offering, large_artifact):
    server = offering(max_downloads_per_client=2)
    _, sha256 = large_artifact
    with grpc.insecure_channel(server.target) as channel:
        stub = synthesis_pb2_grpc.SynthesisServiceStub(channel)
        held = [stub.DownloadDecoderArtifact(pb.DownloadDecoderArtifactRequest(sha256=sha256)) for _ in range(2)]
        for call in held:
            next(call)  # both are running
        with pytest.raises(grpc.RpcError) as refused:
            next(stub.DownloadDecoderArtifact(pb.DownloadDecoderArtifactRequest(sha256=sha256)))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "2 decoder downloads running" in refused.value.details()
        assert "max_downloads_per_client" in refused.value.details()
        held[0].cancel()
        assert server.wait_until(lambda: sample(server, "codecstream_decoder_artifact_downloads_running") == 1)
        again = stub.DownloadDecoderArtifact(pb.DownloadDecoderArtifactRequest(sha256=sha256, offset=SIZE - 10))
        assert sum(len(part.data) for part in again) == 10  # a freed share is taken again
        held[1].cancel()


def test_a_download_cancelled_mid_write_logs_no_traceback(offering, large_artifact, caplog):
    server = offering()
    _, sha256 = large_artifact
    with caplog.at_level(logging.DEBUG):
        for attempt in range(20):
            with grpc.insecure_channel(server.target) as channel:
                parts = synthesis_pb2_grpc.SynthesisServiceStub(channel).DownloadDecoderArtifact(
                    pb.DownloadDecoderArtifactRequest(sha256=sha256)
                )
                for _ in range(1 + attempt % 5):  # cancelled while the server writes, at various points
                    next(parts)
                parts.cancel()
        assert server.wait_until(lambda: sample(server, "codecstream_decoder_artifact_downloads_running") == 0)
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR or record.exc_info]
    assert errors == [], [record.getMessage() for record in errors]


def test_a_refused_download_ends_without_an_abort_that_keeps_its_request(offering):
    server = offering()
    with grpc.insecure_channel(server.target) as channel:
        stub = synthesis_pb2_grpc.SynthesisServiceStub(channel)
        unparseable = channel.unary_unary("/codecstream.v1.SynthesisService/GetCodecInfo")
        gc.collect()
        gc.disable()  # what a refusal leaves is what stays until the next collection
        try:
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as refused:
                    list(stub.DownloadDecoderArtifact(pb.DownloadDecoderArtifactRequest(sha256="x" * 50_000)))
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                with pytest.raises(grpc.RpcError):
                    unparseable(b"\xff\xff\xff")  # refused by the unary path
            kept = [o for o in gc.get_objects() if isinstance(o, grpc.aio.AbortError)]
        finally:
            gc.enable()
    assert kept == []


def test_a_download_whose_client_stops_reading_then_disconnects_logs_no_traceback(
    offering, large_artifact, proxy_factory, caplog
):
    """The write pending for a client that stopped reading fails once the connection goes: that is
    the client leaving, not a server error (it logged an ExecuteBatchError traceback each time)."""
    server = offering()
    _, sha256 = large_artifact
    for _ in range(3):
        proxy = proxy_factory(server.server.port)
        channel = grpc.insecure_channel(proxy.target)
        parts = synthesis_pb2_grpc.SynthesisServiceStub(channel).DownloadDecoderArtifact(
            pb.DownloadDecoderArtifactRequest(sha256=sha256)
        )
        next(parts)
        proxy.freeze_to_client()
        sent = settled(lambda: sample(server, "codecstream_decoder_artifact_bytes_total"))
        wait_for(sent, 20, "the server's writes to wait on the full connection", step_s=0.1)
        proxy.cut()
        channel.close()
    assert server.wait_until(lambda: sample(server, "codecstream_decoder_artifact_downloads_running") == 0, 20)
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR or record.exc_info]
    assert errors == [], [record.getMessage()[:300] for record in errors]


def test_a_client_that_reads_slowly_but_steadily_finishes_its_download(offering, large_artifact):
    """On main the stall clock ran per 1 MiB part: a client taking under a part per stall timeout
    was dropped as "read nothing" though it read all the while (at the defaults, under 35 kB/s)."""
    server = offering(stalled_client_timeout_s=2.0)
    _, sha256 = large_artifact
    rate, tail = 256 << 10, 3 << 20  # a 1 MiB part a 4 s, a 64 KiB part a 0.25 s
    # No window beyond what the client reads: HTTP/2 flow control paces the server by the reads.
    options = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1 << 16)]
    taken = 0
    with grpc.insecure_channel(server.target, options=options) as channel:
        parts = synthesis_pb2_grpc.SynthesisServiceStub(channel).DownloadDecoderArtifact(
            pb.DownloadDecoderArtifactRequest(sha256=sha256, offset=SIZE - tail), timeout=120
        )
        for part in parts:
            taken += len(part.data)
            time.sleep(len(part.data) / rate)
    assert taken == tail
    assert sample(server, "codecstream_stalled_clients_total") == 0


def test_a_download_dropped_as_stalled_ends_with_a_status_its_client_reads(offering, large_artifact, proxy_factory):
    """On main the server cancelled the call, which sent nothing the client could read: once it
    read again it waited to its own deadline."""
    server = offering(stalled_client_timeout_s=0.5)
    proxy = proxy_factory(server.server.port)
    _, sha256 = large_artifact
    with grpc.insecure_channel(proxy.target) as channel:
        parts = synthesis_pb2_grpc.SynthesisServiceStub(channel).DownloadDecoderArtifact(
            pb.DownloadDecoderArtifactRequest(sha256=sha256), timeout=60
        )
        next(parts)
        proxy.freeze_to_client()
        assert server.wait_until(lambda: sample(server, "codecstream_stalled_clients_total") == 1, timeout=20)
        proxy.thaw_to_client()
        with pytest.raises(grpc.RpcError) as dropped:
            for _ in parts:
                pass
    assert dropped.value.code() == grpc.StatusCode.ABORTED
    assert dropped.value.details() == (
        "download dropped: the client took no part (65536 bytes) for 0.5 s (stalled_client_timeout_s); "
        "resume from the offset received"
    )

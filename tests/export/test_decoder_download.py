"""decoder="auto": a server offers the decoder artifacts of its checkpoint (--decoder-artifact), a
client downloads one over the contract, resumes a broken download, checks its sha256, keeps it in
its cache by digest and decodes exactly what the artifact decodes. The server refuses to offer an
artifact for other codes, and refuses bad downloads with precise statuses."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys

import grpc
import numpy as np
import pytest
from codecstream.client import Client
from codecstream.client.cache import cache_root
from codecstream.client.runtimes import DecoderLoadError, open_decoder
from codecstream.protocol import decoder_digest
from codecstream.protocol.codes_file import CodesFile, save_codes_file
from codecstream.protocol.manifest import read_manifest
from codecstream.server.app import CodecStreamServer, ServerOptions
from codecstream.server.replay import ReplaySource
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc

from tests.conftest import random_codes
from tests.malicious_server import relisted, sha256

ONNX = ("onnx", "stateful", "fp32")


@pytest.fixture
def offering_server(replay_server_factory, artifacts, tiny_checkpoint):
    """A replay server of the tiny checkpoint's codes that offers its ONNX decoder artifact."""
    return replay_server_factory(
        codes=random_codes(24), decoder_digest=decoder_digest(tiny_checkpoint), decoder_artifacts=(artifacts[ONNX],)
    )


def downloads(server) -> tuple[float, float]:
    registry = server.server.metrics.registry
    calls = registry.get_sample_value("codecstream_decoder_artifact_downloads_total") or 0.0
    return calls, registry.get_sample_value("codecstream_decoder_artifact_bytes_total") or 0.0


def cached_file(cache, artifacts):
    entry = read_manifest(artifacts[ONNX]).artifacts["onnx"]
    return cache / "decoders" / entry.sha256.replace(":", "-") / entry.file


def test_a_client_with_decoder_auto_decodes_exactly_what_the_servers_artifact_decodes(
    offering_server, artifacts, cache
):
    with Client(offering_server.target) as client:
        chunks = list(client.synthesize("Hello there."))  # decoder="auto"
        again = list(client.synthesize("Hello there."))
    explicit = open_decoder(artifacts[ONNX]).new_stream()  # the same chunks through the artifact itself
    reference = np.concatenate([explicit.decode(c.codes) for c in chunks])
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), reference)
    np.testing.assert_array_equal(np.concatenate([c.samples for c in again]), reference)
    size = read_manifest(artifacts[ONNX]).artifacts["onnx"].size_bytes
    assert downloads(offering_server) == (1, size)  # downloaded once, then opened from the cache
    assert cached_file(cache, artifacts).stat().st_size == size
    assert cache_root() == cache


def test_a_broken_download_resumes_where_it_stopped(offering_server, artifacts, cache):
    path = cached_file(cache, artifacts)
    whole = (artifacts[ONNX] / path.name).read_bytes()
    path.parent.mkdir(parents=True)
    path.with_name(path.name + ".part").write_bytes(whole[: len(whole) // 3])  # what a broken download left
    with Client(offering_server.target) as client:
        assert len(list(client.synthesize("Hello there."))) > 0
    assert downloads(offering_server) == (1, len(whole) - len(whole) // 3)
    assert path.read_bytes() == whole


def test_a_download_that_does_not_match_its_sha256_is_discarded_with_a_clear_error(offering_server, artifacts, cache):
    path = cached_file(cache, artifacts)
    path.parent.mkdir(parents=True)
    path.with_name(path.name + ".part").write_bytes(b"\0" * 1000)  # a damaged partial file
    with Client(offering_server.target) as client:
        with pytest.raises(DecoderLoadError, match=r"its manifest says sha256:.*download discarded"):
            client.synthesize("Hello there.").open()
        assert not path.with_name(path.name + ".part").exists()
        assert len(list(client.synthesize("Hello there."))) > 0  # the next attempt starts over


def test_a_server_refuses_to_offer_an_artifact_for_other_codes(artifacts, other_checkpoint):
    source = ReplaySource(CodesFile(random_codes(4)), decoder_digest_value=decoder_digest(other_checkpoint))
    server = CodecStreamServer(source, ServerOptions(port=0, decoder_artifacts=(artifacts[ONNX],)))
    with pytest.raises(ValueError, match=r"does not decode this server's codes .*decoder_digest.*export it from"):
        asyncio.run(server.start())


def test_the_server_cli_exits_with_one_line_for_an_artifact_of_other_codes(artifacts, tmp_path):
    codes = tmp_path / "codes.npz"
    save_codes_file(codes, random_codes(4))
    command = [sys.executable, "-m", "codecstream.server.cli", "--replay", str(codes), "--port", "0"]
    result = subprocess.run(
        [*command, "--decoder-artifact", str(artifacts[ONNX])], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not decode this server's codes" in lines[0], result.stderr


def test_a_damaged_artifact_stops_the_server_at_start(artifacts, tiny_checkpoint, tmp_path):
    damaged = shutil.copytree(artifacts[ONNX], tmp_path / "damaged")
    (damaged / "decoder.onnx").write_bytes(b"not the exported file")
    source = ReplaySource(CodesFile(random_codes(4)), decoder_digest_value=decoder_digest(tiny_checkpoint))
    server = CodecStreamServer(source, ServerOptions(port=0, decoder_artifacts=(damaged,)))
    with pytest.raises(ValueError, match="sha256 mismatch"):
        asyncio.run(server.start())


@pytest.mark.parametrize(
    ("sha256", "offset", "status", "message"),
    [
        ("sha256:" + "0" * 64, 0, grpc.StatusCode.NOT_FOUND, "offers no decoder artifact file with sha256:0000"),
        ("md5:abc", 0, grpc.StatusCode.INVALID_ARGUMENT, "sha256 must be 'sha256:' and 64 lowercase hex digits"),
        (None, 10**12, grpc.StatusCode.OUT_OF_RANGE, "offset 1000000000000 is past the end of the"),
    ],
)
def test_bad_downloads_are_refused_with_a_precise_status(offering_server, artifacts, sha256, offset, status, message):
    sha256 = sha256 or read_manifest(artifacts[ONNX]).artifacts["onnx"].sha256
    with grpc.insecure_channel(offering_server.target) as channel:
        stub = synthesis_pb2_grpc.SynthesisServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            list(stub.DownloadDecoderArtifact(pb.DownloadDecoderArtifactRequest(sha256=sha256, offset=offset)))
    assert raised.value.code() == status and message in raised.value.details()


def test_a_server_without_artifacts_lists_none_and_auto_says_what_to_do(replay_server_factory, cache):
    server = replay_server_factory(codes=random_codes(4))
    with Client(server.target) as client:
        with pytest.raises(DecoderLoadError, match="offers no decoder artifact for its codes: pass decoder=PATH"):
            client.synthesize("Hello there.").open()


@pytest.mark.asyncio
async def test_both_plugins_decode_with_the_servers_decoder_by_default(offering_server, cache):
    pytest.importorskip("livekit.agents")
    from codecstream.client.plugins.livekit import CodecstreamTTS

    engine = CodecstreamTTS(server=offering_server.target)
    frame = await asyncio.wait_for(engine.synthesize("Hello there.").collect(), 60)
    await engine.aclose()
    assert frame.samples_per_channel == 24 * 1920

    pytest.importorskip("pipecat")
    from codecstream.client.plugins.pipecat import CodecstreamTTSService
    from codecstream.testing.pipecat_pipeline import Until, run_script
    from pipecat.frames.frames import TTSAudioRawFrame, TTSStoppedFrame

    from tests.plugins.test_pipecat import reply

    tts = CodecstreamTTSService(server=offering_server.target)
    down = (await run_script(tts, [*reply("Hi."), Until(TTSStoppedFrame)])).frames
    assert sum(len(f.audio) for f in down if isinstance(f, TTSAudioRawFrame)) == 24 * 1920 * 2


def test_a_second_export_of_the_same_weights_is_downloaded_not_taken_for_the_cached_one(
    malicious_server, artifacts, cache
):
    """Two servers, one decoder digest, two exports of the same size (a newer exporter, other options):
    each client opens the bytes its own server lists, since the cache keeps a file by its sha256."""
    original = json.loads((artifacts[ONNX] / "manifest.json").read_text())
    data = (artifacts[ONNX] / "decoder.onnx").read_bytes()
    reexported = data.replace(b"pytorch", b"PYTORCH", 1)  # the producer's name: other bytes, same graph
    assert reexported != data and len(reexported) == len(data)
    for served in (data, reexported):
        server = malicious_server([relisted(original, served)], served)
        with Client(server.target) as client:
            assert client.open_decoder("auto").mode == "stateful"
        assert server.service.downloads == 1
    kept = sorted(sha256(path.read_bytes()) for path in cache.rglob("*.onnx"))
    assert kept == sorted([sha256(data), sha256(reexported)])

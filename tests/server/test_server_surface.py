"""Auth, TLS, health checking, reflection and metrics of a serving process."""

import subprocess
import urllib.request

import grpc
import pytest
from codecstream.client import Client, Unauthenticated, Unavailable
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.conftest import random_codes

TOKEN = "s3cret-token"


def test_auth_on_refuses_calls_without_or_with_a_wrong_token(replay_server_factory):
    server = replay_server_factory(auth_tokens=frozenset({TOKEN}))
    with Client(server.target) as client, pytest.raises(Unauthenticated, match="missing bearer token"):
        client.codec_info()
    with Client(server.target, token="wrong") as client, pytest.raises(Unauthenticated, match="not accepted"):
        list(client.stream_codes("Hi."))


def test_auth_on_accepts_the_right_token(replay_server_factory):
    server = replay_server_factory(auth_tokens=frozenset({TOKEN}))
    with Client(server.target, token=TOKEN) as client:
        assert client.codec_info().codec.num_codebooks == 16
        assert sum(c.num_frames for c in client.stream_codes("Hi.")) == 60


def test_health_check_stays_open_with_auth_on(replay_server_factory):
    server = replay_server_factory(auth_tokens=frozenset({TOKEN}))
    with grpc.insecure_channel(server.target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="codecstream.v1.SynthesisService")
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_synthesis_service(replay_server):
    with grpc.insecure_channel(replay_server.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert "codecstream.v1.SynthesisService" in names


@pytest.fixture(scope="module")
def self_signed_cert(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    return folder / "cert.pem", folder / "key.pem"


def test_tls_with_token_round_trip(replay_server_factory, self_signed_cert):
    cert, key = self_signed_cert
    server = replay_server_factory(tls_cert=cert, tls_key=key, auth_tokens=frozenset({TOKEN}))
    with Client(f"localhost:{server.server.port}", tls=cert, token=TOKEN) as client:
        assert sum(c.num_frames for c in client.stream_codes("Hi.")) == 60


def test_plaintext_client_cannot_talk_to_a_tls_server(replay_server_factory, self_signed_cert):
    cert, key = self_signed_cert
    server = replay_server_factory(tls_cert=cert, tls_key=key)
    with Client(server.target) as client, pytest.raises(Unavailable) as caught:
        client.codec_info(timeout_s=3)
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE


def test_metrics_count_streams_frames_and_cancels(replay_server_factory):
    server = replay_server_factory(codes=random_codes(400), fps=100.0, metrics_port=0)
    with Client(server.target) as client:
        list(client.stream_codes("Hi.", max_frames=20))
        stream = client.stream_codes("Hi.")
        next(stream)
        stream.cancel()
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.server.metrics_port}/metrics", timeout=5).read().decode()
    assert "codecstream_streams_started_total 2.0" in text
    assert 'codecstream_streams_ended_total{reason="cancelled"} 1.0' in text
    assert 'codecstream_streams_ended_total{reason="max_frames"} 1.0' in text
    assert "codecstream_time_to_first_frame_seconds_count 2.0" in text


def test_tokens_over_plaintext_beyond_loopback_are_warned_about(replay_server_factory, self_signed_cert, caplog):
    cert, key = self_signed_cert

    def warned(**options) -> bool:
        caplog.clear()
        replay_server_factory(auth_tokens=frozenset({TOKEN}), **options)
        return any("bearer tokens over plaintext" in r.getMessage() for r in caplog.records)

    assert warned(host="0.0.0.0")
    assert not warned(host="127.0.0.1")
    assert not warned(host="0.0.0.0", tls_cert=cert, tls_key=key)

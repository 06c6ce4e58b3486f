"""Opening a channel: plain or TLS, with an optional bearer token on every call."""

from __future__ import annotations

import pathlib

import grpc


class _BearerToken(grpc.AuthMetadataPlugin):
    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def __call__(self, context, callback) -> None:
        callback(self._metadata, None)


def call_metadata(token: str | None, tls: bool) -> tuple[tuple[str, str], ...]:
    """Without TLS, gRPC refuses call credentials, so the token travels as plain metadata."""
    return (("authorization", f"Bearer {token}"),) if token and not tls else ()


def open_channel(target: str, tls: bool | str | pathlib.Path = False, token: str | None = None) -> grpc.aio.Channel:
    """`tls`: False (plaintext), True (system roots) or a path to a PEM root certificate."""
    options = [("grpc.max_receive_message_length", 16 << 20)]
    if not tls:
        return grpc.aio.insecure_channel(target, options=options)
    roots = None if tls is True else pathlib.Path(tls).read_bytes()
    credentials = grpc.ssl_channel_credentials(root_certificates=roots)
    if token:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.metadata_call_credentials(_BearerToken(token))
        )
    return grpc.aio.secure_channel(target, credentials, options=options)

"""Opening a channel: plain or TLS, with an optional bearer token on every call, and keepalive.

While a call is open the channel pings the server every `keepalive_s`; no answer within as long
drops the connection, so a connection that died without a FIN or RST (a NAT that forgot it, a
Wi-Fi handover) fails the call within about twice `keepalive_s` and a resumable stream reattaches.
codecstream-server accepts pings every 5 s or more (docs/server.md).

A server that cannot be reached is tried again at least every MAX_RECONNECT_BACKOFF_S. gRPC's own
backoff grows to two minutes, and until its next attempt every call fails at once: a client here
reached a server that had been down for a while only seconds after it was back up (measured:
docs/performance.md, "Measurements behind the code"), and a voice agent would not speak for as long.
"""

from __future__ import annotations

import pathlib

import grpc

DEFAULT_KEEPALIVE_S = 10.0
MAX_RECONNECT_BACKOFF_S = 2.0
#: The largest response message accepted: a Header with the longest reference codes is far smaller.
MAX_RESPONSE_BYTES = 16 << 20


class _BearerToken(grpc.AuthMetadataPlugin):
    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def __call__(self, context, callback) -> None:
        callback(self._metadata, None)


def call_metadata(token: str | None, tls: bool) -> tuple[tuple[str, str], ...]:
    """Without TLS, gRPC refuses call credentials, so the token travels as plain metadata."""
    return (("authorization", f"Bearer {token}"),) if token and not tls else ()


def open_channel(
    target: str,
    tls: bool | str | pathlib.Path = False,
    token: str | None = None,
    keepalive_s: float = DEFAULT_KEEPALIVE_S,
) -> grpc.aio.Channel:
    """`tls`: False (plaintext), True (system roots) or a path to a PEM root certificate."""
    keepalive_ms = int(keepalive_s * 1000)
    options = [
        ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),
        ("grpc.keepalive_time_ms", keepalive_ms),
        ("grpc.keepalive_timeout_ms", keepalive_ms),
        # Acks are sent through the ping machinery, whose own timeout is a minute by default.
        ("grpc.http2.ping_timeout_ms", keepalive_ms),
        # A stream sends little (acks), so pings must not wait for data to have been sent.
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.max_reconnect_backoff_ms", int(MAX_RECONNECT_BACKOFF_S * 1000)),
    ]
    if not tls:
        return grpc.aio.insecure_channel(target, options=options)
    roots = None if tls is True else pathlib.Path(tls).read_bytes()
    credentials = grpc.ssl_channel_credentials(root_certificates=roots)
    if token:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.metadata_call_credentials(_BearerToken(token))
        )
    return grpc.aio.secure_channel(target, credentials, options=options)

"""codecstream client: receive codec tokens over gRPC and turn them into audio on the device."""

from codecstream.client.client import AsyncClient, AudioStream, Client, CodeStream
from codecstream.client.synthesis import AsyncAudioStream, AudioStreamStats, DecoderMismatch, PcmChunk
from codecstream.client.code_stream import AsyncCodeStream
from codecstream.client.errors import (
    CodecMismatch,
    CodecStreamError,
    InvalidRequest,
    ResourceExhausted,
    ServerError,
    StreamEnded,
    StreamNotFound,
    Unauthenticated,
    Unavailable,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncAudioStream",
    "AsyncClient",
    "AudioStream",
    "AudioStreamStats",
    "DecoderMismatch",
    "PcmChunk",
    "AsyncCodeStream",
    "Client",
    "CodeStream",
    "CodecMismatch",
    "CodecStreamError",
    "InvalidRequest",
    "ResourceExhausted",
    "ServerError",
    "StreamEnded",
    "StreamNotFound",
    "Unauthenticated",
    "Unavailable",
]

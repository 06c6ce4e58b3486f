"""codecstream client: receive codec tokens over gRPC and turn them into audio on the device."""

from codecstream.client.client import AsyncClient, AudioStream, Client, CodeStream
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
from codecstream.client.synthesis import AsyncAudioStream, AudioStreamStats, DecoderMismatch, PcmChunk

__version__ = "0.1.0"

__all__ = [
    "AsyncAudioStream",
    "AsyncClient",
    "AsyncCodeStream",
    "AudioStream",
    "AudioStreamStats",
    "Client",
    "CodeStream",
    "CodecMismatch",
    "CodecStreamError",
    "DecoderMismatch",
    "InvalidRequest",
    "PcmChunk",
    "ResourceExhausted",
    "ServerError",
    "StreamEnded",
    "StreamNotFound",
    "Unauthenticated",
    "Unavailable",
]

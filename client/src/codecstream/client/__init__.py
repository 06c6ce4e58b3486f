"""codecstream client: receive codec tokens over gRPC and turn them into audio on the device."""

from importlib.metadata import PackageNotFoundError, version

from codecstream.client.client import AsyncClient, AudioStream, Client, CodeStream, TextStream
from codecstream.client.code_stream import AsyncCodeStream
from codecstream.client.errors import (
    CodecMismatch,
    CodecStreamError,
    DeadlineExceeded,
    InvalidRequest,
    ResourceExhausted,
    ResumeFailed,
    ResumeOutOfRange,
    ServerError,
    StreamEnded,
    StreamNotFound,
    Unauthenticated,
    Unavailable,
)
from codecstream.client.requests import StartOptions
from codecstream.client.synthesis import AsyncAudioStream, AudioStreamStats, PcmChunk
from codecstream.client.text_stream import AsyncTextStream
from codecstream.protocol.text_timing import WordTiming

try:  # the version lives once, in pyproject.toml
    __version__ = version("codecstream-client")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "unknown"

__all__ = [
    "AsyncAudioStream",
    "AsyncClient",
    "AsyncCodeStream",
    "AsyncTextStream",
    "AudioStream",
    "AudioStreamStats",
    "Client",
    "CodeStream",
    "CodecMismatch",
    "CodecStreamError",
    "DeadlineExceeded",
    "InvalidRequest",
    "PcmChunk",
    "ResourceExhausted",
    "ResumeFailed",
    "ResumeOutOfRange",
    "ServerError",
    "StartOptions",
    "StreamEnded",
    "StreamNotFound",
    "TextStream",
    "Unauthenticated",
    "Unavailable",
    "WordTiming",
]

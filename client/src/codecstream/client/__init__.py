"""codecstream client: receive codec tokens over gRPC and turn them into audio on the device.

The streaming client's names are imported on first use: a program that only decodes
(`codecstream.client.runtimes`) does not load the client, its stubs and importlib.metadata at
start-up, which counts in the time a decoder takes to be ready (docs/performance.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# The errors are imported at once: the decoder runtimes raise them too, so they cost nothing more.
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

#: public name -> the module that defines it, imported on first use
_MODULES = {
    **{
        name: "codecstream.client.client"
        for name in ("AsyncClient", "AudioStream", "Client", "CodeStream", "ConnectionOptions", "TextStream")
    },
    "AsyncCodeStream": "codecstream.client.code_stream",
    "StartOptions": "codecstream.client.requests",
    "AsyncAudioStream": "codecstream.client.synthesis",
    "AudioStreamStats": "codecstream.client.synthesis",
    "PcmChunk": "codecstream.client.synthesis",
    "AsyncTextStream": "codecstream.client.text_stream",
    "WordTiming": "codecstream.protocol.text_timing",
}
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
    "ConnectionOptions",
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


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:  # the version lives once, in pyproject.toml
        return version("codecstream-client")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def __getattr__(name: str):
    if name == "__version__":  # importlib.metadata costs 50 ms at start-up
        globals()[name] = _version()
        return globals()[name]
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULES])


if TYPE_CHECKING:
    from codecstream.client.client import AsyncClient, AudioStream, Client, CodeStream, ConnectionOptions, TextStream
    from codecstream.client.code_stream import AsyncCodeStream
    from codecstream.client.requests import StartOptions
    from codecstream.client.synthesis import AsyncAudioStream, AudioStreamStats, PcmChunk
    from codecstream.client.text_stream import AsyncTextStream
    from codecstream.protocol.text_timing import WordTiming

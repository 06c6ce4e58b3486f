"""Typed exceptions of the client, all under `CodecStreamError` (codecstream.protocol.errors):

CodecStreamError
├── ProtocolError (also ValueError): CodesError, StreamOrderError, ChunkingError, ManifestError,
│   CheckpointError, DigestError
├── CodecMismatch: the stream's codes do not fit the decoder
├── DecoderLoadError (codecstream.client.runtimes): a decoder that cannot be opened
├── AudioDeviceUnavailable (codecstream.client.audio_out): no way to play sound here
├── StreamEnded: the stream ended with End(ERROR); `end` holds the server's End
└── ServerError: the call ended with a non-OK status; `code` and `details`
    ├── InvalidRequest, ResourceExhausted, Unauthenticated, Unavailable, DeadlineExceeded
    └── ResumeFailed: StreamNotFound, ResumeOutOfRange
"""

from __future__ import annotations

import grpc
from codecstream.protocol.errors import CodecStreamError, ProtocolError


class CodecMismatch(CodecStreamError):
    """The stream's codes do not fit the client's decoder (codec spec or weights digest differ):
    refused by the server before generating (`code` FAILED_PRECONDITION) or found by the client
    in the stream's Header (`code` None)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class ServerError(CodecStreamError):
    """The server ended the call with a non-OK status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class InvalidRequest(ServerError):
    """INVALID_ARGUMENT: the request is wrong (empty text, unknown voice, a field over its limit, ...)."""


class ResourceExhausted(ServerError):
    """RESOURCE_EXHAUSTED: a server limit (concurrent streams, rate, message size) was hit; retry later."""


class Unauthenticated(ServerError):
    """UNAUTHENTICATED: missing or wrong token."""


class Unavailable(ServerError):
    """UNAVAILABLE: the server cannot be reached, its engine is (re)starting, or it is shutting down."""


class DeadlineExceeded(ServerError):
    """DEADLINE_EXCEEDED: the call's deadline (`timeout_s`) passed, or the server timed it out."""


class ResumeFailed(ServerError):
    """A lost stream could not be resumed: the server says why."""


class StreamNotFound(ResumeFailed):
    """NOT_FOUND on Resume: the server no longer holds the stream (expired, finished, or another
    replica); start a new stream."""


class ResumeOutOfRange(ResumeFailed):
    """OUT_OF_RANGE on Resume: the server no longer keeps the chunks the client is missing."""


class StreamEnded(CodecStreamError):
    """The stream ended with End(ERROR); `end` holds the server's End message."""

    def __init__(self, end) -> None:
        super().__init__(f"server ended the stream with an error: {end.message or 'no reason given'}")
        self.end = end


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


#: Statuses that mean the connection broke rather than that the server refused: a resumable stream
#: reattaches after one, a decoder download resumes from the bytes it has.
CONNECTION_LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)

#: What NOT_FOUND and OUT_OF_RANGE mean on a Resume call; on any other call they are plain ServerErrors
#: (a decoder artifact gone since its listing is not a lost stream to start again).
_ON_RESUME = {grpc.StatusCode.NOT_FOUND: StreamNotFound, grpc.StatusCode.OUT_OF_RANGE: ResumeOutOfRange}


def from_rpc_error(error: grpc.RpcError, *, resuming: bool = False) -> CodecStreamError:
    """The client's exception for a failed call; `resuming`: the call was a Resume."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else str(error)) or ""
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return CodecMismatch(f"{code.name}: {details}", code)
    if resuming and code in _ON_RESUME:
        return _ON_RESUME[code](code, details)
    return _BY_CODE.get(code, ServerError)(code, details)


__all__ = [
    "CodecMismatch",
    "CodecStreamError",
    "DeadlineExceeded",
    "InvalidRequest",
    "ProtocolError",
    "ResourceExhausted",
    "ResumeFailed",
    "ResumeOutOfRange",
    "ServerError",
    "StreamEnded",
    "StreamNotFound",
    "Unauthenticated",
    "Unavailable",
    "from_rpc_error",
]

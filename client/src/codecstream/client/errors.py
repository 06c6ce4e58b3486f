"""Typed exceptions of the client. Server errors carry the gRPC status code and its message."""

from __future__ import annotations

import grpc
from codecstream.protocol.errors import CodecMismatchError, ProtocolError


class CodecStreamError(Exception):
    """Base class of every error the client raises on purpose."""


class CommandError(Exception):
    """A reason a CLI command failed, printed as one line; `exit_code` defaults to 1."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ServerError(CodecStreamError):
    """The server ended the call with a non-OK status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class InvalidRequest(ServerError):
    """INVALID_ARGUMENT: the request is wrong (empty text, unknown voice, ...)."""


class CodecMismatch(ServerError):
    """FAILED_PRECONDITION: the server's codes do not fit the client's decoder."""


class ResourceExhausted(ServerError):
    """RESOURCE_EXHAUSTED: a server limit (concurrent streams, rate) was hit; retry later."""


class Unauthenticated(ServerError):
    """UNAUTHENTICATED: missing or wrong token."""


class Unavailable(ServerError):
    """UNAVAILABLE: the server cannot be reached or is shutting down."""


class StreamNotFound(ServerError):
    """NOT_FOUND / OUT_OF_RANGE on Resume: the server no longer holds the stream or its chunks."""


class StreamEnded(CodecStreamError):
    """The stream ended with End(ERROR); `end` holds the server's End message."""

    def __init__(self, end) -> None:
        super().__init__(f"server ended the stream with an error: {end.message or 'no reason given'}")
        self.end = end


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.FAILED_PRECONDITION: CodecMismatch,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.NOT_FOUND: StreamNotFound,
    grpc.StatusCode.OUT_OF_RANGE: StreamNotFound,
}


def from_rpc_error(error: grpc.RpcError) -> ServerError:
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return _BY_CODE.get(code, ServerError)(code, details or "")


__all__ = [
    "CodecMismatch",
    "CodecMismatchError",
    "CodecStreamError",
    "CommandError",
    "InvalidRequest",
    "ProtocolError",
    "ResourceExhausted",
    "ServerError",
    "StreamEnded",
    "StreamNotFound",
    "Unauthenticated",
    "Unavailable",
    "from_rpc_error",
]

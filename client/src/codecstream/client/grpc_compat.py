"""What the client reads from grpc.aio that grpc.aio does not make public: one call's latest status.

A grpc.aio stream call whose request writer sends a message after the server closed the call
reports INTERNAL "Internal error from Core" (grpc/grpc#36066) instead of the status the server
sent, so a refusal (an unknown voice, a decoder that does not fit) would reach the caller as an
internal error. The server's status is still on the call's Cython core object (`_cython_call`,
attribute `_status`), which keeps the latest status it received; nothing public exposes it.

Checked against grpcio 1.85.4, the release the tests run on (the client asks for grpcio>=1.70):
`grpc.aio._call.Call._cython_call` is a `cygrpc._AioCall` whose `_status` is an `AioRpcStatus`,
None until the call ends. If a grpcio release drops either
attribute, `latest_status` returns None, the answer for "no status known yet": the client then
reports the stand-in INTERNAL error as it is, as it would if the server's status never came. A
warning says so once per process.
"""

from __future__ import annotations

import asyncio
import functools
import logging

import grpc

log = logging.getLogger(__name__)

_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
#: grpc.aio's stand-in status for a write that raced the server closing the call (grpc/grpc#36066).
_WRITE_AFTER_CLOSE = "Internal error from Core"
#: How long the server's own status may take to follow the stand-in.
_REAL_STATUS_WAIT_S = 1.0


def latest_status(call: grpc.aio.Call) -> grpc.aio.AioRpcError | None:
    """The latest status `call` received, as the error grpc.aio would raise for it; None while the
    call has none, or when this grpcio keeps it elsewhere (see the module docstring)."""
    core_call = getattr(call, "_cython_call", None)
    if core_call is None or not hasattr(core_call, "_status"):
        _report_missing_status(grpc.__version__)
        return None
    status = core_call._status
    if status is None:
        return None
    return grpc.aio.AioRpcError(
        _STATUS_CODES.get(status.code(), grpc.StatusCode.UNKNOWN),
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*(status.trailing_metadata() or ())),
        status.details(),
        status.debug_error_string(),
    )


@functools.cache
def _report_missing_status(version: str) -> None:
    log.warning(
        "grpcio %s keeps no status on grpc.aio's core call (_cython_call._status): a refusal that races "
        "a write is reported as INTERNAL 'Internal error from Core' (grpc/grpc#36066)",
        version,
    )


async def server_status(
    error: grpc.RpcError, call: grpc.aio.Call, first_status: grpc.aio.AioRpcError | None
) -> grpc.RpcError:
    """`error`, or, when it is grpc.aio's stand-in for a write that raced the server closing the
    call (the first message can), the status the server sent: a refusal must reach the caller as
    the refusal it is. The server's arrives either before the stand-in (`first_status`, noted by a
    done callback when the call ended) or just after it (the call's latest status)."""
    if error.code() != grpc.StatusCode.INTERNAL or error.details() != _WRITE_AFTER_CLOSE:
        return error
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + _REAL_STATUS_WAIT_S
    while True:
        for status in (first_status, latest_status(call)):
            if status is not None and status.details() != _WRITE_AFTER_CLOSE:
                return status
        if loop.time() >= give_up_at:
            return error
        await asyncio.sleep(0.01)

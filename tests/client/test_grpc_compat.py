"""grpc_compat: the one place the client reads grpc.aio's private status, and what happens without it."""

from __future__ import annotations

import asyncio
import logging

import grpc
from codecstream.client import grpc_compat

_METHOD = "/test.Compat/Refuse"


def _refusing_handler() -> grpc.GenericRpcHandler:
    async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")

    handler = grpc.unary_unary_rpc_method_handler(refuse)
    return grpc.method_handlers_generic_handler("test.Compat", {"Refuse": handler})


def test_the_installed_grpcio_keeps_a_finished_calls_status_where_the_client_reads_it():
    # Fails on a grpcio release that moved the private status: grpc_compat must then be revisited.
    async def status_of_a_refused_call() -> tuple[grpc.aio.AioRpcError | None, grpc.aio.AioRpcError | None]:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_refusing_handler(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(_METHOD)(b"")
                before = grpc_compat.latest_status(call)
                try:
                    await call
                except grpc.RpcError:
                    pass
                return before, grpc_compat.latest_status(call)
        finally:
            await server.stop(None)

    before, after = asyncio.run(status_of_a_refused_call())
    assert before is None
    assert isinstance(after, grpc.aio.AioRpcError)
    assert after.code() == grpc.StatusCode.NOT_FOUND and after.details() == "no such thing"


def test_a_call_cancelled_by_the_client_reads_as_cancelled_though_it_has_no_trailing_metadata():
    # Its status is read in the call's done callback, where an exception would break the channel's close.
    async def status_of_a_cancelled_call() -> grpc.aio.AioRpcError | None:
        async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:  # nobody listens: the call waits
            call = channel.unary_unary(_METHOD)(b"", wait_for_ready=True)
            call.cancel()
            try:
                await call
            except asyncio.CancelledError:
                pass
            return grpc_compat.latest_status(call)

    status = asyncio.run(status_of_a_cancelled_call())
    assert status is not None and status.code() == grpc.StatusCode.CANCELLED


def test_a_grpcio_without_the_private_status_reads_as_no_status_known_and_says_so_once(caplog):
    grpc_compat._report_missing_status.cache_clear()

    class CallWithoutCore:
        pass

    with caplog.at_level(logging.WARNING, logger=grpc_compat.__name__):
        assert grpc_compat.latest_status(CallWithoutCore()) is None
        assert grpc_compat.latest_status(CallWithoutCore()) is None
    warnings = [record for record in caplog.records if "_cython_call._status" in record.getMessage()]
    assert len(warnings) == 1


def test_without_the_private_status_the_stand_in_internal_error_reaches_the_caller_as_it_is(monkeypatch):
    # What the client did before it read the status at all: no refusal is invented.
    monkeypatch.setattr(grpc_compat, "_REAL_STATUS_WAIT_S", 0.05)
    stand_in = grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), grpc_compat._WRITE_AFTER_CLOSE
    )

    async def resolved() -> grpc.RpcError:
        return await grpc_compat.server_status(stand_in, object(), None)

    assert asyncio.run(resolved()) is stand_in

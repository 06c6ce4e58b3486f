"""What every RPC handler does with its call: write within the stall timeout, end with a status,
refuse with one, and know the call ended under it (`ClientGone`)."""

from __future__ import annotations

import asyncio
import logging

import grpc
from codecstream.server.errors import Refusal
from codecstream.server.metrics import Metrics

log = logging.getLogger(__name__)


class ClientGone(Exception):
    """A write failed because its call ended under it: the client disconnected or cancelled, which
    ends the handler quietly (a status can no longer reach it)."""


async def write_within(context, message, timeout_s: float) -> bool:
    """Send one message; False if the client read nothing for `timeout_s`; ClientGone if the call
    ended under the write."""
    try:
        await asyncio.wait_for(context.write(message), timeout_s)
    except asyncio.TimeoutError:  # TimeoutError itself only from Python 3.11 on
        return False
    except (asyncio.CancelledError, ClientGone):
        raise
    except Exception as error:  # gRPC's ExecuteBatchError: the connection went with the write pending
        raise ClientGone(type(error).__name__) from None
    return True


def set_status(context, status: str, message: str) -> None:
    """The status the call ends with once the handler returns."""
    context.set_code(getattr(grpc.StatusCode, status))
    context.set_details(message)


def count_refusal(metrics: Metrics, refusal: Refusal) -> None:
    metrics.rejected.labels(status=refusal.status.lower()).inc()
    log.info("rejected: %s %s", refusal.status, refusal.message)


def refuse_unary(metrics: Metrics, context, refusal: Refusal) -> None:
    """Refuse a call whose request came whole (unary, server-streaming): the handler returns with
    this status set. Not context.abort: the AbortError it raises is kept by the call's state in a
    reference cycle with the handler's frames, which held the request until a full collection, and
    full collections are rare once the engine's objects are frozen (app.py)."""
    count_refusal(metrics, refusal)
    set_status(context, refusal.status, refusal.message)

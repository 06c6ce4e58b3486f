"""Bearer-token authentication: `authorization: Bearer <token>` metadata on every call."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import pathlib

import grpc

#: Health checks and reflection stay open so load balancers and grpcurl work without a token.
UNAUTHENTICATED_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def bearer_token(metadata) -> str:
    """The token of an `authorization: Bearer <token>` entry; the scheme is case-insensitive (RFC 7235)."""
    for key, value in metadata or ():
        if key != "authorization" or not isinstance(value, str):
            continue
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() == "bearer":
            return token.strip()
    return ""


def token_identity(token: str) -> str:
    """A loggable name for a token that does not reveal it."""
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:12]


def principal(metadata, peer: str | None, tokens_checked: bool) -> str:
    """Who is calling: the bearer token's identity when the server checks tokens (the interceptor
    let this call through), else the peer's address without its port (a reconnect gets a new
    port). A token nobody checks is no identity: any string would make a fresh client, with fresh
    per-client limits."""
    token = bearer_token(metadata) if tokens_checked else ""
    if token:
        return token_identity(token)
    peer = peer or "unknown"
    return peer.rsplit(":", 1)[0] if peer.count(":") > 1 else peer


def load_tokens(path: pathlib.Path | str) -> frozenset[str]:
    """One token per line; blank lines and lines starting with # are ignored."""
    lines = pathlib.Path(path).read_text().splitlines()
    tokens = frozenset(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    if not tokens:
        raise ValueError(f"auth token file {path} holds no token")
    return tokens


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: frozenset[str]) -> None:
        self._tokens = tokens

    def _valid(self, token: str) -> bool:
        return any(hmac.compare_digest(token, known) for known in self._tokens)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(UNAUTHENTICATED_SERVICES):
            return handler
        token = bearer_token(handler_call_details.invocation_metadata)
        if token and self._valid(token):
            return handler
        message = "missing bearer token (authorization metadata)" if not token else "bearer token not accepted"
        return _refusal_like(handler, message)


def _refusal_like(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same call shape as `handler` that only answers UNAUTHENTICATED."""

    async def refuse(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def refuse_streaming(request_or_iterator, context):
        # grpc.aio wants an async generator for streamed responses; this one aborts before yielding.
        # Reading the first message before aborting avoids a race in which the client, still
        # sending, sees INTERNAL instead of UNAUTHENTICATED.
        if handler.request_streaming:
            with contextlib.suppress(StopAsyncIteration, grpc.RpcError):
                await anext(request_or_iterator.__aiter__())
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield

    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    behaviour = refuse_streaming if handler.response_streaming else refuse
    return make(
        behaviour, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )

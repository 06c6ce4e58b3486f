"""Assembles a serving process: the SynthesisService, health, reflection, TLS, auth, metrics."""

from __future__ import annotations

import dataclasses
import logging
import pathlib

import grpc
import prometheus_client
from codecstream.server.auth import BearerTokenInterceptor
from codecstream.server.limits import ServerLimits
from codecstream.server.metrics import Metrics
from codecstream.server.service import SynthesisService
from codecstream.server.source import CodeSource
from codecstream.v1 import synthesis_pb2, synthesis_pb2_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

log = logging.getLogger(__name__)

SERVICE_NAME = synthesis_pb2.DESCRIPTOR.services_by_name["SynthesisService"].full_name


@dataclasses.dataclass
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 50051
    tls_cert: pathlib.Path | None = None
    tls_key: pathlib.Path | None = None
    auth_tokens: frozenset[str] = frozenset()
    #: Port of the Prometheus /metrics endpoint; None: not served.
    metrics_port: int | None = None
    limits: ServerLimits = dataclasses.field(default_factory=ServerLimits)
    #: On shutdown, running streams get this long to finish before End(ERROR).
    shutdown_grace_s: float = 10.0


class CodecStreamServer:
    """One gRPC server around one CodeSource. `await start()`, then `await stop()`."""

    def __init__(self, source: CodeSource, options: ServerOptions | None = None) -> None:
        self.options = options = options or ServerOptions()
        self.metrics = Metrics()
        self.service = SynthesisService(source, options.limits, self.metrics)
        self.health: health.aio.HealthServicer | None = None
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self._metrics_http = None

    def _build_server(self) -> grpc.aio.Server:
        # grpc.aio objects belong to the event loop they are created on: build them in start().
        interceptors = [BearerTokenInterceptor(self.options.auth_tokens)] if self.options.auth_tokens else []
        server = grpc.aio.server(interceptors=interceptors, options=[("grpc.so_reuseport", 0)])
        self.health = health.aio.HealthServicer()
        synthesis_pb2_grpc.add_SynthesisServiceServicer_to_server(self.service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        return server

    async def start(self) -> int:
        """Bind and start serving; return the bound port (useful with port 0)."""
        self.server = self._build_server()
        address = f"{self.options.host}:{self.options.port}"
        if self.options.tls_cert or self.options.tls_key:
            if not (self.options.tls_cert and self.options.tls_key):
                raise ValueError("TLS needs both --tls-cert and --tls-key")
            credentials = grpc.ssl_server_credentials(
                [(pathlib.Path(self.options.tls_key).read_bytes(), pathlib.Path(self.options.tls_cert).read_bytes())]
            )
            self.port = self.server.add_secure_port(address, credentials)
        else:
            self.port = self.server.add_insecure_port(address)
        if not self.port:
            raise OSError(f"could not bind {address}")
        if self.options.metrics_port is not None:
            self._metrics_http, _ = prometheus_client.start_http_server(
                self.options.metrics_port, addr=self.options.host, registry=self.metrics.registry
            )
        await self.server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving %s on %s:%d", SERVICE_NAME, self.options.host, self.port)
        return self.port

    @property
    def metrics_port(self) -> int | None:
        return self._metrics_http.server_port if self._metrics_http else None

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful shutdown: NOT_SERVING, drain streams (End(ERROR) after the grace), close."""
        grace_s = self.options.shutdown_grace_s if grace_s is None else grace_s
        await self.health.enter_graceful_shutdown()
        await self.service.drain(grace_s)
        await self.server.stop(grace=1.0)
        if self._metrics_http is not None:
            self._metrics_http.shutdown()

    async def wait_for_termination(self) -> None:
        await self.server.wait_for_termination()

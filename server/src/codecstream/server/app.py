"""Assembles a serving process: the SynthesisService, health, reflection, TLS, auth, metrics, and
the supervisor that keeps the code source serving."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import ipaddress
import logging
import pathlib
import socket
import time
from collections.abc import Callable

import grpc
import prometheus_client
from codecstream.server.auth import BearerTokenInterceptor
from codecstream.server.decoder_artifacts import DecoderArtifacts
from codecstream.server.errors import one_line
from codecstream.server.handlers import SERVICE_NAME, synthesis_handler
from codecstream.server.limits import ServerLimits, check_ranges
from codecstream.server.loop_stalls import LoopStallWatchdog, Stall
from codecstream.server.metrics import Metrics
from codecstream.server.service import SynthesisService
from codecstream.server.source import CodeSource
from codecstream.server.supervisor import RestartPolicy, SourceState, SourceSupervisor
from codecstream.v1 import synthesis_pb2 as pb
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

log = logging.getLogger(__name__)

#: How often the loop-lag monitor sets its timer (and beats for the stall watchdog).
LOOP_LAG_PERIOD_S = 0.1
#: How long a stop waits, after the grace, for gRPC to close its connections before it goes on.
TRANSPORT_CLOSE_TIMEOUT_S = 3.0


class BindError(OSError):
    """A port the server could not listen on; the message names which and why."""


class SourceStartError(Exception):
    """The code source (the engine) failed to start; the message is one line, the cause attached."""


@dataclasses.dataclass(frozen=True)
class Keepalive:
    """HTTP/2 keepalive: the server pings an idle connection every `time_s` and drops it when no
    answer comes within `timeout_s`, so a dead peer (a half-open connection) is noticed within
    `time_s + timeout_s` and its stream is treated as disconnected."""

    time_s: float = 20.0
    timeout_s: float = 10.0
    #: Clients may ping this often (an idle channel's own keepalive) without being refused.
    client_min_interval_s: float = 5.0

    def __post_init__(self) -> None:
        check_ranges(self, {"time_s": ("> 0", lambda value: value > 0)})

    def channel_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.keepalive_time_ms", int(self.time_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.timeout_s * 1000)),
            # The keepalive ping is acked under the general ping timeout (60 s by default), not
            # keepalive_timeout_ms alone (as grpcio behaves, observed here): set both.
            ("grpc.http2.ping_timeout_ms", int(self.timeout_s * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", int(self.client_min_interval_s * 1000)),
        ]


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
    keepalive: Keepalive = dataclasses.field(default_factory=Keepalive)
    restart_policy: RestartPolicy = dataclasses.field(default_factory=RestartPolicy)
    #: On shutdown, running streams get this long to finish before End(ERROR).
    shutdown_grace_s: float = 10.0
    #: On shutdown, health answers NOT_SERVING this long while new streams are still taken, so
    #: balancers that watch health move new streams away before the port closes.
    drain_delay_s: float = 0.0
    #: Decoder artifact directories offered for download (decoder_artifacts.py).
    decoder_artifacts: tuple[pathlib.Path, ...] = ()
    #: The monotonic clock (seconds) the per-client rate limits read; a test passes one it moves.
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        check_ranges(self, _OPTION_RANGES)
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("TLS needs both --tls-cert and --tls-key")


#: A drain delay holds a stopping server (SIGTERM) that long before its streams get their grace:
#: minutes would outlast any process supervisor's patience.
MAX_DRAIN_DELAY_S = 300.0
_OPTION_RANGES = {
    "port": ("0-65535", lambda value: 0 <= value <= 65535),
    "shutdown_grace_s": (">= 0", lambda value: value >= 0),
    "drain_delay_s": (f"0-{MAX_DRAIN_DELAY_S:g}", lambda value: 0 <= value <= MAX_DRAIN_DELAY_S),
}


class CodecStreamServer:
    """One gRPC server around one CodeSource, which it owns: `await start()`, then `await stop()`.

    start() binds first (health NOT_SERVING, new streams UNAVAILABLE) and then starts the source,
    so a busy port costs no engine start-up and a load balancer sees the replica while it loads.
    """

    def __init__(self, source: CodeSource, options: ServerOptions | None = None) -> None:
        self.options = options = options or ServerOptions()
        self.metrics = Metrics()
        self.service = SynthesisService(
            source, options.limits, self.metrics, tokens_checked=bool(options.auth_tokens), clock=options.clock
        )
        self.supervisor = SourceSupervisor(source, self.metrics, self._on_source_state, options.restart_policy)
        self.health: health.aio.HealthServicer | None = None
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self._metrics_http = None
        self._lag_monitor: asyncio.Task | None = None
        self._grpc_stopping: asyncio.Future | None = None
        self._stall_watchdog: LoopStallWatchdog | None = None
        self._gc_pause_by_generation = [self.metrics.gc_pause.labels(generation=str(g)) for g in range(3)]
        self._gc_started: float | None = None

    def _build_server(self) -> grpc.aio.Server:
        # grpc.aio objects belong to the event loop they are created on: build them in start().
        options = self.options
        interceptors = [BearerTokenInterceptor(options.auth_tokens)] if options.auth_tokens else []
        channel_options = [
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", self.service.max_request_bytes),
            *options.keepalive.channel_options(),
        ]
        if not self.service.takes_reference_audio:
            # Its largest request is ~80 KB: HTTP/2's default receive window (64 KiB) needs no
            # growing (BDP probing), and without it a client can push only about a window of an
            # oversize message before the refusal stops it (tests/server/test_exhaustion.py; what a
            # refusal costs either way: docs/performance.md, "Measurements behind the code").
            channel_options.append(("grpc.http2.bdp_probe", 0))
        server = grpc.aio.server(interceptors=interceptors, options=channel_options)
        self.health = health.aio.HealthServicer()
        server.add_generic_rpc_handlers([synthesis_handler(self.service)])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        return server

    async def start(self) -> int:
        """Bind, serve, then start the source; return the bound port (useful with port 0).

        Raises BindError for a port that cannot be bound, ValueError for a decoder artifact that is
        not the source's, SourceStartError when the source fails to start; whatever ends it,
        cancellation included, nothing is left running."""
        if self.options.decoder_artifacts:
            self.service.artifacts = await asyncio.to_thread(
                DecoderArtifacts.load, self.options.decoder_artifacts, self.service.source.codec
            )
        await self.bind()
        try:
            await self.supervisor.start()
        except BaseException as error:
            await self._close_transport(grace_s=0)
            await self.supervisor.stop()
            if isinstance(error, Exception):
                # Not cut: the operator reads the whole reason once, at start-up.
                message = f"the engine did not start: {one_line(error, limit=None, with_type=True)}"
                raise SourceStartError(message) from error
            raise
        log.info("serving %s on %s:%d", SERVICE_NAME, self.options.host, self.port)
        return self.port

    async def wait_until_source_gave_up(self) -> None:
        """Return once the source failed and the restart policy gave up on it (the process should exit)."""
        await self.supervisor.gave_up.wait()

    async def bind(self) -> int:
        """Listen on the gRPC (and metrics) ports, answering NOT_SERVING until the source serves."""
        options = self.options
        address = f"{options.host}:{options.port}"
        _check_bindable(options.host, options.port, f"cannot serve gRPC on {address}")
        self.server = self._build_server()
        credentials = None
        if options.tls_cert:
            credentials = grpc.ssl_server_credentials(
                [(pathlib.Path(options.tls_key).read_bytes(), pathlib.Path(options.tls_cert).read_bytes())]
            )
        if credentials is None and options.auth_tokens and not _is_loopback(options.host):
            log.warning(
                "bearer tokens over plaintext on %s: anyone on the path can read and reuse them; "
                "serve TLS (--tls-cert, --tls-key) or put a TLS proxy in front",
                options.host,
            )
        try:
            if credentials is None:
                self.port = self.server.add_insecure_port(address)
            else:
                self.port = self.server.add_secure_port(address, credentials)
        except RuntimeError:
            self.port = 0  # gRPC says only "Failed to bind", with a hint about its debug logging
        if not self.port:
            raise BindError(f"cannot serve gRPC on {address}: the address is in use or not available")
        if options.metrics_port is not None:
            try:
                self._metrics_http, _ = prometheus_client.start_http_server(
                    options.metrics_port, addr=options.host, registry=self.metrics.registry
                )
            except OSError as error:
                raise BindError(
                    f"cannot serve metrics on {options.host}:{options.metrics_port}: {error.strerror or error}"
                ) from None
        await self.server.start()
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self._stall_watchdog = LoopStallWatchdog(LOOP_LAG_PERIOD_S, on_stall=self._report_stall)
        self._stall_watchdog.start()
        self._lag_monitor = asyncio.create_task(self._measure_loop_lag(), name="loop-lag")
        gc.callbacks.append(self._time_collection)
        return self.port

    async def _measure_loop_lag(self) -> None:
        # Anything that blocks the loop delays every stream and health check by as much.
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LOOP_LAG_PERIOD_S
            await asyncio.sleep(LOOP_LAG_PERIOD_S)
            self.metrics.loop_lag.observe(max(0.0, loop.time() - due))
            self._stall_watchdog.beat()

    def _report_stall(self, stall: Stall) -> None:
        # From the watchdog's thread: what the lag histogram counts, with where and why.
        self.metrics.loop_stalls.labels(cause=stall.cause).inc()
        log.warning("%s", stall.describe())

    def _time_collection(self, phase: str, info: dict) -> None:
        # A collection stops every thread of the process, the event loop included: time each one.
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self._gc_pause_by_generation[info["generation"]].observe(time.perf_counter() - self._gc_started)
            self._gc_started = None

    async def _on_source_state(self, state: SourceState, reason: str) -> None:
        if state is SourceState.SERVING:
            # What the engine loaded stays for the life of the process: ~900k objects with vLLM,
            # which a full collection scans long enough to stall every stream and health check
            # (docs/performance.md, "Measurements behind the code").
            # Frozen, they are never scanned again; newer objects are collected as usual.
            gc.freeze()
            # freeze() leaves the collector's count of old objects at the engine's ~900k, and a
            # full collection waits until a quarter as many again have aged: until then every
            # cycle (with whatever memory it holds) stays. Collecting now, with only the
            # unfrozen objects to scan, resets that count to what is actually collectable.
            gc.collect()
            self.service.set_unavailable(None)
            await self._set_health(health_pb2.HealthCheckResponse.SERVING)
            return
        self.service.set_unavailable(reason)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        if state is not SourceState.STARTING:
            await self.service.stop_streams(pb.END_REASON_ERROR, reason)

    async def _set_health(self, status) -> None:
        if self.health is not None:
            for name in ("", SERVICE_NAME):
                await self.health.set(name, status)

    @property
    def metrics_port(self) -> int | None:
        return self._metrics_http.server_port if self._metrics_http else None

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful shutdown, and always release the source: health NOT_SERVING; after the drain
        delay, stop listening (new connections are refused, so a balancer that picks a replica per
        connection attempt moves on at once) while running streams finish for `grace_s`, then end
        the rest with End(ERROR)."""
        grace_s = self.options.shutdown_grace_s if grace_s is None else grace_s
        try:
            if self.health is not None:
                await self.health.enter_graceful_shutdown()
            if self.options.drain_delay_s > 0:
                await asyncio.sleep(self.options.drain_delay_s)
            # One second beyond the grace: the drain's End(ERROR) goes out before the transport
            # cancels what is left.
            listening = asyncio.create_task(self._stop_listening(grace_s + 1.0))
            try:
                await self.service.drain(grace_s)
            finally:
                await listening
            await self._close_transport(grace_s=0)
        finally:
            await self.supervisor.stop()

    async def _stop_listening(self, grace_s: float) -> None:
        await self._stop_grpc(grace_s)

    async def _stop_grpc(self, grace_s: float) -> None:
        """gRPC's stop, bounded: after the grace it cancels every call, then waits for every
        connection to close, and a client that stopped reading holds its connection (with the
        data it never took) until keepalive gives up on it, minutes later. The stop goes on in
        the background past the bound (cancelling it mid-shutdown cancelled its caller too); a
        second call waits for the same one."""
        if self.server is None:
            return
        if self._grpc_stopping is None:
            self._grpc_stopping = asyncio.ensure_future(self.server.stop(grace=grace_s))
        done, _ = await asyncio.wait({self._grpc_stopping}, timeout=grace_s + TRANSPORT_CLOSE_TIMEOUT_S)
        if not done:
            log.warning(
                "gRPC did not close every connection within %.1f s of the grace (a client that stopped "
                "reading holds one); stopping without waiting for it",
                TRANSPORT_CLOSE_TIMEOUT_S,
            )

    async def _close_transport(self, grace_s: float) -> None:
        if self._time_collection in gc.callbacks:
            gc.callbacks.remove(self._time_collection)
        if self._lag_monitor is not None:
            self._lag_monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lag_monitor
            self._lag_monitor = None
        if self._stall_watchdog is not None:
            self._stall_watchdog.stop()
            self._stall_watchdog = None
        await self._stop_grpc(grace_s)
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http = None

    async def wait_for_termination(self) -> None:
        await self.server.wait_for_termination()


def _is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name) only ever reaches this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_bindable(host: str, port: int, what: str) -> None:
    """Raise BindError if `host:port` cannot be listened on. gRPC's own failure is a log line on
    stderr and a bare "Failed to bind"; trying first gives the operator one line with the reason."""
    if port == 0:
        return
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, protocol) as probe:
            # As gRPC binds: a port in TIME_WAIT is free, one with a listener is not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as error:
        raise BindError(f"{what}: {error.strerror or error}") from None

"""`codecstream-balancer`: nginx in front of several codecstream-server replicas, kept in step with
their gRPC health.

    codecstream-balancer --listen 0.0.0.0:50051 --replica r0=10.0.0.5:50051 --replica r1=10.0.0.6:50051
    codecstream-balancer --listen 0.0.0.0:50051 --gpus all -- --model Qwen/Qwen3-TTS-12Hz-1.7B-Base

With `--gpus` it starts the replicas itself, one codecstream-server per GPU of this host, each
seeing its own device, with the arguments after `--` (codecstream.server.replica_supervisor), and
restarts one whose process exits; the health poll below drains it meanwhile.

nginx balances each Synthesize call (an HTTP/2 stream) to the replica with the fewest open calls
and proxies it unbuffered both ways. Open-source nginx has no active health checks, so this
process polls every replica's `grpc.health.v1` status and rewrites the pool when it changes
(`nginx -s reload`: old workers finish the streams they carry, new ones take new calls). A replica
that drains (SIGTERM: NOT_SERVING) or dies leaves the pool within one poll; one that comes back
joins it again.

Resume needs the replica that holds the stream. nginx names the replica of every call in the
`codecstream-replica` response header; the client echoes it on Resume, and nginx routes a call
that carries it to that replica alone, pool or not (a draining replica still resumes its own
streams). If that replica is gone the Resume gets NOT_FOUND, and the client starts over.

`--print-config` writes the nginx configuration this process runs, for operators who run nginx
themselves (they then need their own health checks).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import pathlib
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc
from codecstream.protocol.metadata import REPLICA_HEADER
from codecstream.server import log_setup
from codecstream.server.replica_supervisor import (
    ReplicaSpec,
    ReplicaSpecError,
    ReplicaSupervisor,
    check_server_args,
    find_server,
    parse_gpus,
    replica_specs,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger("codecstream.balancer")

SERVICE_NAME = "codecstream.v1.SynthesisService"
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_ADDRESS = re.compile(r"[A-Za-z0-9.-]+:[0-9]{1,5}|\[[0-9A-Fa-f:]+\]:[0-9]{1,5}")

EXIT_STARTUP_FAILED = 1


class BalancerError(Exception):
    """A reason the balancer cannot start, printed as one line."""


@dataclasses.dataclass(frozen=True)
class Replica:
    name: str
    address: str

    @classmethod
    def parse(cls, text: str) -> Replica:
        name, separator, address = text.partition("=")
        if not separator or not _NAME.fullmatch(name) or not _ADDRESS.fullmatch(address):
            raise BalancerError(
                f"--replica {text[:80]!r}: expected NAME=HOST:PORT, NAME of 1-32 lowercase letters, digits or '-'"
            )
        return cls(name, address)

    @property
    def upstream(self) -> str:
        return f"codecstream_replica_{self.name.replace('-', '_')}"


@dataclasses.dataclass(frozen=True)
class BalancerConfig:
    listen: str
    replicas: tuple[Replica, ...]
    #: With --gpus: the replicas this balancer starts (the same as `replicas`, with devices and ports).
    started_here: tuple[ReplicaSpec, ...] = ()
    #: Longest silence nginx allows in either direction of a call; codecstream-server's own
    #: timeouts (first message, stalled client, keepalive) end dead calls long before.
    stream_timeout_s: int = 3600


def render_nginx_config(config: BalancerConfig, healthy: set[str], runtime_dir: pathlib.Path) -> str:
    """The whole nginx.conf: the pool (replicas not in `healthy` marked down), one upstream per
    replica for Resume, and the gRPC server."""
    pool = "\n".join(
        f"        server {replica.address}{'' if replica.name in healthy else ' down'};" for replica in config.replicas
    )
    singles = "\n".join(
        f"    upstream {replica.upstream} {{ server {replica.address}; }}" for replica in config.replicas
    )
    routes = "\n".join(f"        {replica.name} {replica.upstream};" for replica in config.replicas)
    # $upstream_addr lists every server tried ("a, b" after a retry); the last one served the call.
    names = "\n".join(f"        ~(^|\\s){re.escape(replica.address)}$ {replica.name};" for replica in config.replicas)
    user = f"user {pwd.getpwuid(os.geteuid()).pw_name};\n" if os.geteuid() == 0 else ""
    timeout = f"{config.stream_timeout_s}s"
    run = runtime_dir
    return f"""# Written by codecstream-balancer; regenerated when a replica's health changes.
{user}worker_processes 1;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections 8192; }}

http {{
    access_log off;
    client_body_temp_path {run}/client_body;
    proxy_temp_path {run}/proxy;
    fastcgi_temp_path {run}/fastcgi;
    uwsgi_temp_path {run}/uwsgi;
    scgi_temp_path {run}/scgi;

    # New streams: the healthy replica with the fewest open calls.
    upstream codecstream_pool {{
        least_conn;
{pool}
    }}
    # Resume: the replica named by the call's {REPLICA_HEADER} header, whatever its health.
{singles}

    map $http_{REPLICA_HEADER.replace("-", "_")} $codecstream_upstream {{
        default codecstream_pool;
{routes}
    }}
    map $upstream_addr $codecstream_replica {{
        default "";
{names}
    }}
    # A call nginx could not hand to a replica: NOT_FOUND for a Resume (its replica is gone),
    # UNAVAILABLE for a new stream (no replica can take it now).
    map $http_{REPLICA_HEADER.replace("-", "_")} $codecstream_failed_status {{
        default 14;
        ~. 5;
    }}
    map $http_{REPLICA_HEADER.replace("-", "_")} $codecstream_failed_message {{
        default "no codecstream replica can take the stream now";
        ~. "the replica that held the stream is gone; start a new stream";
    }}

    server {{
        listen {config.listen} http2;
        http2_max_concurrent_streams 1024;
        keepalive_timeout {timeout};
        # A client connection lives at most this long (then GOAWAY; its calls finish): calls on a
        # connection accepted before a pool change follow the old pool until it goes.
        keepalive_time 60s;
        client_body_timeout {timeout};
        # A call's request body is its whole message stream (Start, reference audio up to
        # 8 MiB, acks); the server enforces the limits of each message.
        client_max_body_size 0;

        location / {{
            grpc_pass grpc://$codecstream_upstream;
            grpc_read_timeout {timeout};
            grpc_send_timeout {timeout};
            grpc_connect_timeout 2s;
            grpc_next_upstream error timeout;
            add_header {REPLICA_HEADER} $codecstream_replica always;
            error_page 502 503 504 = @codecstream_failed;
        }}
        location @codecstream_failed {{
            internal;
            default_type application/grpc;
            add_header grpc-status $codecstream_failed_status always;
            add_header grpc-message $codecstream_failed_message always;
            return 204;
        }}
    }}
}}
"""


class NginxProcess:
    """nginx in the foreground, in its own runtime directory, as this process's child."""

    def __init__(self, binary: str, runtime_dir: pathlib.Path) -> None:
        self.binary = binary
        self.runtime_dir = runtime_dir
        self.config_path = runtime_dir / "nginx.conf"
        self.process: subprocess.Popen | None = None

    def write(self, text: str) -> None:
        for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.runtime_dir / name).mkdir(exist_ok=True)
        staged = self.config_path.with_suffix(".new")
        staged.write_text(text)
        check = subprocess.run(self._command("-t", staged), capture_output=True, text=True)
        if check.returncode != 0:
            raise BalancerError(f"nginx refused the configuration: {_last_line(check.stderr)}")
        staged.replace(self.config_path)

    def start(self) -> None:
        self.process = subprocess.Popen(self._command(None, self.config_path, "daemon off;"), stderr=subprocess.PIPE)
        try:
            self.process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            self.process.stderr.close()
            return
        raise BalancerError(f"nginx exited at start: {_last_line(self.process.stderr.read().decode())}")

    def reload(self, timeout_s: float = 5.0) -> None:
        """Load the written configuration and return once new workers accept calls with it and the
        old ones no longer do (they finish the calls they carry). Until an old worker closes its
        listening socket it still takes new connections, and routes them by the old pool."""
        if self.process is None or self.process.poll() is not None:
            return
        before = self._workers()
        self.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout_s
        while not (self._workers() - before) and time.monotonic() < deadline:
            time.sleep(0.005)
        listening = _listening_sockets() & _sockets(self.process.pid)
        while any(_sockets(pid) & listening for pid in before) and time.monotonic() < deadline:
            time.sleep(0.005)

    def _workers(self) -> set[int]:
        children = pathlib.Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        try:
            return {int(pid) for pid in children.read_text().split()}
        except OSError:
            return set()

    def stop(self, graceful: bool) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        # SIGQUIT: finish the open calls, then exit; SIGTERM: now.
        self.process.send_signal(signal.SIGQUIT if graceful else signal.SIGTERM)
        try:
            self.process.wait(timeout=30 if graceful else 5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _command(self, flag: str | None, config: pathlib.Path, directives: str = "") -> list[str]:
        command = [
            self.binary,
            "-p",
            str(self.runtime_dir),
            "-c",
            str(config),
            "-e",
            str(self.runtime_dir / "error.log"),
        ]
        if directives:
            command += ["-g", directives]
        if flag:
            command.append(flag)
        return command


def _sockets(pid: int) -> set[str]:
    """The inodes of the sockets a process holds ({} once it exited)."""
    found = set()
    try:
        for fd in pathlib.Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                found.add(target[8:-1])
    except OSError:
        pass
    return found


def _listening_sockets() -> set[str]:
    """The inodes of this host's listening TCP sockets (state 0A in /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = pathlib.Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A":
                found.add(fields[9])
    return found


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


class HealthWatch:
    """Polls each replica's health and keeps nginx's pool to the replicas that answer SERVING."""

    def __init__(self, config: BalancerConfig, nginx: NginxProcess, interval_s: float, timeout_s: float) -> None:
        self.config = config
        self.nginx = nginx
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.healthy: set[str] = set()
        self._channels = {replica.name: grpc.aio.insecure_channel(replica.address) for replica in config.replicas}

    async def poll(self) -> set[str]:
        statuses = await asyncio.gather(*(self._check(replica) for replica in self.config.replicas))
        return {replica.name for replica, serving in zip(self.config.replicas, statuses, strict=True) if serving}

    async def _check(self, replica: Replica) -> bool:
        stub = health_pb2_grpc.HealthStub(self._channels[replica.name])
        try:
            answer = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=self.timeout_s)
        except grpc.RpcError:
            return False
        return answer.status == health_pb2.HealthCheckResponse.SERVING

    def apply(self, healthy: set[str]) -> None:
        if healthy == self.healthy:
            return
        joined, left = sorted(healthy - self.healthy), sorted(self.healthy - healthy)
        self.nginx.write(render_nginx_config(self.config, healthy, self.nginx.runtime_dir))
        self.nginx.reload()
        self.healthy = healthy
        log.info(
            "pool: %s (joined: %s; left: %s)",
            ", ".join(sorted(healthy)) or "empty",
            ", ".join(joined) or "-",
            ", ".join(left) or "-",
        )

    async def run(self) -> None:
        while True:
            self.apply(await self.poll())
            await asyncio.sleep(self.interval_s)

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self._channels.values()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="codecstream-balancer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--listen", default="127.0.0.1:50051", help="HOST:PORT nginx serves gRPC on")
    parser.add_argument(
        "--replica", action="append", default=[], metavar="NAME=HOST:PORT", help="a codecstream-server (repeat)"
    )
    parser.add_argument(
        "--gpus",
        metavar="all|0,1,...",
        help="start one codecstream-server per device here instead (replicas gpu0, gpu1, ...); "
        "its arguments follow `--`",
    )
    parser.add_argument(
        "--server", default="codecstream-server", help="with --gpus: the server program (default: on PATH)"
    )
    parser.add_argument(
        "--replica-port", type=int, default=50061, help="with --gpus: the first replica's gRPC port (then +1 each)"
    )
    parser.add_argument(
        "--replica-metrics-port",
        type=int,
        default=9101,
        help="with --gpus: the first replica's metrics port (then +1 each)",
    )
    parser.add_argument("--health-interval", type=float, default=0.5, metavar="SECONDS", help="poll period")
    parser.add_argument("--health-timeout", type=float, default=1.0, metavar="SECONDS", help="one check's limit")
    parser.add_argument("--runtime-dir", type=pathlib.Path, help="nginx's files (default: a temporary directory)")
    parser.add_argument("--nginx", default="nginx", help="the nginx binary (default: nginx on PATH)")
    parser.add_argument(
        "--print-config", action="store_true", help="print the nginx.conf (every replica in the pool) and exit"
    )
    return parser


def split_server_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """The balancer's arguments, and the replicas' after `--`."""
    if "--" not in argv:
        return argv, []
    index = argv.index("--")
    return argv[:index], argv[index + 1 :]


def parse_config(args: argparse.Namespace, server_args: list[str] | None = None) -> BalancerConfig:
    if bool(args.gpus) == bool(args.replica):
        raise BalancerError("give either --replica (replicas started elsewhere) or --gpus (started here)")
    if server_args and not args.gpus:
        raise BalancerError("server arguments after `--` need --gpus (the balancer starts no replica without it)")
    if args.gpus:
        try:
            check_server_args(server_args or [])
            specs = replica_specs(parse_gpus(args.gpus), args.replica_port, args.replica_metrics_port)
        except ReplicaSpecError as error:
            raise BalancerError(str(error)) from None
        if not all(0 < port < 65536 for spec in specs for port in (spec.port, spec.metrics_port)):
            raise BalancerError("--replica-port and --replica-metrics-port: every replica's port must be 1-65535")
        replicas = tuple(Replica(spec.name, spec.address) for spec in specs)
    else:
        specs = ()
        replicas = tuple(Replica.parse(text) for text in args.replica)
    for field in ("name", "address"):
        values = [getattr(replica, field) for replica in replicas]
        if len(set(values)) != len(values):
            raise BalancerError(f"--replica: every replica needs its own {field}")
    if not _ADDRESS.fullmatch(args.listen):
        raise BalancerError(f"--listen {args.listen[:80]!r}: expected HOST:PORT")
    if not 0.05 <= args.health_interval <= 60 or not 0.05 <= args.health_timeout <= 60:
        raise BalancerError("--health-interval and --health-timeout must be 0.05-60 seconds")
    return BalancerConfig(args.listen, replicas, specs)


async def supervise(supervisor: ReplicaSupervisor, interval_s: float) -> None:
    """Restart the replicas whose process exited, for as long as the balancer runs."""
    while True:
        supervisor.check()
        await asyncio.sleep(interval_s)


async def serve(
    config: BalancerConfig, nginx: NginxProcess, args: argparse.Namespace, supervisor: ReplicaSupervisor | None = None
) -> None:
    watch = HealthWatch(config, nginx, args.health_interval, args.health_timeout)
    # Start with the replicas that are serving now, so nginx never takes calls to a cold pool.
    watch.healthy = await watch.poll()
    nginx.write(render_nginx_config(config, watch.healthy, nginx.runtime_dir))
    nginx.start()
    log.info("nginx on %s, pool: %s", config.listen, ", ".join(sorted(watch.healthy)) or "empty")
    print(f"codecstream-balancer listening on {config.listen}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    poller = asyncio.create_task(watch.run())
    exited = asyncio.create_task(asyncio.to_thread(nginx.process.wait))
    stopped = asyncio.create_task(stop.wait())
    watched = {poller, exited, stopped}
    if supervisor is not None:
        watched.add(asyncio.create_task(supervise(supervisor, args.health_interval)))
    done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    for task in watched - {exited}:
        task.cancel()
    await watch.close()
    if exited in done:
        raise BalancerError(f"nginx exited with status {nginx.process.returncode}; see {nginx.runtime_dir}/error.log")
    for task in done - {exited, stopped}:
        if task.exception() is not None:
            nginx.stop(graceful=False)
            raise BalancerError(str(task.exception()))
    nginx.stop(graceful=True)


def main(argv: list[str] | None = None) -> int:
    own_args, server_args = split_server_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own_args)
    logging.basicConfig(level=logging.INFO, format=log_setup.FORMAT)
    try:
        config = parse_config(args, server_args)
        if args.print_config:
            directory = args.runtime_dir or pathlib.Path("/var/lib/codecstream-balancer")
            print(render_nginx_config(config, {replica.name for replica in config.replicas}, directory), end="")
            return 0
        # Debian puts nginx in /usr/sbin, which is not on every user's PATH.
        binary = shutil.which(args.nginx) or shutil.which(args.nginx, path="/usr/sbin:/usr/local/sbin")
        if binary is None:
            raise BalancerError(f"{args.nginx!r} not found: install nginx (Debian: apt-get install nginx)")
        try:
            server = find_server(args.server) if config.started_here else None
        except ReplicaSpecError as error:
            raise BalancerError(str(error)) from None
        runtime_dir = args.runtime_dir or pathlib.Path(tempfile.mkdtemp(prefix="codecstream-balancer-"))
        runtime_dir.mkdir(parents=True, exist_ok=True)
        nginx = NginxProcess(binary, runtime_dir.resolve())
        supervisor = None
        if config.started_here:
            supervisor = ReplicaSupervisor(server, config.started_here, server_args, nginx.runtime_dir)
        try:
            if supervisor is not None:
                supervisor.start_all()
            asyncio.run(serve(config, nginx, args, supervisor))
        finally:
            nginx.stop(graceful=False)
            if supervisor is not None:
                supervisor.stop_all()
    except BalancerError as error:
        print(f"codecstream-balancer: {error}", file=sys.stderr)
        return EXIT_STARTUP_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())

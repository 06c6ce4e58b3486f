"""`codecstream-server`: serve the codecstream.v1 contract from a model or a recorded codes file."""

from __future__ import annotations

import argparse
import asyncio
import logging
import pathlib
import signal
import sys

from codecstream.protocol.chunking import ChunkSchedule
from codecstream.protocol.errors import ProtocolError
from codecstream.server.app import CodecStreamServer, ServerOptions
from codecstream.server.auth import load_tokens
from codecstream.server.limits import ServerLimits
from codecstream.server.source import CodeSource

log = logging.getLogger("codecstream.server")


class StartupError(Exception):
    """A reason the server cannot start, printed as one line."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codecstream-server", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="Qwen3-TTS checkpoint: a local directory or a hub id")
    source.add_argument(
        "--replay", type=pathlib.Path, metavar="CODES_FILE", help="serve a recorded .npy/.npz codes file"
    )
    parser.add_argument(
        "--deploy-config",
        type=pathlib.Path,
        help="vLLM-Omni deploy YAML (default: the talker-only one for this machine)",
    )
    parser.add_argument(
        "--replay-fps", type=float, default=12.5, help="replay pace in frames per second; 0: as fast as possible"
    )
    parser.add_argument(
        "--replay-checkpoint", type=pathlib.Path, help="checkpoint whose decoder digest replayed streams announce"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    parser.add_argument("--port", type=int, default=50051, help="gRPC port (default 50051; 0 picks a free one)")
    parser.add_argument("--tls-cert", type=pathlib.Path, help="PEM certificate chain; enables TLS with --tls-key")
    parser.add_argument("--tls-key", type=pathlib.Path, help="PEM private key")
    parser.add_argument("--auth-token-file", type=pathlib.Path, help="file of accepted bearer tokens, one per line")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.add_argument("--max-text-chars", type=int, default=ServerLimits.max_text_chars)
    parser.add_argument("--max-frames", type=int, default=ServerLimits.max_frames)
    parser.add_argument(
        "--max-streams", type=int, default=ServerLimits.max_concurrent_streams, help="concurrent streams"
    )
    parser.add_argument(
        "--rate-limit", type=int, default=0, metavar="PER_MINUTE", help="streams per client per minute (0: off)"
    )
    parser.add_argument("--resume-window", type=float, default=ServerLimits.resume_window_s, metavar="SECONDS")
    parser.add_argument(
        "--chunking", default=",".join(map(str, ChunkSchedule().sizes)), help="default chunk sizes, e.g. 2,4,8,16,25"
    )
    parser.add_argument("--shutdown-grace", type=float, default=10.0, metavar="SECONDS")
    parser.add_argument("--port-file", type=pathlib.Path, help="write the bound port here once serving (for scripts)")
    parser.add_argument("--log-level", default="INFO")
    return parser


def build_source(args: argparse.Namespace) -> CodeSource:
    if args.replay is not None:
        from codecstream.server.replay import ReplaySource

        try:
            return ReplaySource.from_file(args.replay, args.replay_fps, args.replay_checkpoint)
        except (ProtocolError, ValueError, OSError) as error:
            raise StartupError(str(error)) from None
    try:
        from codecstream.server.engine.talker_source import VllmTalkerSource
    except ImportError as error:
        raise StartupError(
            f"the vLLM-Omni engine is not installed ({error}); install it with scripts/setup-dev-env (docs/server.md)"
        ) from None
    return VllmTalkerSource.create(args.model, args.deploy_config)


def build_options(args: argparse.Namespace) -> ServerOptions:
    try:
        chunking = ChunkSchedule.parse(args.chunking)
        tokens = load_tokens(args.auth_token_file) if args.auth_token_file else frozenset()
    except (ProtocolError, ValueError, OSError) as error:
        raise StartupError(str(error)) from None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise StartupError("TLS needs both --tls-cert and --tls-key")
    limits = ServerLimits(
        max_text_chars=args.max_text_chars,
        max_frames=args.max_frames,
        max_concurrent_streams=args.max_streams,
        streams_per_client_per_minute=args.rate_limit,
        resume_window_s=args.resume_window,
        default_chunking=chunking,
    )
    return ServerOptions(
        host=args.host,
        port=args.port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        auth_tokens=tokens,
        metrics_port=args.metrics_port,
        limits=limits,
        shutdown_grace_s=args.shutdown_grace,
    )


async def serve(args: argparse.Namespace) -> None:
    options = build_options(args)
    source = build_source(args)
    await source.start()
    server = CodecStreamServer(source, options)
    try:
        port = await server.start()
    except (OSError, ValueError, RuntimeError) as error:
        raise StartupError(f"cannot serve on {options.host}:{options.port}: {error}") from None
    if args.port_file:
        args.port_file.write_text(str(port))
    print(f"codecstream-server: serving {source.model_name} on {options.host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("codecstream-server: shutting down (draining streams)", flush=True)
    await server.stop()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(args))
    except StartupError as error:
        print(f"codecstream-server: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

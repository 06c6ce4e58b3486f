"""`codecstream-server`: serve the codecstream.v1 contract from a model or a recorded codes file.

Exit status: 0 after a signal-initiated shutdown; 1 when the server cannot start (one line on
stderr says why, and nothing is left running); 2 for a usage error; 3 when the engine failed and
could not be restarted (a process supervisor should start the server again).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import pathlib
import signal
import sys

from codecstream.protocol.chunking import ChunkSchedule
from codecstream.protocol.decoding import FRAMES_PER_SECOND
from codecstream.protocol.errors import ProtocolError
from codecstream.server import log_setup
from codecstream.server.app import CodecStreamServer, Keepalive, ServerOptions
from codecstream.server.auth import load_tokens
from codecstream.server.checkpoint_info import ModelDirectoryError
from codecstream.server.engine import engine_process
from codecstream.server.engine.engine_cache import default_engine_cache
from codecstream.server.errors import one_line
from codecstream.server.limits import OutOfRange, ServerLimits
from codecstream.server.replay import ReplaySource
from codecstream.server.source import CodeSource
from codecstream.server.supervisor import RestartPolicy

log = logging.getLogger("codecstream.server")

EXIT_STARTUP_FAILED = 1
EXIT_ENGINE_FAILED = 3


class StartupError(Exception):
    """A reason the server cannot start, printed as one line."""


def build_parser() -> argparse.ArgumentParser:
    # Every default is the library's own (ServerOptions and what it holds), never restated here.
    options = ServerOptions()
    limits, keepalive, restarts = options.limits, options.keepalive, options.restart_policy
    parser = argparse.ArgumentParser(
        prog="codecstream-server", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
        "--engine-cache",
        type=pathlib.Path,
        default=default_engine_cache(),
        metavar="DIR",
        help="where the engine keeps what it compiles (torch.compile/AOT, Triton, FlashInfer) for later starts "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--replay-fps",
        type=float,
        default=FRAMES_PER_SECOND,
        help=f"replay pace in frames per second (default {FRAMES_PER_SECOND:g}); 0: as fast as possible",
    )
    parser.add_argument(
        "--replay-checkpoint",
        type=pathlib.Path,
        help="checkpoint whose decoder digest, voices and languages replayed streams announce",
    )
    parser.add_argument(
        "--host", default=options.host, help=f"address to bind (default {options.host}; 0.0.0.0 for all)"
    )
    parser.add_argument(
        "--port", type=int, default=options.port, help=f"gRPC port (default {options.port}; 0 picks a free one)"
    )
    parser.add_argument("--tls-cert", type=pathlib.Path, help="PEM certificate chain; enables TLS with --tls-key")
    parser.add_argument("--tls-key", type=pathlib.Path, help="PEM private key")
    parser.add_argument("--auth-token-file", type=pathlib.Path, help="file of accepted bearer tokens, one per line")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.add_argument("--max-text-chars", type=int, default=limits.max_text_chars)
    parser.add_argument("--max-instructions-chars", type=int, default=limits.max_instructions_chars)
    parser.add_argument(
        "--max-reference-seconds",
        type=float,
        default=limits.max_reference_audio_s,
        metavar="SECONDS",
        help="longest voice-clone reference audio",
    )
    parser.add_argument("--max-frames", type=int, default=limits.max_frames)
    parser.add_argument("--max-streams", type=int, default=limits.max_concurrent_streams, help="concurrent streams")
    parser.add_argument(
        "--rate-limit",
        type=int,
        default=limits.streams_per_client_per_minute,
        metavar="PER_MINUTE",
        help="streams per client per minute (0: off)",
    )
    parser.add_argument(
        "--max-streams-per-client",
        type=int,
        default=limits.max_streams_per_client,
        metavar="N",
        help="streams one client (token, or address) may hold at once (0: no limit; behind a proxy that "
        "hides client addresses, give clients tokens or raise it)",
    )
    parser.add_argument(
        "--max-engine-requests-per-client",
        type=int,
        default=None,
        metavar="N",
        help="streams one client may hold on the engine (default: half its max_num_seqs; 0: no share)",
    )
    parser.add_argument(
        "--max-engine-wait",
        type=float,
        default=limits.max_engine_wait_s,
        metavar="SECONDS",
        help="a streamed text the engine holds a request for ends after this long without text",
    )
    parser.add_argument(
        "--max-downloads-per-client",
        type=int,
        default=limits.max_downloads_per_client,
        metavar="N",
        help="decoder downloads one client may hold at once (0: no limit)",
    )
    parser.add_argument(
        "--max-downloads",
        type=int,
        default=limits.max_concurrent_downloads,
        metavar="N",
        help="decoder downloads sent at once; more wait for a slot",
    )
    parser.add_argument("--resume-window", type=float, default=limits.resume_window_s, metavar="SECONDS")
    parser.add_argument(
        "--stalled-client-timeout",
        type=float,
        default=limits.stalled_client_timeout_s,
        metavar="SECONDS",
        help="drop a call whose client reads nothing for this long",
    )
    parser.add_argument(
        "--keepalive",
        type=float,
        default=keepalive.time_s,
        metavar="SECONDS",
        help=f"ping idle connections this often; no answer within {keepalive.timeout_s:g} s drops them",
    )
    parser.add_argument(
        "--engine-restarts",
        type=int,
        default=restarts.max_attempts,
        metavar="N",
        help="restart attempts in a row after an engine failure before exiting with status 3 (0: exit at once)",
    )
    parser.add_argument(
        "--chunking",
        default=",".join(map(str, limits.default_chunking.sizes)),
        help="default chunk sizes, e.g. 2,4,8,16,25",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        default=options.shutdown_grace_s,
        metavar="SECONDS",
        help="running streams' time to finish",
    )
    parser.add_argument(
        "--drain-delay",
        type=float,
        default=options.drain_delay_s,
        metavar="SECONDS",
        help="on SIGTERM, answer NOT_SERVING but keep taking new streams this long (behind a balancer)",
    )
    parser.add_argument(
        "--streamed-text",
        choices=("grow", "segments"),
        default="grow",
        help="streamed text (TextInput) as one talker request that grows as the text arrives, or as one "
        "request per sentence or clause (the engine falls back to segments where it cannot grow)",
    )
    parser.add_argument(
        "--decoder-artifact",
        type=pathlib.Path,
        action="append",
        default=[],
        metavar="DIR",
        help="offer this `codecstream export-decoder` directory to clients for download (repeatable; "
        "it must be exported from the served checkpoint)",
    )
    parser.add_argument("--port-file", type=pathlib.Path, help="write the bound port here once serving (for scripts)")
    parser.add_argument("--log-level", default="INFO")
    return parser


def build_source(args: argparse.Namespace, limits: ServerLimits) -> CodeSource:
    """The code source the flags name, checked (files, checkpoint, engine installed) but not
    started; an engine warms up under `limits`, those the server serves with."""
    if args.replay is not None:
        try:
            return ReplaySource.from_file(args.replay, args.replay_fps, args.replay_checkpoint)
        except OutOfRange as error:
            raise out_of_range(error) from None
        except (ProtocolError, ValueError, OSError) as error:
            raise StartupError(str(error)) from None
    try:
        from codecstream.server.engine.talker_source import VllmTalkerSource

        return VllmTalkerSource(
            args.model,
            args.deploy_config,
            grow_streamed_text=args.streamed_text == "grow",
            engine_cache=args.engine_cache,
            limits=limits,
        )
    except ImportError as error:
        raise StartupError(
            f"the vLLM-Omni engine is not installed ({error}); install it with scripts/setup-dev-env (docs/server.md)"
        ) from None
    except (ModelDirectoryError, OSError, ValueError) as error:
        raise StartupError(one_line(error, limit=None)) from None  # read once, whole, at start-up


#: The flags that set a ServerLimits field (field -> argparse dest); ServerLimits checks their ranges.
LIMIT_FLAGS = {
    "max_text_chars": "max_text_chars",
    "max_instructions_chars": "max_instructions_chars",
    "max_reference_audio_s": "max_reference_seconds",
    "max_frames": "max_frames",
    "max_concurrent_streams": "max_streams",
    "max_streams_per_client": "max_streams_per_client",
    "streams_per_client_per_minute": "rate_limit",
    "max_engine_requests_per_client": "max_engine_requests_per_client",
    "max_engine_wait_s": "max_engine_wait",
    "max_downloads_per_client": "max_downloads_per_client",
    "max_concurrent_downloads": "max_downloads",
    "resume_window_s": "resume_window",
    "stalled_client_timeout_s": "stalled_client_timeout",
}
#: The flags that set a field of what else the server is built from, each checked where it is made.
OTHER_FLAGS = {
    "port": "port",
    "shutdown_grace_s": "shutdown_grace",
    "drain_delay_s": "drain_delay",
    "time_s": "keepalive",  # Keepalive
    "max_attempts": "engine_restarts",  # RestartPolicy
    "frames_per_second": "replay_fps",  # ReplaySource
}


def out_of_range(error: OutOfRange) -> StartupError:
    """The error of a setting out of its range, naming the flag that set it."""
    flag = "--" + {**LIMIT_FLAGS, **OTHER_FLAGS}[error.name].replace("_", "-")
    return StartupError(f"{flag} must be {error.rule}, got {error.value:g}")


def build_options(args: argparse.Namespace) -> ServerOptions:
    try:
        chunking = ChunkSchedule.parse(args.chunking)
        tokens = load_tokens(args.auth_token_file) if args.auth_token_file else frozenset()
    except (ProtocolError, ValueError, OSError) as error:
        raise StartupError(str(error)) from None
    try:
        limits = ServerLimits(
            default_chunking=chunking, **{field: getattr(args, dest) for field, dest in LIMIT_FLAGS.items()}
        )
        return ServerOptions(
            host=args.host,
            port=args.port,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            auth_tokens=tokens,
            metrics_port=args.metrics_port,
            limits=limits,
            keepalive=Keepalive(time_s=args.keepalive),
            restart_policy=RestartPolicy(max_attempts=args.engine_restarts),
            shutdown_grace_s=args.shutdown_grace,
            drain_delay_s=args.drain_delay,
            decoder_artifacts=tuple(args.decoder_artifact),
        )
    except OutOfRange as error:
        raise out_of_range(error) from None
    except ValueError as error:  # half a TLS pair
        raise StartupError(str(error)) from None


async def _finished_before(task: asyncio.Future, event: asyncio.Event) -> bool:
    """Wait for `task` or `event`, whichever comes first; True if the task finished (it is
    cancelled otherwise)."""
    waiter = asyncio.ensure_future(event.wait())
    done, _ = await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    for pending in (task, waiter):
        if pending not in done:
            pending.cancel()
    await asyncio.gather(task, waiter, return_exceptions=True)
    return task in done


async def serve(args: argparse.Namespace) -> int:
    options = build_options(args)
    source = build_source(args, options.limits)
    server = CodecStreamServer(source, options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        starting = asyncio.ensure_future(server.start())
        if not await _finished_before(starting, stop):
            print("codecstream-server: stopped while starting", flush=True)
            return 0
        if starting.exception() is not None:  # BindError, a TLS ValueError or SourceStartError: one line each
            raise StartupError(str(starting.exception())) from None
        if args.port_file:
            args.port_file.write_text(str(server.port))
        print(f"codecstream-server: serving {source.model_name} on {options.host}:{server.port}", flush=True)
        gave_up = asyncio.ensure_future(server.wait_until_source_gave_up())
        if await _finished_before(gave_up, stop):
            print("codecstream-server: error: the engine failed and could not be restarted", file=sys.stderr)
            return EXIT_ENGINE_FAILED
        print("codecstream-server: shutting down (draining streams)", flush=True)
        return 0
    finally:
        await server.stop()
        # After the engine's processes, before the last line on stderr (the reason, if any).
        engine_process.stop_forkserver()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format=log_setup.FORMAT)
    try:
        return asyncio.run(serve(args))
    except StartupError as error:
        print(f"codecstream-server: error: {error}", file=sys.stderr)
        return EXIT_STARTUP_FAILED


if __name__ == "__main__":
    sys.exit(main())

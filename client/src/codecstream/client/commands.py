"""The client's own commands: `info` (what a server offers) and `record` (save a stream's codes)."""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

import numpy as np
from codecstream.client.client import DEFAULT_TARGET, Client
from codecstream.protocol.codes_file import save_codes_file
from codecstream.protocol.decoding import NUM_CODEBOOKS
from codecstream.v1 import synthesis_pb2 as pb


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server", default=DEFAULT_TARGET, help=f"HOST:PORT of a codecstream server (default {DEFAULT_TARGET})"
    )
    parser.add_argument(
        "--tls",
        nargs="?",
        const=True,
        default=False,
        metavar="ROOT_CERT",
        help="use TLS (optionally with a PEM root certificate)",
    )
    parser.add_argument("--token", help="bearer token, if the server requires one")


def add_request_arguments(
    parser: argparse.ArgumentParser,
    *,
    text_option: bool = False,
    seed: int | None = None,
    chunking: Sequence[int] | None = None,
    text_help: str = "text to speak",
) -> None:
    """The request flags every command that starts a stream shares (say, record, parity e2e).

    `text_option`: the text is `--text TEXT` instead of a positional argument; `seed`, `chunking`:
    the command's defaults (None: the server's)."""
    if text_option:
        parser.add_argument("--text", required=True, help="text to speak")
    else:
        parser.add_argument("text", help=text_help)
    parser.add_argument("--voice", default="", help="speaker (see `codecstream info`)")
    parser.add_argument("--language", default="", help="language of the text (default: detected)")
    parser.add_argument(
        "--instructions", default="", help="style instructions, or the voice description for VoiceDesign"
    )
    parser.add_argument("--task-type", default="CustomVoice", choices=["CustomVoice", "VoiceDesign", "Base"])
    parser.add_argument("--reference-audio", type=pathlib.Path, help="WAV/FLAC to clone (task type Base)")
    parser.add_argument("--reference-text", default="", help="what the reference audio says")
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--max-frames", type=int, default=0)
    parser.add_argument(
        "--chunking",
        default=",".join(map(str, chunking)) if chunking else None,
        help="chunk sizes in frames, e.g. 2,4,8,16,25",
    )


def request_options(args: argparse.Namespace) -> dict:
    options = {
        "voice": args.voice,
        "language": args.language,
        "instructions": args.instructions,
        "task_type": args.task_type,
        "seed": args.seed,
        "max_frames": args.max_frames,
    }
    if args.reference_audio:
        options["reference_audio"] = args.reference_audio.read_bytes()
        options["reference_text"] = args.reference_text
    if args.chunking:
        options["chunking"] = [int(part) for part in args.chunking.split(",")]
    return options


def connect(args: argparse.Namespace) -> Client:
    return Client(args.server, tls=args.tls, token=args.token)


def run_info(args: argparse.Namespace) -> int:
    with connect(args) as client:
        info = client.codec_info()
        voices = client.voices()
    codec = info.codec
    print(f"state            {serving_state(info)}")
    print(f"model            {info.model} (server {info.server_version})")
    print(
        f"codec            {codec.codec_name} {codec.codec_version}: {codec.num_codebooks} x {codec.codebook_size}, "
        f"{codec.sample_rate_hz} Hz, {codec.samples_per_frame} samples/frame, "
        f"context {codec.decoder_left_context_frames}"
    )
    print(f"decoder digest   {codec.decoder_digest}")
    print(f"task types       {', '.join(pb.TaskType.Name(t).removeprefix('TASK_TYPE_') for t in info.task_types)}")
    print(f"languages        {', '.join(info.languages)}")
    print(f"voices           {', '.join(v.name for v in voices)}")
    print(
        f"limits           {info.max_text_chars} chars, {info.max_frames} frames, "
        f"resume window {info.resume_window_ms} ms"
    )
    return 0


def serving_state(info: pb.GetCodecInfoResponse) -> str:
    """Whether the server takes new streams, as `info` says it; an older server does not say."""
    if info.serving_state == pb.SERVING_STATE_SERVING:
        return "serving"
    if info.serving_state == pb.SERVING_STATE_NOT_SERVING:
        return f"not serving: {info.not_serving_reason} (new streams are refused until it serves)"
    return f"not stated (server {info.server_version} does not say; its gRPC health does)"


def run_record(args: argparse.Namespace) -> int:
    with connect(args) as client:
        stream = client.stream_codes(args.text, **request_options(args))
        chunks = [chunk.codes for chunk in stream]
    codes = np.concatenate(chunks) if chunks else np.zeros((0, NUM_CODEBOOKS), np.int16)
    save_codes_file(args.out, codes, stream.reference_codes if args.out.suffix == ".npz" else None)
    reason = pb.EndReason.Name(stream.end.reason).removeprefix("END_REASON_")
    print(f"{len(codes)} frames in {len(chunks)} chunks ({reason}) -> {args.out}", file=sys.stderr)
    return 0


def register_info(subparsers) -> None:
    parser = subparsers.add_parser("info", help="show a server's codec, voices, languages and limits")
    add_connection_arguments(parser)
    parser.set_defaults(handler=run_info)


def register_record(subparsers) -> None:
    parser = subparsers.add_parser(
        "record", help="save the codes of one stream to a .npz/.npy file (for replay and parity)"
    )
    add_connection_arguments(parser)
    add_request_arguments(parser)
    parser.add_argument(
        "--out", type=pathlib.Path, required=True, help="codes file to write (.npz keeps reference codes)"
    )
    parser.set_defaults(handler=run_record)

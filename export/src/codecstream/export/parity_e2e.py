"""`codecstream parity e2e`: a live stream decoded by the client vs the reference decode of the same codes.

    codecstream parity e2e --server 127.0.0.1:50051 --text "Hello there." \\
        --decoder artifacts/decoder-onnx --checkpoint checkpoints/tiny --json e2e.json --plot e2e.png

The client's decoder runs exactly as in an app (chunks as they arrive, decoded on the decode
thread, primed with voice-clone reference codes); its PCM is compared with one full-utterance
decode of the codes the stream carried. Parity always compares decoders on the same codes: two
deployments sample different tokens, so their audio is not comparable. The codecstream.v1 contract
carries codes only, so there is no server-decoded PCM to add to the comparison.
"""

from __future__ import annotations

import argparse
import pathlib
import platform

import numpy as np
from codecstream.client import Client
from codecstream.client.command_error import CommandError
from codecstream.client.commands import add_connection_arguments, add_request_arguments, request_options
from codecstream.client.runtimes import BACKENDS, DecoderLoadError, open_decoder
from codecstream.export.cli import EXIT_ERROR
from codecstream.export.parity import ParityReport, reference_decode
from codecstream.export.parity_cli import publish, reference_model, toolchain_versions
from codecstream.protocol.chunking import DEFAULT_RAMP
from codecstream.protocol.codes_file import save_codes_file
from codecstream.protocol.digest import DigestError, decoder_digest
from codecstream.v1 import synthesis_pb2 as pb


def register_e2e(checks) -> None:
    parser = checks.add_parser(
        "e2e",
        help="stream from a server, decode on this client, and compare with the reference decode of the same codes",
        description=__doc__.split("\n\n")[2].replace("\n", " "),
    )
    add_connection_arguments(parser)
    add_request_arguments(parser, text_option=True, seed=0, chunking=DEFAULT_RAMP)
    parser.add_argument(
        "--decoder",
        type=pathlib.Path,
        required=True,
        metavar="DIR",
        help="the client's decoder: artifact or checkpoint",
    )
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True, metavar="CKPT",
                        help="the checkpoint the server runs (its full decode is the reference)")  # fmt: skip
    parser.add_argument(
        "--threshold-db", type=float, default=40.0, metavar="DB", help="lowest passing SNR (default 40)"
    )
    parser.add_argument(
        "--save-codes", type=pathlib.Path, metavar="FILE.npz", help="keep the stream's codes (for replay)"
    )
    parser.add_argument("--json", type=pathlib.Path, metavar="OUT")
    parser.add_argument("--plot", type=pathlib.Path, metavar="OUT.png")
    parser.set_defaults(handler=run_e2e_parity)


def run_e2e_parity(args: argparse.Namespace) -> int:
    try:
        decoder = open_decoder(args.decoder, backend=args.backend)
        digest = decoder_digest(args.checkpoint)
    except (DecoderLoadError, DigestError) as error:
        raise CommandError(str(error), EXIT_ERROR) from None
    if decoder.codec.decoder_digest != digest:
        raise CommandError(
            f"{args.decoder} decodes other weights ({decoder.codec.decoder_digest}) than {args.checkpoint} ({digest})",
            EXIT_ERROR,
        )
    model = reference_model(args.checkpoint)
    with Client(args.server, tls=args.tls, token=args.token) as client:
        stream = client.synthesize(args.text, decoder=decoder, **request_options(args))
        chunks = list(stream)
    if not chunks:
        raise CommandError(
            f"the stream carried no audio (End reason {pb.EndReason.Name(stream.end.reason)})", EXIT_ERROR
        )
    codes = np.concatenate([chunk.codes for chunk in chunks])
    reference_codes = stream.reference_codes
    if args.save_codes:
        save_codes_file(args.save_codes, codes, reference_codes if args.save_codes.suffix == ".npz" else None)
    report = ParityReport(
        reference=reference_decode(model, codes, reference_codes),
        decoded=np.concatenate([chunk.samples for chunk in chunks]),
        chunk_frames=[chunk.num_frames for chunk in chunks],
        samples_per_frame=decoder.samples_per_frame,
        sample_rate=decoder.sample_rate,
        threshold_db=args.threshold_db,
        decode_seconds=[chunk.decode_s for chunk in chunks],
    )
    stats = stream.stats
    report.details = {
        "check": "e2e",
        "server": args.server,
        "stream_id": stream.header.stream_id,
        "end_reason": pb.EndReason.Name(stream.end.reason),
        "reference_frames": len(reference_codes),
        "decoder": {
            "backend": decoder.backend,
            "mode": decoder.mode,
            "dtype": decoder.dtype,
            "description": decoder.description,
        },
        "decoder_digest": digest,
        "reference": "full-utterance decode of the same codes (codecstream.decoder, fp32, eager)",
        "server_decoded_pcm": "not offered: the codecstream.v1 contract carries codes only",
        "stream": {
            "time_to_first_chunk_ms": round(stats.time_to_first_chunk_s * 1000, 1),
            "time_to_first_audio_ms": round(stats.time_to_first_audio_s * 1000, 1),
            "decode_rtf": round(stats.decode_rtf, 4),
            "wire_bytes_per_audio_second": round(stats.wire_bytes_per_audio_second, 1),
        },
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "versions": toolchain_versions(),
        "command": args.command_line,
    }
    print(f"stream     {stream.header.stream_id}: {len(codes)} frames in {len(chunks)} chunks, "
          f"first audio after {stats.time_to_first_audio_s * 1000:.0f} ms")  # fmt: skip
    print(f"decoder    {decoder.description}")
    return publish(report, args.json, args.plot, f"parity e2e: {decoder.description}")

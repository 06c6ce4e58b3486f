"""`codecstream parity decoder`: an artifact streamed in a chunk schedule vs the full-utterance decode.

    codecstream parity decoder --artifact artifacts/decoder --checkpoint Qwen3-TTS \\
        --frames 250 --seed 0 --chunking 2,4,8,16,25 --json parity.json --plot parity.png
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
from importlib.metadata import PackageNotFoundError, version

import numpy as np
from codecstream.client.command_error import CommandError
from codecstream.client.runtimes import BACKENDS, DecoderLoadError, open_decoder
from codecstream.export.cli import EXIT_ERROR
from codecstream.export.parity import ParityReport, decoder_parity
from codecstream.protocol.chunking import DEFAULT_RAMP, ChunkSchedule
from codecstream.protocol.codes_file import load_codes_file
from codecstream.protocol.decoding import CODEBOOK_SIZE, NUM_CODEBOOKS
from codecstream.protocol.digest import DigestError, decoder_digest
from codecstream.protocol.errors import ProtocolError

EXIT_BELOW_THRESHOLD = 1


def register_decoder(checks) -> None:
    parser = checks.add_parser(
        "decoder",
        help="decode the same codes with an artifact (streamed) and with the reference full-utterance decode",
        description="Decode codes with the artifact, streamed in the chunk schedule, and with the checkpoint's "
        "full-utterance decode; print and write SNR, max errors and per-chunk SNR. Exit 1 below the threshold.",
    )
    parser.add_argument(
        "--artifact",
        type=pathlib.Path,
        required=True,
        metavar="DIR",
        help="artifact directory (manifest.json), or a checkpoint directory for the eager torch decoder",
    )
    parser.add_argument(
        "--checkpoint",
        type=pathlib.Path,
        required=True,
        metavar="CKPT",
        help="the checkpoint the artifact was exported from (its full decode is the reference)",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--codes", type=pathlib.Path, metavar="FILE", help="codes file (.npy/.npz, e.g. from `codecstream record`)"
    )
    source.add_argument(
        "--frames", type=int, default=250, metavar="N", help="random codes: number of frames (default 250)"
    )
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="random codes: seed (default 0)")
    parser.add_argument(
        "--chunking",
        default=",".join(map(str, DEFAULT_RAMP)),
        metavar="SIZES",
        help="chunk sizes in frames, the last repeating (default %(default)s)",
    )
    parser.add_argument(
        "--threshold-db", type=float, default=40.0, metavar="DB", help="lowest passing SNR (default 40)"
    )
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="runtime to use (default: auto)")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads for the runtime")
    parser.add_argument("--json", type=pathlib.Path, metavar="OUT", help="write the report as JSON")
    parser.add_argument(
        "--plot", type=pathlib.Path, metavar="OUT.png", help="write waveforms and error over time as PNG"
    )
    parser.set_defaults(handler=run_decoder_parity)


def run_decoder_parity(args: argparse.Namespace) -> int:
    try:
        schedule = ChunkSchedule.parse(args.chunking)
        codes, reference_codes, codes_source = _codes(args)
        decoder = open_decoder(args.artifact, backend=args.backend, threads=args.threads)
        digest = decoder_digest(args.checkpoint)
    except (DecoderLoadError, ProtocolError, DigestError) as error:
        raise CommandError(str(error), EXIT_ERROR) from None
    if decoder.codec.decoder_digest != digest:
        raise CommandError(
            f"{args.artifact} was exported from other decoder weights ({decoder.codec.decoder_digest}) "
            f"than {args.checkpoint} ({digest}): parity against it means nothing",
            EXIT_ERROR,
        )
    model = reference_model(args.checkpoint)
    report = decoder_parity(decoder, model, codes, schedule, reference_codes, args.threshold_db)
    report.details = {
        "check": "decoder",
        "artifact": str(args.artifact),
        "checkpoint": str(args.checkpoint),
        "decoder": {
            "backend": decoder.backend,
            "mode": decoder.mode,
            "dtype": decoder.dtype,
            "max_chunk_frames": decoder.max_chunk_frames,
            "description": decoder.description,
        },
        "decoder_digest": digest,
        "reference": "full-utterance decode (codecstream.decoder, fp32, eager)",
        "codes": codes_source,
        "chunking": list(schedule.sizes),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "threads": args.threads,
        },
        "versions": toolchain_versions(),
        "command": args.command_line,
    }
    print(f"decoder    {decoder.description}")
    print(f"codes      {codes_source['frames']} frames ({codes_source['source']}), chunks {args.chunking}")
    return publish(report, args.json, args.plot, f"parity decoder: {decoder.description}")


def publish(report: ParityReport, json_path: pathlib.Path | None, plot_path: pathlib.Path | None, title: str) -> int:
    """Print the verdict, write the JSON and PNG asked for; the exit code says pass or fail."""
    print(f"result     {report.summary()}")
    if json_path:
        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        print(f"json       {json_path}")
    if plot_path:
        from codecstream.export.parity_plot import plot_parity

        plot_parity(report, plot_path, title)
        print(f"plot       {plot_path}")
    return 0 if report.passed else EXIT_BELOW_THRESHOLD


def _codes(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray | None, dict]:
    if args.codes:
        loaded = load_codes_file(args.codes)
        source = {
            "source": str(args.codes),
            "frames": len(loaded.codes),
            "reference_frames": len(loaded.reference_codes),
        }
        return loaded.codes, loaded.reference_codes, source
    if args.frames < 1:
        raise ProtocolError(f"--frames {args.frames}: expected at least 1 frame")
    codes = np.random.default_rng(args.seed).integers(
        0, CODEBOOK_SIZE, size=(args.frames, NUM_CODEBOOKS), dtype=np.int16
    )
    return codes, None, {"source": "random", "seed": args.seed, "frames": args.frames, "reference_frames": 0}


def reference_model(checkpoint: pathlib.Path):
    try:
        from codecstream.decoder import CheckpointError, load_decoder
    except ImportError as error:
        raise CommandError(f"the reference decoder needs codecstream-decoder and torch ({error})", EXIT_ERROR) from None
    try:
        return load_decoder(checkpoint)
    except CheckpointError as error:
        raise CommandError(str(error), EXIT_ERROR) from None


def toolchain_versions() -> dict[str, str]:
    found = {}
    for name in ("codecstream-export", "torch", "onnxruntime", "executorch", "numpy"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found

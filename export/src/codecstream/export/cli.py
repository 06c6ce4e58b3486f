"""`codecstream export-decoder` and the `codecstream parity` command group.

`parity` is a group: its checks register through the `codecstream.parity` entry-point group, each
a function `register(subparsers)` that adds one sub-parser with `handler(args) -> int` (exactly
like `codecstream.commands`). This distribution registers `parity decoder` and `parity e2e` that
way, and any other distribution can add a check beside them by declaring, for example,

    [project.entry-points."codecstream.parity"]
    loudness = "mypackage.parity_loudness:register"

`register_parity` also returns the group's sub-parsers, for callers that build the parser themselves.

Exit status of the parity checks: 0 at or above the threshold, 1 below it, 2 when the check could
not run (bad arguments, unreadable artifact, checkpoint or codes, missing runtime).
"""

from __future__ import annotations

import argparse
import pathlib

from codecstream.client.cli import add_entry_point_commands
from codecstream.client.command_error import CommandError
from codecstream.export.errors import ExportError
from codecstream.export.exporter import (
    CHECK_FLOOR_DB,
    DEFAULT_MAX_CHUNK_FRAMES,
    STAGES,
    ExportRequest,
    export_decoder,
)
from codecstream.export.progress import Progress
from codecstream.protocol.digest import digest_label
from codecstream.protocol.manifest import ARTIFACT_DTYPES, ARTIFACT_FORMATS, ARTIFACT_MODES, Manifest

PARITY_GROUP = "codecstream.parity"
#: Exit status when a command could not do its job (as opposed to a parity check that failed).
EXIT_ERROR = 2


def register_export_decoder(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-decoder",
        help="export the checkpoint's speech-tokenizer decoder as a .pt2 / .pte / .onnx artifact with a manifest",
        description="Export the decoder of a Qwen3-TTS checkpoint (or its speech_tokenizer/ directory) into an "
        "artifact directory: the graph file and manifest.json. Several formats of one graph can share a directory.",
    )
    parser.add_argument(
        "checkpoint", type=pathlib.Path, help="Qwen3-TTS model directory or its speech_tokenizer/ directory"
    )
    parser.add_argument(
        "--format",
        required=True,
        choices=ARTIFACT_FORMATS,
        help="pt2 (torch.export), pte (ExecuTorch + XNNPACK), onnx (ONNX Runtime)",
    )
    parser.add_argument(
        "--mode",
        default=ARTIFACT_MODES[0],
        choices=ARTIFACT_MODES,
        help="stateful (exact, default) or windowed (72-frame window)",
    )
    parser.add_argument(
        "--dtype",
        default="fp32",
        choices=sorted({dtype for dtypes in ARTIFACT_DTYPES.values() for dtype in dtypes}),
        help="fp32 (default); int8 for pte and onnx (dynamic quantization); bf16 or bf16-mixed (bf16 matrix "
        "products, fp32 activations and state) for pt2",
    )
    parser.add_argument(
        "--max-chunk-frames",
        type=int,
        default=DEFAULT_MAX_CHUNK_FRAMES,
        metavar="N",
        help=f"largest chunk one call decodes (default {DEFAULT_MAX_CHUNK_FRAMES}); longer inputs are split",
    )
    parser.add_argument("--out", type=pathlib.Path, required=True, metavar="DIR", help="artifact directory to write")
    parser.add_argument(
        "--min-check-db",
        type=float,
        metavar="DB",
        help="refuse the artifact when its export check (SNR against the eager decoder) is below this "
        f"(default by dtype: {', '.join(f'{dtype} {floor:g}' for dtype, floor in CHECK_FLOOR_DB.items())})",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.set_defaults(handler=run_export_decoder)


def run_export_decoder(args: argparse.Namespace) -> int:
    request = ExportRequest(
        args.checkpoint, args.format, args.mode, args.dtype, args.max_chunk_frames, args.out, args.min_check_db
    )
    try:
        manifest = export_decoder(request, Progress(total=STAGES, enabled=not args.quiet))
    except ExportError as error:
        raise CommandError(str(error), EXIT_ERROR) from None
    print(artifact_summary(args.out, manifest, args.format))
    return 0


def artifact_summary(directory: pathlib.Path, manifest: Manifest, fmt: str) -> str:
    """One line on an exported artifact; its file's sha256 and the decoder digest are named apart."""
    entry = manifest.artifacts[fmt]
    check = entry.export_check or {}
    return (
        f"{directory / entry.file}: {manifest.mode} {manifest.dtype}, chunks 1..{manifest.max_chunk_frames} frames, "
        f"{entry.size_bytes / 1e6:.1f} MB, file {entry.sha256[:23]}…, "
        f"{digest_label(manifest.codec['decoder_digest'])}, export check {check.get('snr_db', 'skipped')} dB"
    )


def register_parity(subparsers) -> argparse._SubParsersAction:
    """Add `parity` and every check of the `codecstream.parity` entry-point group; returns the
    group's sub-parsers so a caller can add checks directly too."""
    parser = subparsers.add_parser("parity", help="show with numbers that a decoder reproduces the reference audio")
    checks = parser.add_subparsers(dest="check", required=True, metavar="CHECK")
    add_entry_point_commands(checks, PARITY_GROUP, prefix="parity ")
    return checks

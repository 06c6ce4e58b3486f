"""`export_decoder`: checkpoint -> one artifact file + manifest.json in an artifact directory.

Stages: check the request (format/mode/dtype, optional dependencies) before anything slow; read
the checkpoint and its decoder digest; capture the graph with torch.export (dynamic frame
dimension); convert it to the format; hash it and merge it into the directory's manifest; load it
back through the client's runtime and decode a short stream against the eager decoder of the
same mode, recording that SNR in the manifest.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import importlib.util
import os
import pathlib
import shutil
import tempfile
import warnings
from importlib.metadata import version

import numpy as np
from codecstream.client.runtimes import installed, open_decoder
from codecstream.export.errors import ExportError
from codecstream.export.metrics import json_number
from codecstream.export.progress import Progress
from codecstream.protocol.chunking import DEFAULT_RAMP, MAX_CHUNK_FRAMES
from codecstream.protocol.codec_spec import qwen3_tts_12hz_spec
from codecstream.protocol.errors import ManifestError
from codecstream.protocol.manifest import (
    ARTIFACT_DTYPES,
    ARTIFACT_FILES,
    ARTIFACT_FORMATS,
    ARTIFACT_MODES,
    MANIFEST_FILE,
    ArtifactFile,
    Manifest,
    file_sha256,
    read_manifest,
    write_manifest,
)
from codecstream.protocol.pcm import snr_db

#: Python modules each format needs at export time, and the extra of codecstream-export that has them.
REQUIREMENTS = {
    "pt2": ((), None),
    "pte": (("executorch", "torchao"), "executorch"),
    "onnx": (("onnx", "onnxscript", "onnxruntime"), "onnx"),
}
#: Artifacts decode chunks up to 2 s in one call by default: more than the default ramp asks for,
#: so a client that asks a server for larger chunks needs no other export.
DEFAULT_MAX_CHUNK_FRAMES = 25
STAGES = 5
CHECK_FRAMES = 48
#: The export check's SNR below which an artifact is refused, by dtype. The floor for fp32 sits far
#: below every right fp32 artifact and far above a wrong one; reduced precision's right artifacts
#: span a wide range, so its floor only catches a broken artifact (docs/performance.md,
#: "Measurements behind the code").
CHECK_FLOOR_DB = {"fp32": 80.0, "bf16": 15.0, "bf16-mixed": 15.0, "int8": 15.0}


@dataclasses.dataclass(frozen=True)
class ExportRequest:
    checkpoint: pathlib.Path
    format: str
    mode: str
    dtype: str = "fp32"
    max_chunk_frames: int = DEFAULT_MAX_CHUNK_FRAMES
    out_dir: pathlib.Path = pathlib.Path("artifacts/decoder")
    #: Refuse the artifact when its export check is below this SNR (None: CHECK_FLOOR_DB's, by dtype).
    min_check_db: float | None = None


def check_request(request: ExportRequest) -> None:
    """Refuse what cannot work before any slow step: bad combinations, missing dependencies."""
    if request.format not in ARTIFACT_FORMATS:
        raise ExportError(f"unknown format {request.format!r}, expected one of {', '.join(ARTIFACT_FORMATS)}")
    if request.mode not in ARTIFACT_MODES:
        raise ExportError(f"unknown mode {request.mode!r}, expected one of {', '.join(ARTIFACT_MODES)}")
    supported = ARTIFACT_DTYPES[request.format]
    if request.dtype not in supported:
        others = [fmt for fmt, dtypes in ARTIFACT_DTYPES.items() if request.dtype in dtypes]
        hint = f"; {request.dtype} is available for {', '.join(others)}" if others else ""
        raise ExportError(
            f"--dtype {request.dtype} is not supported for {request.format} artifacts "
            f"(supported: {', '.join(supported)}){hint}"
        )
    if not 1 <= request.max_chunk_frames <= MAX_CHUNK_FRAMES:
        raise ExportError(
            f"--max-chunk-frames {request.max_chunk_frames} is out of range, expected 1..{MAX_CHUNK_FRAMES}"
        )
    modules, extra = REQUIREMENTS[request.format]
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(
            f"{request.format} export needs {', '.join(missing)}, which is not installed: "
            f"pip install 'codecstream-export[{extra}]'"
        )


def export_decoder(request: ExportRequest, progress: Progress | None = None) -> Manifest:
    """Write `request.format`'s artifact and its manifest entry into `request.out_dir`."""
    check_request(request)
    progress = progress or Progress(total=STAGES, enabled=False)
    # torch's own pytree deprecation, raised inside torch.export/torch.onnx, not by this code.
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
    import torch  # after the checks: a bad request fails fast, without importing torch
    from codecstream.export.graphs import build_graph

    out_dir = request.out_dir
    previous = _previous_manifest(out_dir)
    with progress.stage(f"reading checkpoint {request.checkpoint}"):
        model, digest = _read_checkpoint(request.checkpoint)
        export_model = _export_model(model, request.dtype)
        graph = build_graph(export_model, request.mode, request.max_chunk_frames)
        manifest = _merged_manifest(_manifest(request, graph, digest, model), previous, request)
    with progress.stage(f"capturing the {request.mode} graph with torch.export (frames 1..{request.max_chunk_frames})"):
        if request.format == "pte":
            from codecstream.export.to_pte import capture

            exported = capture(graph, request.dtype)
        else:
            exported = torch.export.export(graph.module, graph.example_inputs, dynamic_shapes=graph.dynamic_shapes)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ARTIFACT_FILES[request.format]
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")  # keeps the suffix the writers check
    try:
        with progress.stage(_CONVERSION_TITLES[request.format]):
            details = _writer(request.format)(graph, exported, partial, request.dtype)
        with progress.stage("hashing"):
            entry = ArtifactFile(
                format=request.format,
                file=path.name,
                sha256=file_sha256(partial),
                size_bytes=partial.stat().st_size,
                runtime=details["runtime"],
                versions=details["versions"],
                quantization=details["quantization"],
            )
        with progress.stage(f"checking the artifact through the client runtime ({CHECK_FRAMES} frames)"):
            check = _export_check(
                request, model, partial, dataclasses.replace(manifest, artifacts={request.format: entry})
            )
            if check is None:
                progress.note(f"skipped: the {request.format} runtime is not installed here")
            else:
                progress.note(f"SNR {check['snr_db']} dB against the eager {request.mode} decoder")
                _refuse_below_floor(request, float(check["snr_db"]), kept=previous is not None)
    except BaseException:
        partial.unlink(missing_ok=True)  # the directory keeps what it held: nothing half-made lands
        raise
    # Only a checked artifact takes the place of the directory's earlier one of its format.
    partial.replace(path)
    entry = dataclasses.replace(entry, export_check=check)
    manifest = dataclasses.replace(manifest, artifacts={**manifest.artifacts, request.format: entry})
    write_manifest(out_dir, manifest)
    return manifest


_CONVERSION_TITLES = {
    "pt2": "saving the exported program (.pt2)",
    "pte": "lowering to ExecuTorch with XNNPACK (about 1-3 minutes)",
    "onnx": "converting to ONNX (torch.onnx, dynamo exporter)",
}


def _writer(fmt: str):
    if fmt == "pt2":
        from codecstream.export.to_pt2 import write_pt2

        return write_pt2
    if fmt == "pte":
        from codecstream.export.to_pte import write_pte

        return write_pte
    from codecstream.export.to_onnx import write_onnx

    return write_onnx


def _export_model(model, dtype: str):
    """The model to capture for `dtype`; a copy when it differs, so that the fp32 model stays the
    reference of the export check."""
    import torch

    if dtype == "bf16":
        return copy.deepcopy(model).to(torch.bfloat16)
    if dtype == "bf16-mixed":
        from codecstream.decoder.precision import mixed_precision

        return mixed_precision(model)
    return model


def _read_checkpoint(checkpoint: pathlib.Path):
    from codecstream.decoder import CheckpointError, load_decoder
    from codecstream.protocol.digest import DigestError, decoder_digest

    try:
        return load_decoder(checkpoint), decoder_digest(checkpoint)
    except (CheckpointError, DigestError) as error:
        raise ExportError(f"cannot read checkpoint: {error}") from None


def _previous_manifest(out_dir: pathlib.Path) -> Manifest | None:
    if not (out_dir / MANIFEST_FILE).exists():
        return None
    try:
        return read_manifest(out_dir)
    except ManifestError as error:
        raise ExportError(
            f"{out_dir} holds an unreadable {MANIFEST_FILE} ({error}); use an empty --out directory"
        ) from None


def _manifest(request: ExportRequest, graph, digest: str, model) -> Manifest:
    """The manifest of this graph, without artifact files yet."""
    return Manifest(
        codec=Manifest.codec_json(qwen3_tts_12hz_spec(digest)),
        mode=request.mode,
        dtype=request.dtype,
        min_chunk_frames=1,
        max_chunk_frames=request.max_chunk_frames,
        inputs=graph.inputs,
        outputs=graph.outputs,
        state=graph.state,
        window=graph.window,
        artifacts={},
        source={"checkpoint": str(request.checkpoint.resolve()), "decoder_config": _config_json(model.config)},
        exporter={
            "name": "codecstream-export",
            "version": version("codecstream-export"),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
    )


def _merged_manifest(manifest: Manifest, previous: Manifest | None, request: ExportRequest) -> Manifest:
    """Keep the other formats' files of the same graph; refuse to mix graphs in one directory."""
    if previous is None:
        return manifest
    differences = previous.same_graph(manifest)
    if differences:
        held = ", ".join(sorted(previous.artifacts))
        raise ExportError(
            f"{request.out_dir} already holds {previous.mode} {previous.dtype} artifacts ({held}) of another graph "
            f"(differs in {', '.join(differences)}); export into another --out directory"
        )
    kept = {fmt: entry for fmt, entry in previous.artifacts.items() if fmt != request.format}
    return dataclasses.replace(manifest, artifacts=kept)


def _config_json(config) -> dict:
    return {
        key: list(value) if isinstance(value, tuple) else value for key, value in dataclasses.asdict(config).items()
    }


def _refuse_below_floor(request: ExportRequest, snr: float, kept: bool) -> None:
    floor = request.min_check_db if request.min_check_db is not None else CHECK_FLOOR_DB[request.dtype]
    if snr < floor:
        raise ExportError(
            f"the {request.format} artifact decodes at {snr} dB against the eager {request.mode} decoder, below "
            f"the {floor:g} dB floor for {request.dtype} artifacts (--min-check-db): it was not written"
            + (f"; {request.out_dir} keeps what it held" if kept else "")
        )


def _export_check(request: ExportRequest, model, artifact_file: pathlib.Path, manifest: Manifest) -> dict | None:
    """Decode a short random stream in the ramp with the artifact (`artifact_file`, not yet in place,
    loaded as a client would from a directory of its own with `manifest`) and with the eager decoder
    of its mode."""
    if not installed(request.format):
        return None
    staging = pathlib.Path(tempfile.mkdtemp(prefix=".check-", dir=request.out_dir))
    try:
        try:
            os.link(artifact_file, staging / ARTIFACT_FILES[request.format])  # no copy of hundreds of MB
        except OSError:  # a file system without hard links
            shutil.copyfile(artifact_file, staging / ARTIFACT_FILES[request.format])
        write_manifest(staging, manifest)
        return _compare_with_eager(request, model, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _compare_with_eager(request: ExportRequest, model, directory: pathlib.Path) -> dict:
    from codecstream.decoder import make_frame_decoder

    codes = np.random.default_rng(0).integers(
        0, model.config.codebook_size, (CHECK_FRAMES, model.config.num_quantizers)
    )
    artifact = open_decoder(directory, backend=request.format, warm_up=False)  # it decodes right away anyway
    eager = make_frame_decoder(model, request.mode)
    sizes = [min(size, request.max_chunk_frames) for size in DEFAULT_RAMP]  # the sizes streams use
    got, want = [], []
    start, index = 0, 0
    while start < len(codes):
        chunk = codes[start : start + sizes[min(index, len(sizes) - 1)]]
        got.append(artifact.decode(chunk))
        want.append(eager.decode(chunk))
        start += len(chunk)
        index += 1
    snr = snr_db(np.concatenate(want), np.concatenate(got))
    return {"frames": CHECK_FRAMES, "chunking": sizes, "against": f"eager {request.mode}", "snr_db": json_number(snr)}

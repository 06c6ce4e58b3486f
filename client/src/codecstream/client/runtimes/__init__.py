"""On-device decoders behind one interface: `open_decoder(source)` -> a `LoadedDecoder`.

    from codecstream.client.runtimes import open_decoder
    decoder = open_decoder("artifacts/decoder")      # manifest.json + decoder.onnx / .pte / .pt2
    decoder = open_decoder("Qwen3-TTS/speech_tokenizer", backend="torch")   # eager, from weights
    pcm = decoder.decode(codes)                       # (k, 16) ints -> k * 1920 float32 samples

Importing this package needs neither torch nor any runtime: each backend imports its runtime
when it is chosen, and says which extra to install when it is missing.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import pathlib

from codecstream.client.runtimes.artifact import StatefulArtifactDecoder, WindowedArtifactDecoder
from codecstream.client.runtimes.errors import DecoderLoadError
from codecstream.client.runtimes.loaded import LoadedDecoder
from codecstream.client.runtimes.program import Program
from codecstream.client.runtimes.torch_eager import EagerTorchDecoder
from codecstream.protocol.checkpoint_files import has_decoder_weights
from codecstream.protocol.codec_spec import qwen3_tts_12hz_spec, spec_differences
from codecstream.protocol.digest import digest_label
from codecstream.protocol.errors import ManifestError
from codecstream.protocol.manifest import MANIFEST_FILE, Manifest, read_manifest, verified_artifact_path


@dataclasses.dataclass(frozen=True)
class Backend:
    """What choosing and loading one decoder backend takes."""

    #: The artifact format it reads (OpenVINO and ONNX Runtime both read the .onnx file); None:
    #: it decodes a checkpoint's weights.
    format: str | None
    #: The module that must be importable for it to run.
    module: str
    #: The codecstream-client extra that installs that module.
    extra: str
    #: Its Program, as "module:Class" in this package, imported only when it is chosen.
    program: str | None = None


#: Every backend. The artifact runtimes stand in the order "auto" prefers them, over the formats a
#: directory holds. The rule, from the backend axis of decode_bench (artifact_bench.json) on the
#: machine kinds measured: the .onnx runtimes need no torch, are ready soonest (docs/performance.md,
#: "Measurements behind the code") and decode the chunks that set first-audio latency (C <= 8) fastest;
#: OpenVINO decoded them faster than ONNX Runtime where both were measured (docs/performance.md),
#: so it comes first when it is installed, unless ONNX Runtime has a GPU to run on (`_preference`).
#: Lossy artifacts are never chosen for the user: an artifact directory holds one dtype, the one it
#: was exported in.
BACKEND_DESCRIPTIONS = {
    "openvino": Backend("onnx", "openvino", "openvino", "openvino_program:OpenVinoProgram"),
    "onnx": Backend("onnx", "onnxruntime", "onnx", "onnx_program:OnnxProgram"),
    "pte": Backend("pte", "executorch", "executorch", "pte_program:PteProgram"),
    "pt2": Backend("pt2", "torch", "torch", "pt2_program:Pt2Program"),
    "torch": Backend(None, "codecstream.decoder", "torch"),
}
BACKENDS = ("auto", *BACKEND_DESCRIPTIONS)
#: The artifact format each artifact runtime reads.
FORMATS = {name: backend.format for name, backend in BACKEND_DESCRIPTIONS.items() if backend.format}
#: The artifact runtimes, best first.
PREFERENCE = tuple(FORMATS)


def installed(backend: str) -> bool:
    """Whether the runtime of `backend` can be imported here (without importing it)."""
    module = BACKEND_DESCRIPTIONS[backend].module
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def runnable_formats(backend: str) -> list[str]:
    """The artifact formats `backend` can open here ("auto": any installed runtime), best first."""
    runtimes = PREFERENCE if backend == "auto" else (backend,)
    return list(dict.fromkeys(FORMATS[runtime] for runtime in runtimes if runtime in FORMATS and installed(runtime)))


def open_decoder(
    source: str | pathlib.Path,
    *,
    backend: str = "auto",
    threads: int | None = None,
    warm_up: bool = True,
    precision: str = "fp32",
) -> LoadedDecoder:
    """Open an artifact directory (with manifest.json) or a checkpoint directory (eager torch).

    `backend`: "auto" (what the directory holds and what is installed: OpenVINO, then ONNX Runtime,
    both on the .onnx file, then ExecuTorch, then .pt2), "openvino", "onnx", "pte", "pt2" or
    "torch". `threads`: CPU threads for the runtime (torch and ExecuTorch apply it process-wide);
    None keeps the runtime's default.
    `warm_up`: decode silent chunks of the sizes the runtime needs warmed before returning
    (`LoadedDecoder.warm_up`), so that no chunk, the first stream's included, pays a first-shape
    cost; benchmarks of cold start turn it off. `precision`: for the torch backend on a CUDA
    device, "fp32" (TF32 off, the default), "tf32", "bf16" or "bf16-mixed" (torch_eager.PRECISIONS;
    an artifact's precision is the one it was exported in). Raises DecoderLoadError with the
    reason and, for a missing runtime, the extra to install; a decoder whose warm-up decode fails
    is refused here rather than mid-stream.
    """
    try:
        decoder = _open(source, backend, threads, precision)
    except DecoderLoadError:
        raise
    except Exception as error:  # what a runtime raises for what it cannot use is a load failure too
        raise DecoderLoadError(f"{source}: the decoder does not load: {type(error).__name__}: {error}") from None
    if warm_up:
        try:
            decoder.warm_up()
        except Exception as error:  # whatever the runtime raises, the artifact cannot be used
            raise DecoderLoadError(f"{source}: the decoder loaded but its first decode failed: {error}") from None
    return decoder


def check_decoder_source(source: str | pathlib.Path, backend: str = "auto") -> None:
    """Raise DecoderLoadError now, without loading anything, for a source `open_decoder` would
    refuse before loading: a missing directory, neither a manifest nor decoder weights, a manifest
    that does not parse, a backend it does not hold or whose runtime is not installed."""
    runtime_for(source, backend)


def runtime_for(source: str | pathlib.Path, backend: str = "auto") -> str:
    """The runtime `open_decoder(source, backend=backend)` opens it with ("torch" for a checkpoint),
    without loading anything; DecoderLoadError as `check_decoder_source`."""
    return _locate(source, backend, "fp32")[2]


def _open(source: str | pathlib.Path, backend: str, threads: int | None, precision: str) -> LoadedDecoder:
    directory, manifest, runtime = _locate(source, backend, precision)
    if manifest is None:
        return EagerTorchDecoder(directory, threads, precision=precision)
    return _open_artifact(directory, manifest, runtime, threads)


def _locate(source: str | pathlib.Path, backend: str, precision: str) -> tuple[pathlib.Path, Manifest | None, str]:
    """The directory, its manifest (None for a checkpoint) and the runtime to open it with."""
    if backend not in BACKENDS:
        raise DecoderLoadError(f"unknown decoder backend {backend!r}, expected one of {', '.join(BACKENDS)}")
    directory = pathlib.Path(source)
    if not directory.is_dir():
        raise DecoderLoadError(f"{directory}: no such directory (expected a decoder artifact or checkpoint directory)")
    if not (directory / MANIFEST_FILE).is_file() and has_decoder_weights(directory):
        if backend not in ("auto", "torch"):
            raise DecoderLoadError(
                f"{directory} is a checkpoint, which only the torch backend decodes; "
                f"for {backend}, export it first: codecstream export-decoder {directory} "
                f"--format {FORMATS.get(backend, backend)} --out DIR"
            )
        return directory, None, "torch"
    if precision != "fp32":
        raise DecoderLoadError(
            f"precision {precision!r} applies to the torch backend on a checkpoint; an artifact decodes "
            "in the dtype it was exported in (codecstream export-decoder --dtype)"
        )
    if backend == "torch":
        raise DecoderLoadError(
            f"{directory}: the torch backend needs a checkpoint directory (model.safetensors), "
            "not an artifact directory"
        )
    try:
        manifest = read_manifest(directory)
    except ManifestError as error:
        raise DecoderLoadError(str(error)) from None
    return directory, manifest, _choose_runtime(directory, manifest, backend)


def _choose_runtime(directory: pathlib.Path, manifest: Manifest, backend: str) -> str:
    held = [fmt for fmt in dict.fromkeys(FORMATS[runtime] for runtime in PREFERENCE) if fmt in manifest.artifacts]
    if backend != "auto":
        fmt = FORMATS[backend]
        if fmt not in manifest.artifacts:
            runs = "" if fmt == backend else f"; the {backend} backend runs {fmt} artifacts"
            raise DecoderLoadError(f"{directory} holds no {fmt} artifact (it holds: {', '.join(held) or 'none'}){runs}")
        if not installed(backend):
            raise DecoderLoadError(f"the {backend} runtime is not installed: pip install {_extra(backend)}")
        return backend
    if not held:
        raise DecoderLoadError(f"{directory / MANIFEST_FILE} lists no artifact files")
    candidates = [runtime for runtime in _preference() if FORMATS[runtime] in held]
    for runtime in candidates:
        if installed(runtime):
            return runtime
    extras = " or ".join(_extra(runtime) for runtime in candidates)
    raise DecoderLoadError(
        f"{directory} holds {', '.join(held)} artifacts but no runtime for them is installed: pip install {extras}"
    )


def _extra(backend: str) -> str:
    return f"'codecstream-client[{BACKEND_DESCRIPTIONS[backend].extra}]'"


#: The ONNX Runtime distribution that carries a GPU provider: PyPI's, and the Jetson wheels, which
#: take its name. The plain `onnxruntime` wheel has none.
_ONNX_RUNTIME_GPU = "onnxruntime-gpu"


def _preference() -> tuple[str, ...]:
    """PREFERENCE, with ONNX Runtime first where it has a GPU provider (onnxruntime-gpu, the
    Jetson builds): the OpenVINO backend decodes on the CPU only. A CPU-only ONNX Runtime (which
    pipecat-ai requires) is not imported to ask: its import is a noticeable share of a decoder's
    open (docs/performance.md, "Measurements behind the code")."""
    if not (installed("openvino") and installed("onnx")):
        return PREFERENCE
    try:
        importlib.metadata.distribution(_ONNX_RUNTIME_GPU)
    except importlib.metadata.PackageNotFoundError:
        return PREFERENCE
    from codecstream.client.runtimes.onnx_program import gpu_provider

    if gpu_provider() is None:
        return PREFERENCE
    return ("onnx", *(runtime for runtime in PREFERENCE if runtime != "onnx"))


def _open_artifact(directory: pathlib.Path, manifest: Manifest, runtime: str, threads: int | None) -> LoadedDecoder:
    codec = manifest.codec_spec()
    known = qwen3_tts_12hz_spec(codec.decoder_digest)
    differences = spec_differences(known, codec)
    if differences:
        raise DecoderLoadError(
            f"{directory}: codec mismatch: this client decodes {known.codec_name} {known.codec_version} "
            f"({'; '.join(differences)})"
        )
    entry = manifest.artifacts[FORMATS[runtime]]
    # Hashing the file runs beside the runtime's load of it rather than before (the hash is the shorter
    # of the two: docs/performance.md, "Decoder runtimes on the CPU"): both read the same pages, and the
    # GIL is released in both.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        verification = pool.submit(verified_artifact_path, directory, entry)
        try:
            program = _program_class(runtime).load(directory, entry, manifest, threads)
        except Exception as error:
            _check_verified(verification)  # a modified or missing file is the reason to report
            if isinstance(error, DecoderLoadError):
                raise
            raise DecoderLoadError(f"{directory / entry.file} does not load on {runtime}: {error}") from None
        _check_verified(verification)
    quantized = f", {entry.quantization}" if entry.quantization else ""
    attributes = dict(
        codec=codec,
        backend=runtime,
        mode=manifest.mode,
        dtype=manifest.dtype,
        max_chunk_frames=manifest.max_chunk_frames,
        description=f"{manifest.mode} {manifest.dtype} {entry.file} on {program.runtime}{quantized}, "
        f"chunks up to {manifest.max_chunk_frames} frames ({digest_label(codec.decoder_digest)})",
    )
    decoder_class = StatefulArtifactDecoder if manifest.mode == "stateful" else WindowedArtifactDecoder
    return decoder_class(program, manifest, **attributes)


def _check_verified(verification: concurrent.futures.Future) -> None:
    try:
        verification.result()
    except ManifestError as error:
        raise DecoderLoadError(str(error)) from None


def _program_class(runtime: str) -> type[Program]:
    module, name = BACKEND_DESCRIPTIONS[runtime].program.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "BACKENDS",
    "BACKEND_DESCRIPTIONS",
    "FORMATS",
    "DecoderLoadError",
    "LoadedDecoder",
    "Manifest",
    "check_decoder_source",
    "installed",
    "open_decoder",
    "runnable_formats",
    "runtime_for",
]

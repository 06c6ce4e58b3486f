"""`manifest.json`: what a decoder artifact directory holds, written by `codecstream export-decoder`.

One directory holds artifacts of one decoder graph (one codec and weights digest, one mode, one
dtype, one signature) in one or more formats (`decoder.onnx`, `decoder.pte`, `decoder.pt2`); the
manifest describes the graph once and each file with its sha256, size, runtime and the versions it
was exported with. The schema lives here, beside the contract, because two roles share it: the
exporter writes it and the client reads it (without torch), checking a file's sha256 before loading it.

    {
      "manifest_version": 1,
      "codec": {"codec_name": "qwen3-tts-tokenizer-12hz", ..., "decoder_digest": "sha256:..."},
      "mode": "stateful", "dtype": "fp32",
      "chunk_frames": {"min": 1, "max": 25},
      "inputs":  [{"name": "codes", "shape": [1, "frames", 16], "dtype": "int64"}, ...state],
      "outputs": [{"name": "pcm", "shape": [1, "frames*1920"], "dtype": "float32"}, ...next state],
      "state":   [{"name": "position", "shape": [1], "dtype": "int64"}, ...],
      "window":  null,
      "artifacts": {"onnx": {"file": "decoder.onnx", "sha256": "...", "size_bytes": ..., ...}},
      "source": {...}, "exporter": {...}
    }
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
import re
from typing import Any

from codecstream.protocol.chunking import MAX_CHUNK_FRAMES
from codecstream.protocol.codec_spec import CODEC_SPEC_FIELDS
from codecstream.protocol.errors import ManifestError
from codecstream.v1 import codec_pb2

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
#: How an artifact decodes: "stateful" (exact; the state goes in and out) or "windowed" (72 frames).
ARTIFACT_MODES = ("stateful", "windowed")
#: Artifact formats and the dtypes each can be exported in (codecstream.export: to_pt2, to_pte, to_onnx).
ARTIFACT_DTYPES = {"pt2": ("fp32", "bf16", "bf16-mixed"), "pte": ("fp32", "int8"), "onnx": ("fp32", "int8")}
ARTIFACT_FORMATS = tuple(ARTIFACT_DTYPES)
#: The file each format is written to inside an artifact directory.
ARTIFACT_FILES = {"onnx": "decoder.onnx", "pte": "decoder.pte", "pt2": "decoder.pt2"}

#: How a manifest names a file's bytes, and a download asks for them.
SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
#: An artifact's file: a plain name inside the manifest's own directory. A manifest may come from a
#: server (decoder="auto"), so a name with a folder, '..' or a drive would be a path of the sender's
#: choosing on the client's disk.
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")

#: Element types a graph's tensors have (int64 codes and positions, float PCM and state).
TENSOR_DTYPES = ("int64", "int32", "float32", "bfloat16", "float16")
#: The most bytes a stateful graph's state may take. The real-size decoder's (KV caches of 72
#: frames, conv histories, transposed-conv tails) is a small fraction of this; a manifest listing
#: more describes no decoder of this codec, and a client would allocate it for every stream.
MAX_STATE_BYTES = 64 << 20
#: The largest fixed dimension a graph tensor may list (the widest real one is 1,536 channels).
MAX_FIXED_DIMENSION = 1 << 16
#: The most frames of left context a windowed graph may keep (the codec's decoder reaches ~578).
MAX_CONTEXT_FRAMES = 4096
_DTYPE_BYTES = {"int64": 8, "int32": 4, "float32": 4, "bfloat16": 2, "float16": 2}

_HASH_BLOCK = 1 << 22


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One graph input or output. A dimension is an int, or a name for a dimension that varies
    with the chunk ("frames", "context_frames") or an expression of it ("frames*1920")."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorSpec:
        if not isinstance(data["shape"], list):
            raise ValueError(f"shape: expected a list, got {_shown(data['shape'])}")
        return cls(str(data["name"])[:128], tuple(data["shape"]), str(data["dtype"])[:32])

    def fixed_shape(self) -> tuple[int, ...]:
        """The shape of a tensor whose dimensions are all fixed (state tensors)."""
        if not all(isinstance(d, int) for d in self.shape):
            raise ValueError(f"tensor {self.name} has a variable shape {list(self.shape)}")
        return tuple(int(d) for d in self.shape)


@dataclasses.dataclass(frozen=True)
class ArtifactFile:
    """One exported file of the graph, in one format."""

    format: str
    file: str
    sha256: str
    size_bytes: int
    #: The runtime that runs it ("onnxruntime", "executorch", "torch") and the versions of the
    #: exporter's toolchain, e.g. {"torch": "2.13.0", "executorch": "1.4.1"}.
    runtime: str
    versions: dict[str, str]
    #: How weights/activations are quantized, in words; None for plain fp32/bf16 graphs.
    quantization: str | None = None
    #: What the exporter measured right after writing the file (frames decoded, SNR against eager).
    export_check: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArtifactFile:
        fields = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in fields})


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """Windowed graphs: frames of left context kept (72) and the fewest the graph accepts; a
    shorter context (stream start) is padded to `min_context_frames` and the padding masked."""

    context_frames: int
    min_context_frames: int


@dataclasses.dataclass(frozen=True)
class Manifest:
    codec: dict[str, Any]
    mode: str
    dtype: str
    min_chunk_frames: int
    max_chunk_frames: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    state: tuple[TensorSpec, ...]
    window: WindowSpec | None
    artifacts: dict[str, ArtifactFile]
    source: dict[str, Any] = dataclasses.field(default_factory=dict)
    exporter: dict[str, Any] = dataclasses.field(default_factory=dict)

    # -- codec -------------------------------------------------------------------------------------

    def codec_spec(self) -> codec_pb2.CodecSpec:
        return codec_pb2.CodecSpec(**{field: self.codec[field] for field in CODEC_SPEC_FIELDS})

    @staticmethod
    def codec_json(spec: codec_pb2.CodecSpec) -> dict[str, Any]:
        return {field: getattr(spec, field) for field in CODEC_SPEC_FIELDS}

    def same_graph(self, other: Manifest) -> list[str]:
        """Why `other` describes a different graph (so its files cannot share this directory)."""
        differences = []
        for name in ("codec", "mode", "dtype", "min_chunk_frames", "max_chunk_frames", "inputs", "outputs", "window"):
            if getattr(self, name) != getattr(other, name):
                differences.append(name)
        return differences

    # -- JSON --------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest_version": MANIFEST_VERSION,
            "codec": dict(self.codec),
            "mode": self.mode,
            "dtype": self.dtype,
            "chunk_frames": {"min": self.min_chunk_frames, "max": self.max_chunk_frames},
            "inputs": [spec.to_json() for spec in self.inputs],
            "outputs": [spec.to_json() for spec in self.outputs],
            "state": [spec.to_json() for spec in self.state],
            "window": dataclasses.asdict(self.window) if self.window else None,
            "artifacts": {name: entry.to_json() for name, entry in sorted(self.artifacts.items())},
            "source": self.source,
            "exporter": self.exporter,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "manifest") -> Manifest:
        version = data.get("manifest_version")
        if version != MANIFEST_VERSION:
            raise ManifestError(
                f"{where}: manifest_version is {version!r}, this client reads version {MANIFEST_VERSION}"
            )
        try:
            codec = {field: data["codec"][field] for field in CODEC_SPEC_FIELDS}
            codec_pb2.CodecSpec(**codec)  # each field of the type the contract gives it
            manifest = cls(
                codec=codec,
                mode=data["mode"],
                dtype=data["dtype"],
                min_chunk_frames=_whole(data["chunk_frames"]["min"], "chunk_frames.min"),
                max_chunk_frames=_whole(data["chunk_frames"]["max"], "chunk_frames.max"),
                inputs=tuple(TensorSpec.from_json(d) for d in data["inputs"]),
                outputs=tuple(TensorSpec.from_json(d) for d in data["outputs"]),
                state=tuple(TensorSpec.from_json(d) for d in data["state"]),
                window=WindowSpec(**data["window"]) if data.get("window") else None,
                artifacts={name: ArtifactFile.from_json(entry) for name, entry in data["artifacts"].items()},
                source=data.get("source", {}),
                exporter=data.get("exporter", {}),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ManifestError(f"{where}: not a valid decoder manifest (missing or malformed {error})") from None
        if manifest.mode not in ARTIFACT_MODES:
            raise ManifestError(f"{where}: mode {_shown(manifest.mode)} is not one of {', '.join(ARTIFACT_MODES)}")
        _check_shapes(where, manifest)
        if manifest.mode == "windowed" and manifest.window is None:
            raise ManifestError(f"{where}: a windowed manifest needs a 'window' entry")
        unknown = sorted(set(manifest.artifacts) - set(ARTIFACT_FORMATS))
        if unknown:
            raise ManifestError(
                f"{where}: unknown artifact formats {unknown}, expected some of {', '.join(ARTIFACT_FORMATS)}"
            )
        for fmt, entry in manifest.artifacts.items():
            _check_entry(where, fmt, entry)
            if manifest.dtype not in ARTIFACT_DTYPES[fmt]:
                raise ManifestError(
                    f"{where}: dtype {manifest.dtype!r} is not one a {fmt} artifact is exported in "
                    f"({', '.join(ARTIFACT_DTYPES[fmt])})"
                )
        return manifest


def _check_entry(where: str, fmt: str, entry: ArtifactFile) -> None:
    field = f"artifacts.{fmt}"
    if not (isinstance(entry.file, str) and FILE_NAME.fullmatch(entry.file)):
        raise ManifestError(
            f"{where}: {field}.file must be a plain file name (letters, digits, '.', '_', '-'; no folder, "
            f"at most 128 characters), got {_shown(entry.file)}"
        )
    if not (isinstance(entry.sha256, str) and SHA256.fullmatch(entry.sha256)):
        raise ManifestError(f"{where}: {field}.sha256 must be 'sha256:' and 64 lowercase hex digits")
    if type(entry.size_bytes) is not int or entry.size_bytes < 1:
        raise ManifestError(
            f"{where}: {field}.size_bytes must be a whole number of bytes, at least 1, got {_shown(entry.size_bytes)}"
        )


def _whole(value: Any, field: str) -> int:
    """A whole number from the JSON (not a float, a bool or a string that reads as one)."""
    if type(value) is not int:
        raise ValueError(f"{field}: expected a whole number, got {_shown(value)}")
    return value


def _check_shapes(where: str, manifest: Manifest) -> None:
    """The numbers a client allocates and loops by, within what a decoder of this codec has."""
    low, high = manifest.min_chunk_frames, manifest.max_chunk_frames
    if not 1 <= low <= high <= MAX_CHUNK_FRAMES:
        raise ManifestError(
            f"{where}: chunk_frames must satisfy 1 <= min <= max <= {MAX_CHUNK_FRAMES}, got min {low} and max {high}"
        )
    window = manifest.window
    if window is not None:
        context, least = window.context_frames, window.min_context_frames
        if not (type(context) is int and type(least) is int and 1 <= least <= context <= MAX_CONTEXT_FRAMES):
            raise ManifestError(
                f"{where}: window must satisfy 1 <= min_context_frames <= context_frames <= {MAX_CONTEXT_FRAMES}, "
                f"got {_shown(least)} and {_shown(context)}"
            )
    names = {"frames", "context_frames", f"frames*{manifest.codec['samples_per_frame']}"}
    state_bytes = 0
    for kind in ("inputs", "outputs", "state"):
        for index, spec in enumerate(getattr(manifest, kind)):
            label = f"{kind}[{index}]"
            if spec.dtype not in TENSOR_DTYPES:
                raise ManifestError(
                    f"{where}: {label}.dtype is {_shown(spec.dtype)}, expected one of {', '.join(TENSOR_DTYPES)}"
                )
            for dim in spec.shape:
                fixed = type(dim) is int and 0 <= dim <= MAX_FIXED_DIMENSION
                if not fixed and dim not in names:
                    raise ManifestError(
                        f"{where}: {label}.shape has {_shown(dim)}, expected a whole number 0..{MAX_FIXED_DIMENSION} "
                        f"or one of {', '.join(sorted(names))}"
                    )
            if kind == "state":
                if not all(type(dim) is int for dim in spec.shape):
                    raise ManifestError(f"{where}: {label}.shape must be fixed, got {_shown(list(spec.shape))}")
                state_bytes += math.prod(spec.shape) * _DTYPE_BYTES[spec.dtype]
    if state_bytes > MAX_STATE_BYTES:
        raise ManifestError(
            f"{where}: the state takes {state_bytes} bytes, over the {MAX_STATE_BYTES} a decoder of this codec may "
            "(a client allocates it for every stream)"
        )


def _shown(value: Any) -> str:
    """A value from a manifest in an error message, bounded: a manifest may come from anyone."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_manifest(directory: pathlib.Path | str) -> Manifest:
    """Read `directory/manifest.json`; ManifestError says precisely what is missing or wrong."""
    directory = pathlib.Path(directory)
    path = directory / MANIFEST_FILE
    if not directory.is_dir():
        raise ManifestError(f"{directory}: no such directory")
    if not path.is_file():
        raise ManifestError(
            f"{directory} has no {MANIFEST_FILE}: not a decoder artifact directory "
            "(create one with `codecstream export-decoder`)"
        )
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ManifestError(f"{path}: not valid JSON ({error})") from None
    except RecursionError:
        raise ManifestError(f"{path}: not a decoder manifest (JSON nested too deeply)") from None
    except OSError as error:
        raise ManifestError(f"{path} cannot be read: {error.strerror or error}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: expected a JSON object")
    return Manifest.from_json(data, str(path))


def write_manifest(directory: pathlib.Path | str, manifest: Manifest) -> pathlib.Path:
    path = pathlib.Path(directory) / MANIFEST_FILE
    path.write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    return path


def file_sha256(path: pathlib.Path | str) -> str:
    """'sha256:<hex>' of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def verified_artifact_path(directory: pathlib.Path | str, entry: ArtifactFile) -> pathlib.Path:
    """The path of `entry`'s file after checking that its bytes are the ones the manifest names."""
    path = pathlib.Path(directory) / entry.file
    if not path.is_file():
        raise ManifestError(f"{path}: listed in {MANIFEST_FILE} but missing")
    try:
        actual = file_sha256(path)
    except OSError as error:
        raise ManifestError(f"{path} cannot be read: {error.strerror or error}") from None
    if actual != entry.sha256:
        raise ManifestError(
            f"{path}: sha256 mismatch: {MANIFEST_FILE} says {entry.sha256}, the file has {actual} "
            "(modified or truncated after export; export it again)"
        )
    return path

"""Where a Qwen3-TTS checkpoint keeps its speech-tokenizer decoder weights: one layout rule for the
server (the digest it announces), the exporter and the client's torch runtime (what they load).

A model root holds `speech_tokenizer/`; that directory (or a bare copy of it) holds
`model.safetensors`, or shards listed in `model.safetensors.index.json`. The decoder's tensors
are the ones named `decoder.*`. Read straight from the safetensors layout (an 8-byte little-endian
header length, a JSON header, raw little-endian data), so no torch is needed.
"""

from __future__ import annotations

import json
import pathlib
import struct

from codecstream.protocol.errors import CheckpointError

SPEECH_TOKENIZER_DIR = "speech_tokenizer"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DECODER_PREFIX = "decoder."
#: The speech tokenizer's own config.json model_type: a directory with it is not a model root.
TOKENIZER_MODEL_TYPE = "qwen3_tts_tokenizer_12hz"
_MAX_HEADER_BYTES = 100 << 20


def speech_tokenizer_dir(path: pathlib.Path | str) -> pathlib.Path:
    """The speech-tokenizer directory of `path`: a model root that contains one, or the directory itself."""
    path = pathlib.Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory (expected a checkpoint or its {SPEECH_TOKENIZER_DIR}/)")
    inner = path / SPEECH_TOKENIZER_DIR
    if inner.is_dir() and _model_type(path) != TOKENIZER_MODEL_TYPE:
        return inner
    return path


def decoder_weight_files(path: pathlib.Path | str) -> dict[str, pathlib.Path]:
    """`decoder.*` tensor name -> the file holding it, for a model root, a speech-tokenizer
    directory (one file or shards) or a single .safetensors file."""
    path = pathlib.Path(path)
    if path.is_file():
        return {name: path for name in read_safetensors_header(path)[0] if name.startswith(DECODER_PREFIX)}
    directory = speech_tokenizer_dir(path)
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as error:
            raise CheckpointError(f"{index} is not a safetensors index ({error})") from None
        files = {name: directory / file for name, file in weight_map.items() if name.startswith(DECODER_PREFIX)}
        missing = sorted({file.name for file in files.values() if not file.is_file()})
        if missing:
            raise CheckpointError(f"{index} names shards that are not there: {', '.join(missing)}")
        return files
    single = directory / WEIGHTS_FILE
    if not single.is_file():
        raise CheckpointError(
            f"no speech-tokenizer weights under {path}: {directory} has no {WEIGHTS_FILE} (nor {INDEX_FILE})"
        )
    return decoder_weight_files(single)


def has_decoder_weights(directory: pathlib.Path) -> bool:
    """Whether `directory` looks like a checkpoint (a model root or a speech-tokenizer directory)."""
    return any(
        (base / name).is_file()
        for base in (directory, directory / SPEECH_TOKENIZER_DIR)
        for name in (WEIGHTS_FILE, INDEX_FILE)
    )


def read_safetensors_header(file: pathlib.Path) -> tuple[dict, int]:
    """Return (tensor table, offset of the data section) of a safetensors file."""
    try:
        with open(file, "rb") as handle:
            raw_length = handle.read(8)
            if len(raw_length) != 8:
                raise CheckpointError(f"{file} is not a safetensors file: shorter than its 8-byte header length")
            (header_length,) = struct.unpack("<Q", raw_length)
            if header_length > _MAX_HEADER_BYTES:
                raise CheckpointError(f"{file} is not a safetensors file: header length {header_length} is implausible")
            raw_header = handle.read(header_length)
    except OSError as error:
        raise CheckpointError(f"{file} cannot be read: {error.strerror or error}") from None
    try:
        table = json.loads(raw_header)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{file} is not a safetensors file: header is not JSON ({error})") from None
    if not isinstance(table, dict):
        raise CheckpointError(f"{file} is not a safetensors file: its header is not a JSON object")
    table.pop("__metadata__", None)
    return table, 8 + header_length


def _model_type(directory: pathlib.Path) -> str | None:
    config = directory / "config.json"
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text()).get("model_type")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None

"""The decoder-weights digest: one string that server, exporter and client compute the same way.

It covers tensor names, dtypes, shapes and bytes of the decoder tensors only, so re-saving a
checkpoint, adding encoder weights or changing the file's tensor order does not change it, while
any change to a decoder weight does. Read straight from the safetensors layout (an 8-byte
little-endian header length, a JSON header, raw little-endian data), so no torch is needed.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import struct

from codecstream.protocol.errors import ProtocolError

DECODER_PREFIX = "decoder."
_READ_BLOCK = 1 << 22
_MAX_HEADER_BYTES = 100 << 20


class DigestError(ProtocolError):
    """A checkpoint from which no decoder digest can be computed."""


def find_speech_tokenizer_weights(path: pathlib.Path | str) -> pathlib.Path:
    """Resolve a model dir, a speech_tokenizer dir or a .safetensors file to the codec weights file."""
    path = pathlib.Path(path)
    candidates = (
        [path] if path.is_file() else [path / "speech_tokenizer" / "model.safetensors", path / "model.safetensors"]
    )
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise DigestError(f"no speech-tokenizer weights under {path}: looked for {', '.join(map(str, candidates))}")


def read_safetensors_header(file: pathlib.Path) -> tuple[dict, int]:
    """Return (tensor table, offset of the data section) of a safetensors file."""
    with open(file, "rb") as handle:
        raw_length = handle.read(8)
        if len(raw_length) != 8:
            raise DigestError(f"{file} is not a safetensors file: shorter than its 8-byte header length")
        (header_length,) = struct.unpack("<Q", raw_length)
        if header_length > _MAX_HEADER_BYTES:
            raise DigestError(f"{file} is not a safetensors file: header length {header_length} is implausible")
        try:
            table = json.loads(handle.read(header_length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise DigestError(f"{file} is not a safetensors file: header is not JSON ({error})") from None
    table.pop("__metadata__", None)
    return table, 8 + header_length


def decoder_digest(path: pathlib.Path | str, prefix: str = DECODER_PREFIX) -> str:
    """'sha256:<hex>' over the decoder tensors of a checkpoint (model dir, codec dir or file)."""
    file = find_speech_tokenizer_weights(path)
    table, data_start = read_safetensors_header(file)
    names = sorted(name for name in table if name.startswith(prefix))
    if not names:
        raise DigestError(f"{file} has no tensors named {prefix}*: not a speech-tokenizer decoder checkpoint")
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for name in names:
            entry = table[name]
            begin, end = entry["data_offsets"]
            shape = ",".join(str(d) for d in entry["shape"])
            digest.update(f"{name}\0{entry['dtype']}\0{shape}\0".encode())
            handle.seek(data_start + begin)
            remaining = end - begin
            while remaining:
                block = handle.read(min(remaining, _READ_BLOCK))
                if not block:
                    raise DigestError(f"{file} is truncated: tensor {name} ends past the end of the file")
                digest.update(block)
                remaining -= len(block)
    return "sha256:" + digest.hexdigest()

"""The decoder-weights digest: one string that server, exporter and client compute the same way.

It covers tensor names, dtypes, shapes and bytes of the decoder tensors only, so re-saving a
checkpoint, sharding it, adding encoder weights or changing the file's tensor order does not change
it, while any change to a decoder weight does. Read straight from the safetensors files (where
they are: checkpoint_files.py), so no torch is needed.
"""

from __future__ import annotations

import hashlib
import pathlib

from codecstream.protocol.checkpoint_files import decoder_weight_files, read_safetensors_header
from codecstream.protocol.errors import CheckpointError, DigestError

_READ_BLOCK = 1 << 22


def decoder_digest(path: pathlib.Path | str) -> str:
    """'sha256:<hex>' over the decoder tensors of a checkpoint (model dir, codec dir or file)."""
    try:
        files = decoder_weight_files(path)
        if not files:
            raise DigestError(f"{path} has no tensors named decoder.*: not a speech-tokenizer decoder checkpoint")
        tables = {file: read_safetensors_header(file) for file in set(files.values())}
    except DigestError:
        raise
    except CheckpointError as error:
        raise DigestError(str(error)) from None
    try:
        return _digest(files, tables)
    except OSError as error:
        raise DigestError(f"{path}: a weights file cannot be read: {error.strerror or error}") from None


def digest_label(digest: str) -> str:
    """A decoder digest as a person reads it, named: an artifact file's own sha256 looks the same."""
    return f"decoder digest {digest[:19]}…"


def _digest(files: dict[str, pathlib.Path], tables: dict[pathlib.Path, tuple[dict, int]]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        file = files[name]
        table, data_start = tables[file]
        if name not in table:
            raise DigestError(f"{file} does not hold tensor {name}, which its index names")
        entry = table[name]
        begin, end = entry["data_offsets"]
        shape = ",".join(str(d) for d in entry["shape"])
        digest.update(f"{name}\0{entry['dtype']}\0{shape}\0".encode())
        with open(file, "rb") as handle:
            handle.seek(data_start + begin)
            remaining = end - begin
            while remaining:
                block = handle.read(min(remaining, _READ_BLOCK))
                if not block:
                    raise DigestError(f"{file} is truncated: tensor {name} ends past the end of the file")
                digest.update(block)
                remaining -= len(block)
    return "sha256:" + digest.hexdigest()

"""Where the client keeps what it makes once and reuses in every later process:

$CODECSTREAM_CACHE_DIR, or $XDG_CACHE_HOME/codecstream, or ~/.cache/codecstream
    decoders/<digest folder>/   the server's own decoders, by the file's sha256 (decoder_download.py)
    openvino/<digest folder>/   decoders compiled by OpenVINO (runtimes/openvino_program.py)
    openvino-ops/               codecstream's own OpenVINO operations, built here (runtimes/openvino_extension.py)
    pte-runtime/<key>/          codecstream's ExecuTorch runtime and its runner, built here (runtimes/pte_library.py)
    pte-runtime/trials/         the .pte programs that passed their trial run in a child process (runtimes/pte_trial.py)
"""

from __future__ import annotations

import os
import pathlib


def cache_root() -> pathlib.Path:
    if os.environ.get("CODECSTREAM_CACHE_DIR"):
        return pathlib.Path(os.environ["CODECSTREAM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "codecstream"


def digest_folder_name(digest: str) -> str | None:
    """ "sha256:<hex>" as a folder name every file system takes ("sha256-<hex>": Windows refuses a
    colon); None where the value after the colon is not a hash."""
    algorithm, _, value = digest.partition(":")
    if not (algorithm.isalnum() and value.isalnum()):
        return None
    return f"{algorithm}-{value}"

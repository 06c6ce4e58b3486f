"""Where the client keeps what it makes once and reuses in every later process:

$CODECSTREAM_CACHE_DIR, or $XDG_CACHE_HOME/codecstream, or ~/.cache/codecstream
    decoders/   the server's own decoders, downloaded (decoder_download.py)
    openvino/   decoders compiled by OpenVINO (runtimes/openvino_program.py)
"""

from __future__ import annotations

import os
import pathlib


def cache_root() -> pathlib.Path:
    if os.environ.get("CODECSTREAM_CACHE_DIR"):
        return pathlib.Path(os.environ["CODECSTREAM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "codecstream"

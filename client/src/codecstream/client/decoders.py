"""The decoder a stream decodes with: one loaded decoder shared by any number of streams.

`synthesize` takes an opened decoder or a directory. A directory is opened once per process (per
backend) and kept, so a voice agent that synthesizes every turn does not verify, load and warm
the artifact every turn; every stream then gets `new_stream()` of it, its own state over the same
loaded weights.
"""

from __future__ import annotations

import pathlib
import threading

from codecstream.client.errors import CodecMismatch
from codecstream.client.runtimes.loaded import LoadedDecoder
from codecstream.protocol.decoding import FrameDecoder

_opened: dict[tuple[pathlib.Path, str], LoadedDecoder] = {}
_opening = threading.Lock()


def shared_decoder(decoder: FrameDecoder | str | pathlib.Path, backend: str = "auto") -> LoadedDecoder:
    """`decoder` itself if it is a LoadedDecoder, else the directory it names, opened once."""
    if isinstance(decoder, LoadedDecoder):
        return decoder
    if isinstance(decoder, FrameDecoder):
        raise CodecMismatch(
            f"{type(decoder).__name__} does not say which codec it decodes: "
            "open it with codecstream.client.runtimes.open_decoder"
        )
    from codecstream.client.runtimes import open_decoder

    key = (pathlib.Path(decoder).resolve(), backend)
    with _opening:
        if key not in _opened:
            _opened[key] = open_decoder(decoder, backend=backend)
        return _opened[key]

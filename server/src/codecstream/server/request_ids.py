"""The ids of the requests a stream makes of its source: the stream id, then a dot and the
segment's index for each segment of a streamed text after the first (`SegmentedGeneration`);
an engine may add a suffix of its own after a dash. Both the service layer, which names the
requests, and the engine's scheduler, which lets a stream's later segments go first, read it here."""

from __future__ import annotations

import re

_SEGMENT_REQUEST_ID = re.compile(r"(?P<stream>[^.]+)\.(?P<index>\d+)(?:-.*)?")


def segment_request_id(stream_id: str, index: int) -> str:
    return f"{stream_id}.{index}"


def continues_a_stream(request_id: str) -> bool:
    """Whether a source request is a segment after its stream's first: the stream is already
    speaking, so an engine must not queue it behind streams that arrived after it."""
    match = _SEGMENT_REQUEST_ID.fullmatch(request_id)
    return match is not None and int(match["index"]) > 0

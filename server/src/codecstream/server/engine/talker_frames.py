"""Codec frames out of the talker engine's outputs.

The engine yields one output per decode step. Its `codes.audio` is the whole history so far: first
a tensor with one all-zero row per prompt position, then a list of per-step tensors that grows by
one row of 16 codes per step, and at the end the concatenation. A `FrameCursor` converts only the
rows it has not seen, so per-step work stays O(1), not O(frames so far). Every row is checked
against the codec before it leaves the engine's side.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from codecstream.protocol.codes import validate_codes
from codecstream.protocol.decoding import NUM_CODEBOOKS
from codecstream.protocol.errors import CodesError
from codecstream.server.errors import GenerationFailed
from codecstream.server.source import NO_CODES


class FrameCursor:
    """Where one request is in the engine's growing `codes.audio` history: each output's value
    gives only the frames not taken before, converting only those rows (a list value's older
    parts are never touched), and never the prompt's placeholder rows."""

    def __init__(self, prompt_rows: int) -> None:
        self._prompt_rows = prompt_rows
        #: Rows taken so far (prompt rows included), and how many list parts they fill (None
        #: after a concatenated tensor, until the next list is lined up with them).
        self._rows_seen = 0
        self._parts_seen: int | None = 0

    def advance(self, audio: Any) -> np.ndarray:
        rows_before = self._rows_seen
        rows = self._new_rows(audio)
        return rows[max(0, self._prompt_rows - rows_before) :]

    def _new_rows(self, audio: Any) -> np.ndarray:
        if audio is None:
            return NO_CODES
        if isinstance(audio, (list, tuple)):
            if self._parts_seen is None:
                self._parts_seen, covered = 0, 0
                while self._parts_seen < len(audio) and covered < self._rows_seen:
                    covered += _row_count(audio[self._parts_seen])
                    self._parts_seen += 1
            new_parts = audio[self._parts_seen :]
            self._parts_seen = len(audio)
            rows = np.concatenate([as_frames(part) for part in new_parts]) if new_parts else NO_CODES
        else:
            rows = as_frames(audio.reshape(-1, NUM_CODEBOOKS)[self._rows_seen :])
            self._parts_seen = None
        self._rows_seen += len(rows)
        return rows


def codes_of(output: Any) -> dict:
    """The `codes` of one engine output: "audio" (the history above) and "ref" (a voice clone's
    reference codes, which the talker encoded)."""
    multimodal = output.outputs[0].multimodal_output or {}
    return multimodal.get("codes") or {}


def as_frames(tensor: Any) -> np.ndarray:
    """Rows of codes as (n, 16) int16 frames; GenerationFailed for codes outside the codec."""
    array = tensor.detach().cpu().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
    array = array.reshape(-1, NUM_CODEBOOKS)
    try:
        validate_codes(array)
    except CodesError as error:
        raise GenerationFailed(f"talker produced bad codes: {error}") from None
    return array.astype(np.int16)


def _row_count(part: Any) -> int:
    size = part.numel() if hasattr(part, "numel") else np.asarray(part).size
    return int(size) // NUM_CODEBOOKS

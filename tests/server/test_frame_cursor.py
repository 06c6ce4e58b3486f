"""FrameCursor: each engine output yields exactly its new frames, and per-step work does not grow
with the stream (the engine's codes.audio is the whole history every step)."""

from __future__ import annotations

import numpy as np
import torch
from codecstream.protocol.decoding import CODEBOOK_SIZE, NUM_CODEBOOKS
from codecstream.server.engine.talker_frames import FrameCursor

PROMPT_ROWS = 5


class Untouchable(torch.Tensor):
    """A history part a step must not convert again (it was converted when it was new)."""

    def detach(self):
        raise AssertionError("an old part of the history was converted again")


def rows(first: int, count: int) -> torch.Tensor:
    codes = torch.arange(first * NUM_CODEBOOKS, (first + count) * NUM_CODEBOOKS, dtype=torch.int64)
    return codes.reshape(count, NUM_CODEBOOKS) % CODEBOOK_SIZE


def engine_outputs(frames: int) -> list:
    """What vLLM-Omni hands over for a request of `frames` frames: the prompt rows as one tensor,
    then a growing list of per-step tensors, then the concatenation."""
    prompt = torch.zeros(PROMPT_ROWS, 16, dtype=torch.int64)
    outputs: list = [prompt]
    parts = [prompt]
    for step in range(frames):
        outputs.append([*(part.as_subclass(Untouchable) for part in parts), rows(step, 1)])
        parts.append(rows(step, 1))
    outputs.append(torch.cat([prompt, rows(0, frames)]))
    return outputs


def test_each_output_yields_only_its_new_frames_and_never_the_prompt_rows():
    cursor = FrameCursor(PROMPT_ROWS)
    taken = [cursor.advance(audio) for audio in engine_outputs(12)]
    assert [len(frames) for frames in taken] == [0] + [1] * 12 + [0]
    np.testing.assert_array_equal(np.concatenate(taken), rows(0, 12).numpy())


def test_old_parts_of_the_history_are_never_converted_again():
    cursor = FrameCursor(PROMPT_ROWS)
    for audio in engine_outputs(50):
        cursor.advance(audio)


def test_a_list_after_a_concatenated_tensor_is_lined_up_with_the_rows_already_taken():
    cursor = FrameCursor(PROMPT_ROWS)
    cursor.advance(torch.cat([torch.zeros(PROMPT_ROWS, 16, dtype=torch.int64), rows(0, 3)]))
    prompt = torch.zeros(PROMPT_ROWS, 16, dtype=torch.int64)
    frames = cursor.advance([prompt, rows(0, 1), rows(1, 1), rows(2, 1), rows(3, 1)])
    np.testing.assert_array_equal(frames, rows(3, 1).numpy())

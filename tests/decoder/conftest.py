"""Tiny random-weight checkpoints in the official layout, built once per test session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from codecstream.decoder import Qwen3TTSDecoder, load_decoder
from codecstream.testing.random_speech_tokenizer import write_speech_tokenizer


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The tiny decoder gains nothing from threads, and OpenMP barriers stall on a busy 2-core machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def decode_in_chunks(decoder, codes: np.ndarray, sizes) -> np.ndarray:
    """Feed `codes` to a FrameDecoder in chunks of the given sizes (the last size repeats)."""
    sizes = list(sizes)
    pieces, start, index = [], 0, 0
    while start < len(codes):
        size = sizes[min(index, len(sizes) - 1)]
        pieces.append(decoder.decode(codes[start : start + size]))
        start += size
        index += 1
    return np.concatenate(pieces)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """speech_tokenizer/ directories of the tiny preset, seed 0, for the "mild" and "stressed" inits."""
    root = tmp_path_factory.mktemp("speech_tokenizers")
    return {init: write_speech_tokenizer(root / init, "tiny", seed=0, init=init) for init in ("mild", "stressed")}


@pytest.fixture(scope="session")
def tiny_models(tiny_checkpoints) -> dict[str, Qwen3TTSDecoder]:
    return {init: load_decoder(path) for init, path in tiny_checkpoints.items()}


@pytest.fixture(scope="session")
def tiny_model(tiny_models) -> Qwen3TTSDecoder:
    return tiny_models["mild"]

"""Seeded noise for the code predictor that holds under CUDA graphs.

The code predictor samples codebooks 1-15 of each frame by Gumbel-max from uniform noise.
vLLM-Omni's v1 runner hands it each request's seeded torch.Generator as an argument, but on CUDA
the code predictor runs inside the talker-MTP CUDA graph, and a graph's replay ignores its
arguments: the noise came from the process's default generator, so a seeded request was not
reproducible (codebooks 1-15 differed from the first frame on an H100). Here the noise is drawn
before each step, outside any graph, into one static buffer the graph reads (the code
predictor's `sample_uniforms`), row for row in the order the runner lines up its decode rows.

A row's noise is a function of the request's seed and the frame it samples, nothing else: the
same seeded request gives the same codes alone or in any batch of any composition, however its
text arrived (a growing request's prompt length varies with that; its frame index does not), and
after a preemption. Unseeded rows draw from the default generator.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

#: On by default (talker_model.py draws the code predictor's noise here): on an H100 it made a seeded
#: request equal alone, twice, and inside a batch of 32, where without it no two runs were equal.
#: 0 leaves the noise to vLLM-Omni (seeds then hold only on the CPU engine), to measure the difference.
ENABLE_VARIABLE = "CODECSTREAM_SEEDED_CODE_PREDICTOR_NOISE"
#: The open interval the code predictor draws its uniforms from (its own _UNIFORM_EPS).
_EPS = 1e-20


def enabled() -> bool:
    return os.environ.get(ENABLE_VARIABLE, "1") != "0"


def noise_seed(seed: int, frame: int) -> int:
    """One generator seed per (request seed, frame), well mixed in its low 32 bits too: torch's CPU
    generator keeps only those (its CUDA one takes all 64)."""
    digest = hashlib.blake2b(f"{seed}:{frame}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


class CodePredictorNoise:
    """The static buffer of uniforms, [rows, codebooks - 1, vocabulary] float32, and its filling."""

    def __init__(self, rows: int, steps: int, vocabulary: int, device: torch.device | str) -> None:
        # Finite from the start: rows past a step's batch are padding, read and thrown away.
        self.uniforms = torch.full((rows, steps, vocabulary), 0.5, dtype=torch.float32, device=device)
        self._generator = torch.Generator(device=device)
        self._next_row = 0

    def start_step(self) -> None:
        """A new engine step: its decode rows fill the buffer from the first row on."""
        self._next_row = 0

    def fill(self, req_infos: Iterable[Mapping[str, Any]]) -> None:
        """Draw the noise of the next decode rows, in the order the runner lines them up; each info
        is the runner's per-request dict (its seed, prompt length and tokens computed so far)."""
        infos = list(req_infos)
        seeds = [info.get("_omni_seed") for info in infos]
        frames = [
            int(info.get("_omni_num_computed_tokens") or 0) - int(info.get("_omni_prompt_len") or 0) for info in infos
        ]
        self.fill_rows(seeds, frames)

    def fill_rows(self, seeds: Sequence[int | None], frames: Sequence[int]) -> None:
        """Draw the noise of the next decode rows: each row's request seed (None: unseeded) and the
        frame it samples (tokens computed minus the prompt's)."""
        first, end = self._next_row, self._next_row + len(seeds)
        if end > len(self.uniforms):
            raise RuntimeError(f"more decode rows in one step than the {len(self.uniforms)} the noise holds")
        self._next_row = end
        # Every row from the default generator in one launch (a launch per row cost the host
        # ~64 kernel launches a step at batch 64), then each seeded row redrawn from its own.
        self.uniforms[first:end].uniform_(_EPS, 1.0 - _EPS)
        for row, (seed, frame) in enumerate(zip(seeds, frames, strict=True), start=first):
            if seed is None:
                continue
            self._generator.manual_seed(noise_seed(int(seed), int(frame)))
            self.uniforms[row].uniform_(_EPS, 1.0 - _EPS, generator=self._generator)

    def rows(self, count: int) -> torch.Tensor:
        """The first `count` rows: a view of the one buffer, so a captured graph reads each step's draw."""
        return self.uniforms[:count]

"""The child process of a `.pte`'s trial (pte_trial.py): the program opened and run as the client runs it,
`python -m codecstream.client.runtimes.pte_trial_child DIRECTORY`, which exits 0 when it opened and decoded."""

from __future__ import annotations

import os
import sys

import numpy as np
from codecstream.client.runtimes import DecoderLoadError, open_decoder
from codecstream.client.runtimes.pte_program import RUNTIME_VARIABLE


def main() -> int:
    """The child: open the directory's .pte as the client does (warm-up included), then decode
    the largest chunk of random codes."""
    os.environ[RUNTIME_VARIABLE] = "native"
    try:
        decoder = open_decoder(sys.argv[1], backend="pte", threads=1)
        decoder.reset()
        shape = (decoder.max_chunk_frames, decoder.codec.num_codebooks)
        codes = np.random.default_rng(0).integers(0, decoder.codec.codebook_size, shape)
        decoder.decode(codes)
    except DecoderLoadError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

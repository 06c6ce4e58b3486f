"""Decoding with an exported graph: the stateful step and the 72-frame window, over any Program.

Stateful: `(codes, *state) -> (pcm, *next_state)`; the state (KV caches, conv histories, the
absolute position) starts at zeros and is carried from call to call, so the stream decodes as the
full utterance would. Windowed: `(context_codes, codes, pad_frames) -> pcm`; the decoder keeps
the last `context_frames` codes itself. A context shorter than the graph's minimum (the stream
start) is padded in front and `pad_frames` tells the graph to mask the padding out, which keeps
the output equal to the eager windowed decoder's.
"""

from __future__ import annotations

import numpy as np
from codecstream.client.runtimes.loaded import LoadedDecoder
from codecstream.client.runtimes.program import Program
from codecstream.protocol.manifest import Manifest


class StatefulArtifactDecoder(LoadedDecoder):
    def __init__(self, program: Program, manifest: Manifest, **attributes) -> None:
        super().__init__(**attributes)
        self._program = program
        self.warm_up_sizes = program.warm_up_sizes
        self._state_specs = manifest.state
        self.reset()

    def reset(self) -> None:
        self._state = [self._program.zeros(spec) for spec in self._state_specs]

    def _decode_chunk(self, codes: np.ndarray) -> np.ndarray:
        pcm, *self._state = self._program.run([self._program.tensor(codes[None]), *self._state])
        return self._program.samples(pcm)


class WindowedArtifactDecoder(LoadedDecoder):
    def __init__(self, program: Program, manifest: Manifest, **attributes) -> None:
        super().__init__(**attributes)
        assert manifest.window is not None
        self._program = program
        self.warm_up_sizes = program.warm_up_sizes
        self._context_frames = manifest.window.context_frames
        self._min_context = manifest.window.min_context_frames
        self.reset()

    def reset(self) -> None:
        self._context = np.zeros((0, self.codec.num_codebooks), dtype=np.int64)

    def _decode_chunk(self, codes: np.ndarray) -> np.ndarray:
        pad = max(0, self._min_context - len(self._context))
        padding = np.zeros((pad, self.codec.num_codebooks), dtype=np.int64)
        context = np.concatenate([padding, self._context])
        program = self._program
        (pcm,) = program.run(
            [program.tensor(context[None]), program.tensor(codes[None]), program.tensor(np.array([pad]))]
        )
        self._remember(codes)
        return program.samples(pcm)

    def _prime_chunk(self, codes: np.ndarray) -> None:
        self._remember(codes)

    def _remember(self, codes: np.ndarray) -> None:
        self._context = np.concatenate([self._context, codes])[-self._context_frames :]

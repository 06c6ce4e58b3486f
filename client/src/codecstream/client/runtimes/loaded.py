"""`LoadedDecoder`: the FrameDecoder every runtime returns, with what it is and how far it reaches.

Subclasses decode one chunk of at most `max_chunk_frames` frames; this class checks the codes and
splits longer inputs, so callers may hand it any number of frames.

A LoadedDecoder is one stream's decoder: the loaded weights and runtime plus that stream's state.
`new_stream()` gives another stream its own state over the same weights and runtime, so any number
of streams decode at once with one load; the runtimes are safe to call from several threads.
"""

from __future__ import annotations

import abc
import copy

import numpy as np
from codecstream.protocol.chunking import DEFAULT_RAMP
from codecstream.protocol.codes import validate_codes
from codecstream.protocol.decoding import FrameDecoder
from codecstream.v1 import codec_pb2


class LoadedDecoder(FrameDecoder):
    """A decoder opened by `open_decoder`.

    Attributes: `codec` (the CodecSpec it decodes, decoder digest included), `backend` ("onnx",
    "pte", "pt2" or "torch"), `mode` ("stateful" or "windowed"), `dtype` ("fp32", "bf16",
    "int8"), `max_chunk_frames` (the most frames one graph call takes; `decode` splits longer
    inputs) and `description` (one line for users).
    """

    def __init__(
        self,
        *,
        codec: codec_pb2.CodecSpec,
        backend: str,
        mode: str,
        dtype: str,
        max_chunk_frames: int,
        description: str,
    ) -> None:
        self.codec = codec
        self.backend = backend
        self.mode = mode
        self.dtype = dtype
        self.max_chunk_frames = max_chunk_frames
        self.description = description
        self.sample_rate = codec.sample_rate_hz
        self.samples_per_frame = codec.samples_per_frame

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.description}>"

    def new_stream(self) -> LoadedDecoder:
        """A decoder for another stream: the same loaded weights and runtime, a fresh state of its own."""
        other = copy.copy(self)
        other._new_state()
        return other

    def _new_state(self) -> None:
        """Give this (shallow) copy state objects of its own; by default `reset()` rebinds them all."""
        self.reset()

    def decode(self, codes: np.ndarray) -> np.ndarray:
        codes = self._checked(codes)
        pieces = [self._decode_chunk(piece) for piece in self._pieces(codes)]
        if not pieces:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]

    #: Chunk sizes `warm_up` decodes once each. A runtime that builds kernels or plans memory per
    #: input shape (torch, ExecuTorch, CUDA graphs) pays that on the first call of every size, so
    #: each size of the default ramp, which every stream starts with, is warmed; runtimes whose
    #: first-call cost does not depend on the shape override this.
    warm_up_sizes: tuple[int, ...] = DEFAULT_RAMP

    def warm_up(self) -> None:
        """Decode silent chunks of each of `warm_up_sizes` once and reset, so that no stream, the
        first included, pays a runtime's first-shape cost.

        That cost is measured at real size (docs/performance.md, "Measurements behind the code");
        artifact_bench records the first stream after load chunk by chunk. Sizes above `max_chunk_frames` are
        decoded in pieces, so they warm the pieces' sizes.
        """
        for size in self.warm_up_sizes:
            self.reset()
            self.decode(np.zeros((size, self.codec.num_codebooks), np.int64))
        self.reset()

    def prime(self, codes: np.ndarray) -> None:
        codes = self._checked(codes)
        for piece in self._pieces(codes):
            self._prime_chunk(piece)

    @abc.abstractmethod
    def reset(self) -> None: ...

    @abc.abstractmethod
    def _decode_chunk(self, codes: np.ndarray) -> np.ndarray:
        """(k, Q) int64 codes, 1 <= k <= max_chunk_frames -> (k * samples_per_frame,) float32."""

    def _prime_chunk(self, codes: np.ndarray) -> None:
        """Take frames as context; by default decode them and drop the samples."""
        self._decode_chunk(codes)

    def _checked(self, codes: np.ndarray) -> np.ndarray:
        array = np.asarray(codes)
        if array.ndim == 3 and array.shape[0] == 1:
            array = array[0]
        validate_codes(array, self.codec.num_codebooks, self.codec.codebook_size)
        return array.astype(np.int64, copy=False)

    def _pieces(self, codes: np.ndarray) -> list[np.ndarray]:
        step = self.max_chunk_frames
        return [codes[start : start + step] for start in range(0, len(codes), step)]

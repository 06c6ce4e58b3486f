"""PyTorch from a checkpoint directory (`pip install 'codecstream-client[torch]'`).

The reference implementation, stateful: no export step, no artifact. On a machine where torch
sees a CUDA device (a Jetson with NVIDIA's torch wheel, a desktop GPU) it decodes there, replaying
the step from CUDA graphs (cuda_graphs.py); hide the device (`CUDA_VISIBLE_DEVICES=`) to keep it
on the CPU, where it runs eagerly in fp32.
"""

from __future__ import annotations

import contextlib
import pathlib

import numpy as np
from codecstream.client.runtimes.errors import DecoderLoadError
from codecstream.client.runtimes.loaded import LoadedDecoder
from codecstream.client.runtimes.program import missing_runtime
from codecstream.protocol.chunking import DEFAULT_RAMP, MAX_CHUNK_FRAMES
from codecstream.protocol.codec_spec import qwen3_tts_12hz_spec, spec_differences
from codecstream.protocol.digest import decoder_digest, digest_label
from codecstream.protocol.errors import CheckpointError
from codecstream.v1 import codec_pb2

#: "fp32": float32 weights and math with TF32 off; "tf32": float32 weights, TF32 matmuls and
#: convolutions; "bf16": a bfloat16 copy of the model and state; "bf16-mixed": bf16 weights and
#: matrix products in the front and first conv blocks, the rest and the state in float32
#: (codecstream.decoder.precision). PCM is float32 in every case.
PRECISIONS = ("fp32", "tf32", "bf16", "bf16-mixed")
_CUDA_LABELS = {
    "fp32": "fp32 (TF32 off)",
    "tf32": "fp32 with TF32 matmuls and convolutions",
    "bf16": "bf16",
    "bf16-mixed": "bf16-mixed",
}


class EagerTorchDecoder(LoadedDecoder):
    """The decoder network in torch, from its weights.

    `precision` (one of PRECISIONS) applies on a CUDA device; the CPU decodes in fp32 only.
    `cuda_graphs`: on a CUDA device, replay the step from one CUDA graph per chunk size, captured
    on its first use (`warm_up` captures the default ramp's sizes); False runs it eagerly, which is
    launch-bound there (docs/performance.md, "Decoder on a GPU").
    """

    def __init__(
        self, directory: pathlib.Path, threads: int | None, *, precision: str = "fp32", cuda_graphs: bool = True
    ) -> None:
        try:
            import torch
            from codecstream.decoder import StatefulDecoder, load_decoder
        except ImportError as error:
            raise missing_runtime("the eager torch decoder (torch, codecstream-decoder)", "torch", error) from None
        cuda = torch.cuda.is_available()
        if precision not in PRECISIONS:
            raise DecoderLoadError(f"unknown precision {precision!r}, expected one of {', '.join(PRECISIONS)}")
        if precision != "fp32" and not cuda:
            raise DecoderLoadError(
                f"precision {precision!r} needs a CUDA device and torch sees none here; "
                "on the CPU the torch runtime decodes in fp32 only"
            )
        if threads:
            torch.set_num_threads(threads)  # process-wide in torch
        try:
            digest = decoder_digest(directory)
            model = load_decoder(directory)
        except CheckpointError as error:
            raise DecoderLoadError(str(error)) from None
        codec = qwen3_tts_12hz_spec(digest)
        config = model.config
        found = codec_pb2.CodecSpec()
        found.CopyFrom(codec)
        found.num_codebooks = config.num_quantizers
        found.codebook_size = config.codebook_size
        found.sample_rate_hz = config.sample_rate
        found.samples_per_frame = config.samples_per_frame
        found.decoder_left_context_frames = config.sliding_window
        differences = spec_differences(codec, found)
        if differences:
            raise DecoderLoadError(
                f"{directory}: codec mismatch: not a {codec.codec_name} {codec.codec_version} decoder: "
                f"{', '.join(differences)}"
            )
        device = torch.device("cuda" if cuda else "cpu")
        graphs = cuda and cuda_graphs
        if not cuda:
            how = f"fp32 eager torch {torch.__version__} on cpu"
        else:
            runs = "with CUDA graphs per chunk size" if graphs else "eager"
            how = f"{_CUDA_LABELS[precision]} torch {torch.__version__} {runs} on {torch.cuda.get_device_name(device)}"
        super().__init__(
            codec=codec,
            backend="torch",
            mode="stateful",
            dtype=precision if precision.startswith("bf16") else "fp32",
            max_chunk_frames=MAX_CHUNK_FRAMES,
            description=f"stateful {how} from {directory} ({digest_label(digest)})",
        )
        self.precision = precision
        if cuda:
            from codecstream.client.runtimes.cuda_graphs import GraphedStep, float32_precision

            def device_calls():
                return float32_precision(precision == "tf32")
        else:
            device_calls = contextlib.nullcontext

        class OnDevice(StatefulDecoder):
            def codes_tensor(self, codes):
                return super().codes_tensor(codes).to(device)

            def decode(self, codes):
                with device_calls():
                    return self.decode_tensor(codes).float().cpu().numpy()

            def prime(self, codes):
                # The eager decoder primes old context through the transformer only: much cheaper.
                with device_calls():
                    self.prime_tensor(codes)

        model = model.to(device)
        if precision == "bf16":
            model = model.to(torch.bfloat16)
        elif precision == "bf16-mixed":
            from codecstream.decoder.precision import mixed_precision

            model = mixed_precision(model)
        self._model = model
        # Every stream of this decoder replays the same graphs, from a state of its own.
        self._graphs = GraphedStep(OnDevice(self._model), tf32=precision == "tf32") if graphs else None
        self._new_stream_state = self._graphs.new_stream if self._graphs else lambda: OnDevice(self._model)
        self._stream = self._new_stream_state()
        if self._graphs:
            # Every size up to the ramp's largest: a stream's last chunk can be any of them, and a
            # capture costs tens of milliseconds (docs/performance.md, "Decoder on a GPU").
            self.warm_up_sizes = tuple(range(1, max(DEFAULT_RAMP) + 1))

    @property
    def capture_seconds(self) -> dict[int, float]:
        """Chunk size -> seconds its CUDA graph took to capture; empty when the step runs eagerly."""
        return dict(self._graphs.capture_seconds) if self._graphs else {}

    def _new_state(self) -> None:
        self._stream = self._new_stream_state()

    def reset(self) -> None:
        self._stream.reset()

    def _decode_chunk(self, codes: np.ndarray) -> np.ndarray:
        return self._stream.decode(codes)

    def _prime_chunk(self, codes: np.ndarray) -> None:
        self._stream.prime(codes)

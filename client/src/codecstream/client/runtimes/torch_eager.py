"""Eager PyTorch from a checkpoint directory (`pip install 'codecstream-client[torch]'`).

The reference implementation, stateful: no export step, no artifact. On a machine where torch
sees a CUDA device (a Jetson with NVIDIA's torch wheel, a desktop GPU) it decodes there; hide the
device (`CUDA_VISIBLE_DEVICES=`) to keep it on the CPU.
"""

from __future__ import annotations

import pathlib

import numpy as np
from codecstream.client.runtimes.errors import DecoderLoadError
from codecstream.client.runtimes.loaded import LoadedDecoder
from codecstream.client.runtimes.program import missing_runtime
from codecstream.protocol.chunking import MAX_CHUNK_FRAMES
from codecstream.protocol.codec_spec import qwen3_tts_12hz_spec, spec_differences
from codecstream.protocol.digest import DigestError, decoder_digest
from codecstream.v1 import codec_pb2


def looks_like_checkpoint(directory: pathlib.Path) -> bool:
    return any(
        (directory / name).is_file()
        for name in ("model.safetensors", "speech_tokenizer/model.safetensors", "model.safetensors.index.json")
    )


class EagerTorchDecoder(LoadedDecoder):
    def __init__(self, directory: pathlib.Path, threads: int | None) -> None:
        try:
            import torch
            from codecstream.decoder import CheckpointError, StatefulDecoder, load_decoder
        except ImportError as error:
            raise missing_runtime("the eager torch decoder (torch, codecstream-decoder)", "torch", error) from None
        if threads:
            torch.set_num_threads(threads)  # process-wide in torch
        try:
            digest = decoder_digest(directory)
            model = load_decoder(directory)
        except (CheckpointError, DigestError) as error:
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
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        super().__init__(
            codec=codec,
            backend="torch",
            mode="stateful",
            dtype="fp32",
            max_chunk_frames=MAX_CHUNK_FRAMES,
            description=f"stateful fp32 eager torch {torch.__version__} on {device.type} "
            f"from {directory} ({digest[:19]}…)",
        )

        class OnDevice(StatefulDecoder):
            def codes_tensor(self, codes):
                return super().codes_tensor(codes).to(device)

        self._model = model.to(device)
        self._decoder = OnDevice(self._model)

    def _new_state(self) -> None:
        # StatefulDecoder holds its state: another stream needs another one over the same model.
        self._decoder = type(self._decoder)(self._model)

    def reset(self) -> None:
        self._decoder.reset()

    def _decode_chunk(self, codes: np.ndarray) -> np.ndarray:
        return self._decoder.decode_tensor(codes).float().cpu().numpy()

    def _prime_chunk(self, codes: np.ndarray) -> None:
        # The eager decoder primes old context through the transformer only: much cheaper.
        self._decoder.prime(codes)

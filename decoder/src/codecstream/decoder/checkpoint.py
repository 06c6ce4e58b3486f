"""Loading the decoder from an official `speech_tokenizer/` directory (config.json + model.safetensors).

Where the weights are is the protocol's one layout rule (checkpoint_files.py: a model root or the
directory itself, one file or shards). Only the `decoder.*` tensors are read (the encoder is for
voice-clone encoding, not needed here). Every expected tensor must be present with its expected
shape; anything wrong is reported in one CheckpointError that names the tensors and the directory.
"""

from __future__ import annotations

from pathlib import Path

import torch
from codecstream.decoder.config import DecoderConfig
from codecstream.decoder.model import Qwen3TTSDecoder
from codecstream.protocol.checkpoint_files import DECODER_PREFIX, decoder_weight_files, speech_tokenizer_dir
from codecstream.protocol.errors import CheckpointError
from safetensors import SafetensorError, safe_open

_LISTED = 5


def _read_tensors(files: dict[str, Path]) -> dict[str, torch.Tensor]:
    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    tensors = {}
    for file, names in by_file.items():
        try:
            with safe_open(file, framework="pt") as handle:
                for name in names:
                    tensors[name.removeprefix(DECODER_PREFIX)] = handle.get_tensor(name)
        except (OSError, SafetensorError) as error:
            raise CheckpointError(f"{file}: its tensors cannot be read ({str(error).splitlines()[0]})") from None
    return tensors


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")


def check_state_dict(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], source: str) -> None:
    """Raise CheckpointError naming missing, unexpected and wrongly shaped tensors (without the prefix)."""
    problems = []
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing and len(missing) == len(expected):
        raise CheckpointError(
            f"{source}: contains no Qwen3-TTS-Tokenizer-12Hz decoder tensors "
            f"(expected names like {DECODER_PREFIX}{next(iter(expected))})"
        )
    if missing:
        problems.append(f"missing {len(missing)} tensors: " + _listing([DECODER_PREFIX + n for n in missing]))
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} tensors: " + _listing([DECODER_PREFIX + n for n in unexpected]))
    wrong = [
        f"{DECODER_PREFIX}{name} has shape {tuple(found[name].shape)}, expected {tuple(tensor.shape)}"
        for name, tensor in expected.items()
        if name in found and found[name].shape != tensor.shape
    ]
    if wrong:
        problems.append(f"{len(wrong)} tensors with the wrong shape: " + "; ".join(wrong[:_LISTED]))
    if problems:
        raise CheckpointError(f"{source}: not a checkpoint for this decoder config: " + "; ".join(problems))


def load_decoder(path: str | Path, dtype: torch.dtype = torch.float32) -> Qwen3TTSDecoder:
    """Build the decoder described by `path/config.json` and load its `decoder.*` weights, in eval mode."""
    directory = speech_tokenizer_dir(path)
    config = DecoderConfig.from_file(directory / "config.json")
    model = Qwen3TTSDecoder(config)
    found = _read_tensors(decoder_weight_files(directory))
    check_state_dict(model.state_dict(), found, str(directory))
    model.load_state_dict({name: tensor.to(torch.float32) for name, tensor in found.items()})
    return model.to(dtype).eval()

"""Loading the decoder from an official `speech_tokenizer/` directory (config.json + model.safetensors).

Only the `decoder.*` tensors are read (the encoder is for voice-clone encoding, not needed here).
Every expected tensor must be present with its expected shape; anything wrong is reported in one
CheckpointError that names the tensors and the directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from codecstream.decoder.config import DecoderConfig
from codecstream.decoder.errors import CheckpointError
from codecstream.decoder.model import Qwen3TTSDecoder
from safetensors import safe_open

PREFIX = "decoder."
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SUBFOLDER = "speech_tokenizer"
_LISTED = 5


def resolve_speech_tokenizer_dir(path: str | Path) -> Path:
    """Accept the `speech_tokenizer/` directory itself or a Qwen3-TTS model root that contains it."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory (expected a speech_tokenizer/ checkpoint directory)")
    if not (path / "config.json").exists() and (path / SUBFOLDER / "config.json").exists():
        return path / SUBFOLDER
    if (path / "config.json").exists() and (path / SUBFOLDER).is_dir():
        root_type = json.loads((path / "config.json").read_text()).get("model_type")
        if root_type != "qwen3_tts_tokenizer_12hz":
            return path / SUBFOLDER
    return path


def _weight_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> file holding it, for `decoder.*` tensors (single file or sharded index)."""
    index = directory / INDEX_FILE
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return {name: directory / file for name, file in weight_map.items() if name.startswith(PREFIX)}
    single = directory / WEIGHTS_FILE
    if not single.exists():
        raise CheckpointError(f"{directory}: has no {WEIGHTS_FILE} (nor {INDEX_FILE})")
    try:
        with safe_open(single, framework="pt") as handle:
            names = list(handle.keys())
    except Exception as err:  # safetensors raises its own error types for a corrupt header
        raise CheckpointError(f"{single}: not a readable safetensors file ({err})") from None
    return {name: single for name in names if name.startswith(PREFIX)}


def _read_tensors(files: dict[str, Path]) -> dict[str, torch.Tensor]:
    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    tensors = {}
    for file, names in by_file.items():
        with safe_open(file, framework="pt") as handle:
            for name in names:
                tensors[name[len(PREFIX) :]] = handle.get_tensor(name)
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
            f"(expected names like {PREFIX}{next(iter(expected))})"
        )
    if missing:
        problems.append(f"missing {len(missing)} tensors: " + _listing([PREFIX + n for n in missing]))
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} tensors: " + _listing([PREFIX + n for n in unexpected]))
    wrong = [
        f"{PREFIX}{name} has shape {tuple(found[name].shape)}, expected {tuple(tensor.shape)}"
        for name, tensor in expected.items()
        if name in found and found[name].shape != tensor.shape
    ]
    if wrong:
        problems.append(f"{len(wrong)} tensors with the wrong shape: " + "; ".join(wrong[:_LISTED]))
    if problems:
        raise CheckpointError(f"{source}: not a checkpoint for this decoder config: " + "; ".join(problems))


def load_decoder(path: str | Path, dtype: torch.dtype = torch.float32) -> Qwen3TTSDecoder:
    """Build the decoder described by `path/config.json` and load its `decoder.*` weights, in eval mode."""
    directory = resolve_speech_tokenizer_dir(path)
    config = DecoderConfig.from_file(directory / "config.json")
    model = Qwen3TTSDecoder(config)
    found = _read_tensors(_weight_files(directory))
    check_state_dict(model.state_dict(), found, str(directory))
    model.load_state_dict({name: tensor.to(torch.float32) for name, tensor in found.items()})
    return model.to(dtype).eval()

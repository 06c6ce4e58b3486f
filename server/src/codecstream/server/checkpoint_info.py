"""What a Qwen3-TTS checkpoint serves, read from its own files before the engine loads it.

The talker's config.json names the checkpoint's variant (tts_model_type: custom_voice, base,
voice_design), its preset voices (talker_config.spk_id) and its languages
(talker_config.codec_language_id); the speech tokenizer's decoder weights identify the decoder
a client must use for the codes (the digest of codecstream.protocol).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path

from codecstream.protocol import decoder_digest, qwen3_tts_12hz_spec
from codecstream.server.request import AUTO_LANGUAGE, ModelOffering, TaskType, VoiceInfo
from codecstream.v1 import codec_pb2

_VARIANT_TASKS = {
    "custom_voice": TaskType.CUSTOM_VOICE,
    "base": TaskType.BASE,
    "voice_design": TaskType.VOICE_DESIGN,
}


class ModelDirectoryError(ValueError):
    """A model directory (or hub id) that is not a Qwen3-TTS-12Hz checkpoint the talker can serve."""


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    task_type: TaskType
    #: Preset voice name (lower case, as in spk_id) -> codec token id, in the checkpoint's order.
    voices: dict[str, int]
    #: Language name (lower case, as in codec_language_id) -> codec token id; "auto" is implicit.
    #: The whole table, dialects included: the talker's prompt length depends on it.
    languages: dict[str, int]
    #: Voice name -> dialect language the talker switches to for Chinese/Auto (or "").
    voice_dialects: dict[str, str]
    codec: codec_pb2.CodecSpec

    def offering(self) -> ModelOffering:
        """What a server of this checkpoint offers, the same whether it runs the engine or replays."""
        return offering_of((self.task_type,), self.voices, self.languages, self.voice_dialects)


def offering_of(
    task_types: tuple[TaskType, ...], voices: Iterable[str], languages: Iterable[str], voice_dialects: dict[str, str]
) -> ModelOffering:
    """What a model with these talker tables (spk_id, codec_language_id, spk_is_dialect) offers.

    Languages are spelled as users write them ("English"), Auto first. The dialect entries
    (beijing_dialect, sichuan_dialect) are not languages to ask for: the talker switches a dialect
    voice to its dialect by itself (for Chinese and Auto text), and qwen-tts refuses them."""
    names = sorted(name.title() for name in languages if "dialect" not in name)

    def description(voice: str) -> str:
        dialect = voice_dialects.get(voice)
        return f"speaks Chinese in {dialect.replace('_', ' ').title()}" if dialect else ""

    return ModelOffering(
        task_types=task_types,
        voices=tuple(VoiceInfo(name, description=description(name)) for name in voices),
        languages=(AUTO_LANGUAGE, *names),
    )


def resolve_model_dir(model: str) -> Path:
    """A local checkpoint directory for `model`: the path itself, or the hub snapshot it names."""
    path = Path(model)
    if path.is_dir():
        return path
    if path.exists() or model.startswith((".", "/")):
        raise ModelDirectoryError(f"model {model!r} is not a directory")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model))
    except Exception as error:
        raise ModelDirectoryError(
            f"model {model!r} is neither a local directory nor a reachable hub id: {error}"
        ) from error


def read_checkpoint_info(model_dir: Path) -> CheckpointInfo:
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise ModelDirectoryError(f"{model_dir} has no config.json: not a Qwen3-TTS checkpoint")
    config = json.loads(config_file.read_text())
    if config.get("model_type") != "qwen3_tts":
        raise ModelDirectoryError(f"{config_file}: model_type is {config.get('model_type')!r}, expected 'qwen3_tts'")
    variant = str(config.get("tts_model_type", "")).lower()
    if variant not in _VARIANT_TASKS:
        raise ModelDirectoryError(
            f"{config_file}: tts_model_type is {config.get('tts_model_type')!r}, "
            f"expected one of {sorted(_VARIANT_TASKS)}"
        )
    talker = config.get("talker_config") or {}
    spk_is_dialect = talker.get("spk_is_dialect") or {}
    return CheckpointInfo(
        path=model_dir,
        task_type=_VARIANT_TASKS[variant],
        voices={name.lower(): int(token) for name, token in (talker.get("spk_id") or {}).items()},
        languages={name.lower(): int(token) for name, token in (talker.get("codec_language_id") or {}).items()},
        voice_dialects={name.lower(): dialect for name, dialect in spk_is_dialect.items() if isinstance(dialect, str)},
        codec=qwen3_tts_12hz_spec(decoder_digest(model_dir)),
    )

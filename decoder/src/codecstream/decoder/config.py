"""The decoder's hyper-parameters, read from the official `speech_tokenizer/config.json`."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from codecstream.decoder.errors import CheckpointError
from codecstream.protocol.checkpoint_files import TOKENIZER_MODEL_TYPE as MODEL_TYPE
from codecstream.protocol.codec_spec import QWEN3_TTS_12HZ_LEFT_CONTEXT
from codecstream.protocol.decoding import CODEBOOK_SIZE, NUM_CODEBOOKS, SAMPLE_RATE_HZ, SAMPLES_PER_FRAME


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """The `decoder_config` block plus the top-level rates the decoder depends on."""

    codebook_size: int = CODEBOOK_SIZE
    codebook_dim: int = 512
    latent_dim: int = 1024
    decoder_dim: int = 1536
    hidden_size: int = 512
    intermediate_size: int = 1024
    head_dim: int = 64
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    num_hidden_layers: int = 8
    layer_scale_initial_scale: float = 0.01
    max_position_embeddings: int = 8000
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    #: The frames of left context each frame's attention sees: the codec spec's decoder_left_context_frames.
    sliding_window: int = QWEN3_TTS_12HZ_LEFT_CONTEXT
    num_quantizers: int = NUM_CODEBOOKS
    num_semantic_quantizers: int = 1
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    hidden_act: str = "silu"
    attention_bias: bool = False
    sample_rate: int = SAMPLE_RATE_HZ
    decode_upsample_rate: int = SAMPLES_PER_FRAME

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

    @property
    def output_channels(self) -> int:
        """Channels entering the last SnakeBeta and the final 1-channel conv (96 at real size)."""
        return self.decoder_dim // 2 ** len(self.upsample_rates)

    def validate(self) -> None:
        """Raise CheckpointError if the numbers cannot describe this codec's decoder."""
        problems = []
        if self.samples_per_frame != self.decode_upsample_rate:
            problems.append(
                f"upsample_rates {list(self.upsample_rates)} x upsampling_ratios "
                f"{list(self.upsampling_ratios)} give {self.samples_per_frame} samples per frame, "
                f"decode_upsample_rate says {self.decode_upsample_rate}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if not 0 < self.num_semantic_quantizers < self.num_quantizers:
            problems.append(
                f"num_semantic_quantizers {self.num_semantic_quantizers} must be between 1 and "
                f"num_quantizers - 1 ({self.num_quantizers - 1})"
            )
        if self.codebook_dim % 2:
            problems.append(f"codebook_dim {self.codebook_dim} must be even")
        if self.decoder_dim % 2 ** len(self.upsample_rates):
            problems.append(f"decoder_dim {self.decoder_dim} is not divisible by 2**{len(self.upsample_rates)}")
        if self.hidden_act != "silu":
            problems.append(f"hidden_act {self.hidden_act!r} is not supported, expected 'silu'")
        if self.sliding_window < 1:
            problems.append(f"sliding_window {self.sliding_window} must be at least 1")
        if problems:
            raise CheckpointError("invalid decoder config: " + "; ".join(problems))

    @classmethod
    def from_json_dict(cls, raw: dict[str, Any], source: str = "config.json") -> DecoderConfig:
        """Build from the whole `speech_tokenizer/config.json` dictionary."""
        model_type = raw.get("model_type")
        if model_type != MODEL_TYPE:
            raise CheckpointError(
                f"{source}: model_type is {model_type!r}, expected {MODEL_TYPE!r} "
                "(the Qwen3-TTS-Tokenizer-12Hz speech tokenizer)"
            )
        block = raw.get("decoder_config")
        if not isinstance(block, dict):
            raise CheckpointError(f"{source}: has no decoder_config object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        required = [
            "codebook_size", "codebook_dim", "latent_dim", "decoder_dim", "hidden_size",
            "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
            "num_quantizers", "sliding_window", "upsample_rates", "upsampling_ratios",
        ]  # fmt: skip
        missing = [name for name in required if name not in block]
        if missing:
            raise CheckpointError(f"{source}: decoder_config lacks {', '.join(missing)}")
        values: dict[str, Any] = {}
        for name in fields:
            if name in block:
                value = block[name]
                if name in ("upsample_rates", "upsampling_ratios"):
                    value = tuple(int(v) for v in value)
                values[name] = value
        if "head_dim" not in block:
            values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
        if "output_sample_rate" in raw:
            values["sample_rate"] = int(raw["output_sample_rate"])
        if "decode_upsample_rate" in raw:
            values["decode_upsample_rate"] = int(raw["decode_upsample_rate"])
        config = cls(**values)
        config.validate()
        return config

    @classmethod
    def from_file(cls, path: Path) -> DecoderConfig:
        try:
            raw = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise CheckpointError(f"{path}: not found (expected speech_tokenizer/config.json)") from None
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{path}: not valid JSON ({err})") from None
        return cls.from_json_dict(raw, source=str(path))

    def to_json_block(self) -> dict[str, Any]:
        """The `decoder_config` block as the official file writes it."""
        return {
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "latent_dim": self.latent_dim,
            "codebook_dim": self.codebook_dim,
            "codebook_size": self.codebook_size,
            "decoder_dim": self.decoder_dim,
            "hidden_act": self.hidden_act,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "layer_scale_initial_scale": self.layer_scale_initial_scale,
            "max_position_embeddings": self.max_position_embeddings,
            "head_dim": self.head_dim,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "num_quantizers": self.num_quantizers,
            "num_semantic_quantizers": self.num_semantic_quantizers,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "semantic_codebook_size": 4096,
            "sliding_window": self.sliding_window,
            "upsample_rates": list(self.upsample_rates),
            "upsampling_ratios": list(self.upsampling_ratios),
            "vector_quantization_hidden_dimension": self.codebook_dim,
        }

"""Complete random-weight Qwen3-TTS checkpoints in the official layout, for tests and benchmarks.

No model hub is reachable here, so the server is tested on checkpoints built from code. The
directory is what a released Qwen3-TTS-12Hz model looks like, and what vLLM-Omni's loading code
reads:

    config.json              the release's config.json (tests/data/ holds the 0.6B CustomVoice one):
                             its special ids, speakers, dialect voices and languages in the
                             released order; the sizes of the preset; speaker_encoder_config for
                             the Base variant only
    model.safetensors        talker.model.*, talker.codec_head, talker.text_projection.*,
                             talker.code_predictor.* (q/k/v and gate/up stored split, as HF does);
                             speaker_encoder.* for the Base variant; bfloat16 like the release
    vocab.json, merges.txt, tokenizer_config.json, tokenizer.json
                             a stand-in text tokenizer with the special tokens on their real ids
    speech_tokenizer/        config.json, preprocessor_config.json, model.safetensors with
                             decoder.* (codecstream.decoder's builder) and encoder.* (added here)

Presets: "tiny" (tests: every width small, but head_dim 64 because vLLM's CPU attention needs
>= 64), "0.6b" and "1.7b" (the shapes of Qwen3-TTS-12Hz-0.6B and -1.7B, with the real-size codec,
for measurements).

Random weights would almost never emit codec EOS (about 1 in 2048 per frame), so every
utterance would run to the frame limit. The talker is therefore given one deliberate "EOS
channel": every codec embedding carries a constant on residual channel 0, and the codec-head row
of EOS reads that channel, with a weight chosen so that under the deploy defaults (top-k 50,
temperature 0.9) an utterance lasts `mean_frames` frames on average (a geometric distribution:
any single request may stop much earlier or later; seeded requests are reproducible). The constant
dominates the residual stream, so the other codebook-0 logits stay near zero and codes are close to
uniformly random, which is all the tests need of them.

The same (preset, variant, seed, mean_frames) always writes the same bytes.

    python -m codecstream.testing.random_checkpoint OUT --preset tiny|0.6b|1.7b [--variant custom_voice]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from codecstream.protocol.checkpoint_files import SPEECH_TOKENIZER_DIR, TOKENIZER_MODEL_TYPE, WEIGHTS_FILE
from codecstream.protocol.decoding import CODEBOOK_SIZE, NUM_CODEBOOKS, SAMPLE_RATE_HZ
from codecstream.protocol.release import (
    CODEC_EOS_TOKEN_ID,
    CODEC_IDS,
    DIALECT_IDS,
    LANGUAGE_IDS,
    SPEAKER_DIALECTS,
    SPEAKER_IDS,
)
from codecstream.testing.random_text_tokenizer import WHOLE_WORDS, write_text_tokenizer
from safetensors.torch import load_file, save_file

VARIANTS = ("custom_voice", "base", "voice_design")

# Top-level text-side ids of the release (Qwen's <|im_start|>, <|im_end|> and the TTS additions).
TEXT_IDS = {
    "im_start_token_id": 151644,
    "im_end_token_id": 151645,
    "tts_pad_token_id": 151671,
    "tts_bos_token_id": 151672,
    "tts_eos_token_id": 151673,
}
TEXT_VOCAB_SIZE = 151936
TALKER_VOCAB_SIZE = 3072
INIT_STD = 0.02
# Deploy defaults the EOS channel is tuned for (server/src/codecstream/server/deploy/*.yaml).
SAMPLING_TOP_K = 50
SAMPLING_TEMPERATURE = 0.9
EOS_CHANNEL = 0
# Large enough that channel 0 dominates the residual stream through the random layers (whose
# contributions stay around 0.1 per channel), so after the final RMSNorm it sits at ~sqrt(hidden)
# and every other channel is near zero.
EOS_CHANNEL_LEVEL = 32.0


@dataclasses.dataclass(frozen=True)
class TransformerShape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int


@dataclasses.dataclass(frozen=True)
class Preset:
    talker: TransformerShape
    code_predictor: TransformerShape
    text_hidden_size: int
    mrope_section: tuple[int, int, int]
    speaker_encoder: dict
    decoder_preset: str
    tts_model_size: str
    mean_frames: float


def _speaker_encoder(enc_dim: int, channels: int = 512, attention_channels: int = 128) -> dict:
    """An ECAPA-TDNN speaker encoder of the released layout (its x-vector as wide as the talker);
    the released checkpoints' is `_speaker_encoder(enc_dim)`, the tiny preset's a narrow one."""
    return {
        "mel_dim": 128,
        "enc_dim": enc_dim,
        "enc_channels": [channels] * 4 + [3 * channels],
        "enc_kernel_sizes": [5, 3, 3, 3, 1],
        "enc_dilations": [1, 2, 3, 4, 1],
        "enc_attention_channels": attention_channels,
        "enc_res2net_scale": 8,
        "enc_se_channels": attention_channels,
        "sample_rate": SAMPLE_RATE_HZ,
    }


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        talker=TransformerShape(128, 2, 2, 1, 64, 256),
        code_predictor=TransformerShape(128, 1, 2, 1, 64, 256),
        text_hidden_size=128,
        mrope_section=(12, 10, 10),
        speaker_encoder=_speaker_encoder(128, channels=32, attention_channels=16),
        decoder_preset="tiny",
        tts_model_size="tiny",
        mean_frames=40.0,
    ),
    "0.6b": Preset(
        talker=TransformerShape(1024, 28, 16, 8, 128, 3072),
        code_predictor=TransformerShape(1024, 5, 16, 8, 128, 3072),
        text_hidden_size=2048,
        mrope_section=(24, 20, 20),
        speaker_encoder=_speaker_encoder(enc_dim=1024),
        decoder_preset="real",
        tts_model_size="0b6",
        mean_frames=100.0,
    ),
    # Qwen3-TTS-12Hz-1.7B: a talker twice as wide (its code predictor stays 1024 wide, fed through
    # small_to_mtp_projection).
    "1.7b": Preset(
        talker=TransformerShape(2048, 28, 16, 8, 128, 6144),
        code_predictor=TransformerShape(1024, 5, 16, 8, 128, 3072),
        text_hidden_size=2048,
        mrope_section=(24, 20, 20),
        speaker_encoder=_speaker_encoder(enc_dim=2048),
        decoder_preset="real",
        tts_model_size="1b7",
        mean_frames=100.0,
    ),
}


def qwen3_tts_config(preset: Preset, variant: str) -> dict:
    """The root config.json of a Qwen3-TTS-12Hz checkpoint of this shape and variant, as released.

    Left out are only the fields transformers adds to every config it saves (generation defaults,
    label maps, export flags: tests/testing/test_release_config.py lists them); the loader reads
    none of them from a Qwen3-TTS checkpoint. The release writes no dtype either: the deploy YAML
    names it. Base and VoiceDesign have no preset voices, so no dialect voices and no dialects.
    """
    talker, predictor = preset.talker, preset.code_predictor
    custom_voice = variant == "custom_voice"
    talker_config = {
        "model_type": "qwen3_tts_talker",
        "vocab_size": TALKER_VOCAB_SIZE,
        "text_vocab_size": TEXT_VOCAB_SIZE,
        "text_hidden_size": preset.text_hidden_size,
        **_shape_fields(talker),
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        # "type" is the older spelling of "rope_type"; the release carries both.
        "rope_scaling": {
            "interleaved": True,
            "mrope_section": list(preset.mrope_section),
            "rope_type": "default",
            "type": "default",
        },
        "attention_bias": False,
        "attention_dropout": 0,
        "use_sliding_window": False,
        "sliding_window": None,
        "use_cache": True,
        "num_code_groups": NUM_CODEBOOKS,
        "position_id_per_seconds": 13,
        **CODEC_IDS,
        "pad_token_id": CODEC_IDS["codec_pad_id"],
        "codec_language_id": {**LANGUAGE_IDS, **DIALECT_IDS} if custom_voice else dict(LANGUAGE_IDS),
        "spk_id": dict(SPEAKER_IDS) if custom_voice else {},
        "spk_is_dialect": {name: SPEAKER_DIALECTS.get(name, False) for name in SPEAKER_IDS} if custom_voice else {},
        "code_predictor_config": {
            "model_type": "qwen3_tts_talker_code_predictor",
            "vocab_size": CODEBOOK_SIZE,
            **_shape_fields(predictor),
            "hidden_act": "silu",
            "max_position_embeddings": 65536,
            "initializer_range": 0.02,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000,
            "rope_scaling": None,
            "attention_bias": False,
            "attention_dropout": 0,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": 28,
            "layer_types": ["full_attention"] * predictor.num_hidden_layers,
            "use_cache": True,
            "tie_word_embeddings": False,
            "num_code_groups": NUM_CODEBOOKS,
        },
    }
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": TOKENIZER_MODEL_TYPE,
        "tts_model_size": preset.tts_model_size,
        "tts_model_type": variant,
        "assistant_token_id": WHOLE_WORDS["assistant"],
        **TEXT_IDS,
        "talker_config": talker_config,
        # The release's version stamp; transformers 5 also reads it to tell a Qwen tokenizer from a
        # Mistral one that needs its regex fixed (and warns without it).
        "transformers_version": "4.57.3",
    }
    if variant == "base":
        config["speaker_encoder_config"] = dict(preset.speaker_encoder)
    return config


def _shape_fields(shape: TransformerShape) -> dict:
    return dataclasses.asdict(shape)


class _RandomTensors:
    """Deterministic random tensors drawn in a fixed order from one seeded generator."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def normal(self, *shape: int, std: float = INIT_STD) -> torch.Tensor:
        return torch.empty(shape).normal_(0.0, std, generator=self.generator)


def _decoder_stack(rand: _RandomTensors, prefix: str, shape: TransformerShape) -> Iterator[tuple[str, torch.Tensor]]:
    """A Qwen3 decoder stack in HF naming: q/k/v and gate/up stored as separate projections."""
    h, q, kv = shape.hidden_size, shape.num_attention_heads * shape.head_dim, shape.num_key_value_heads * shape.head_dim
    for layer in range(shape.num_hidden_layers):
        p = f"{prefix}layers.{layer}."
        yield p + "self_attn.q_proj.weight", rand.normal(q, h)
        yield p + "self_attn.k_proj.weight", rand.normal(kv, h)
        yield p + "self_attn.v_proj.weight", rand.normal(kv, h)
        yield p + "self_attn.o_proj.weight", rand.normal(h, q)
        yield p + "self_attn.q_norm.weight", torch.ones(shape.head_dim)
        yield p + "self_attn.k_norm.weight", torch.ones(shape.head_dim)
        yield p + "mlp.gate_proj.weight", rand.normal(shape.intermediate_size, h)
        yield p + "mlp.up_proj.weight", rand.normal(shape.intermediate_size, h)
        yield p + "mlp.down_proj.weight", rand.normal(h, shape.intermediate_size)
        yield p + "input_layernorm.weight", torch.ones(h)
        yield p + "post_attention_layernorm.weight", torch.ones(h)
    yield prefix + "norm.weight", torch.ones(h)


def eos_logit_weight(mean_frames: float, hidden_size: int) -> float:
    """Codec-head weight on the EOS channel that makes EOS one draw in `mean_frames` per frame.

    After the final RMSNorm the EOS channel sits near sqrt(hidden_size) while every other logit
    stays near zero; top-k keeps EOS and k-1 near-equal others, so p(EOS) = e^(z/T) / (e^(z/T) + k-1).
    """
    if mean_frames <= 1:
        raise ValueError(f"mean_frames must be > 1, got {mean_frames}")
    p = 1.0 / mean_frames
    z = SAMPLING_TEMPERATURE * math.log((SAMPLING_TOP_K - 1) * p / (1.0 - p))
    return z / math.sqrt(hidden_size)


def talker_tensors(preset: Preset, seed: int, mean_frames: float) -> dict[str, torch.Tensor]:
    """All `talker.*` tensors of model.safetensors, bfloat16 like the release."""
    rand = _RandomTensors(seed)
    talker, predictor = preset.talker, preset.code_predictor
    h, text_h = talker.hidden_size, preset.text_hidden_size
    tensors: dict[str, torch.Tensor] = {}

    codec_embedding = rand.normal(TALKER_VOCAB_SIZE, h)
    codec_embedding[:, EOS_CHANNEL] = EOS_CHANNEL_LEVEL
    tensors["talker.model.codec_embedding.weight"] = codec_embedding
    tensors["talker.model.text_embedding.weight"] = rand.normal(TEXT_VOCAB_SIZE, text_h)
    tensors.update(_decoder_stack(rand, "talker.model.", talker))
    codec_head = rand.normal(TALKER_VOCAB_SIZE, h)
    codec_head[:, EOS_CHANNEL] = 0.0
    codec_head[CODEC_EOS_TOKEN_ID, EOS_CHANNEL] = eos_logit_weight(mean_frames, h)
    tensors["talker.codec_head.weight"] = codec_head
    tensors["talker.text_projection.linear_fc1.weight"] = rand.normal(text_h, text_h)
    tensors["talker.text_projection.linear_fc1.bias"] = torch.zeros(text_h)
    tensors["talker.text_projection.linear_fc2.weight"] = rand.normal(h, text_h)
    tensors["talker.text_projection.linear_fc2.bias"] = torch.zeros(h)

    cp = "talker.code_predictor."
    for group in range(NUM_CODEBOOKS - 1):
        tensors[f"{cp}model.codec_embedding.{group}.weight"] = rand.normal(CODEBOOK_SIZE, h)
    tensors.update(_decoder_stack(rand, cp + "model.", predictor))
    for group in range(NUM_CODEBOOKS - 1):
        tensors[f"{cp}lm_head.{group}.weight"] = rand.normal(CODEBOOK_SIZE, predictor.hidden_size)
    if predictor.hidden_size != h:
        tensors[cp + "small_to_mtp_projection.weight"] = rand.normal(predictor.hidden_size, h)
        tensors[cp + "small_to_mtp_projection.bias"] = torch.zeros(predictor.hidden_size)
    return {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in tensors.items()}


def _seeded_module_state(build, seed: int) -> dict[str, torch.Tensor]:
    """state_dict of a module built under a fixed torch seed, without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = build()
    return {name: tensor.detach().clone().contiguous() for name, tensor in module.state_dict().items()}


def speaker_encoder_tensors(preset: Preset, seed: int) -> dict[str, torch.Tensor]:
    """`speaker_encoder.*` (ECAPA-TDNN, Base variant), built with vLLM-Omni's own module definition."""
    from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
    from vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_talker import Qwen3TTSSpeakerEncoder

    config = Qwen3TTSSpeakerEncoderConfig(**preset.speaker_encoder)
    state = _seeded_module_state(lambda: Qwen3TTSSpeakerEncoder(config), seed)
    return {f"speaker_encoder.{name}": tensor.to(torch.bfloat16) for name, tensor in state.items()}


def speech_encoder_tensors(encoder_config: dict, seed: int) -> dict[str, torch.Tensor]:
    """`encoder.*` of speech_tokenizer/: the Mimi encoder half (reference audio -> codes, voice clone).

    The codebooks get N(0, 1) entries with unit usage so that different audio maps to different
    codes (the default init would send every frame to one code).
    """
    from transformers import MimiConfig, MimiModel

    config = MimiConfig(**{key: value for key, value in encoder_config.items() if key != "model_type"})
    state = _seeded_module_state(lambda: MimiModel(config), seed)
    generator = torch.Generator().manual_seed(seed + 1)
    tensors = {}
    for name, tensor in state.items():
        # Qwen3-TTS keeps only Mimi's encoding half; the decoding half is its own decoder.
        if name.startswith(("decoder.", "decoder_transformer.", "upsample.")):
            continue
        if name.endswith("codebook.embed_sum"):
            tensor = torch.empty(tensor.shape).normal_(0.0, 1.0, generator=generator)
        elif name.endswith("codebook.cluster_usage") or name.endswith("codebook.initialized"):
            tensor = torch.ones_like(tensor)
        tensors[f"encoder.{name}"] = tensor
    return tensors


def write_speech_tokenizer_with_encoder(out_dir: Path, decoder_preset: str, seed: int) -> Path:
    """codecstream.decoder's speech_tokenizer/ (decoder.* only) plus the encoder.* the talker loads."""
    from codecstream.testing.random_speech_tokenizer import write_speech_tokenizer

    write_speech_tokenizer(out_dir, preset=decoder_preset, seed=seed)
    config = json.loads((out_dir / "config.json").read_text())
    weights = load_file(str(out_dir / WEIGHTS_FILE))
    weights.update(speech_encoder_tensors(config["encoder_config"], seed))
    save_file(dict(sorted(weights.items())), str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    return out_dir


def write_qwen3_tts_checkpoint(
    out_dir: Path | str,
    preset: str = "tiny",
    seed: int = 0,
    variant: str = "custom_voice",
    mean_frames: float | None = None,
) -> Path:
    """Write a complete random-weight Qwen3-TTS checkpoint to out_dir (created) and return it."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}, expected one of {sorted(PRESETS)}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}, expected one of {list(VARIANTS)}")
    shape = PRESETS[preset]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    write_text_tokenizer(out_dir)
    config = qwen3_tts_config(shape, variant)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    tensors = talker_tensors(shape, seed, mean_frames if mean_frames is not None else shape.mean_frames)
    if variant == "base":
        tensors.update(speaker_encoder_tensors(shape, seed))
    save_file(dict(sorted(tensors.items())), str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})

    write_speech_tokenizer_with_encoder(out_dir / SPEECH_TOKENIZER_DIR, shape.decoder_preset, seed)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m codecstream.testing.random_checkpoint",
        description="Write a complete random-weight Qwen3-TTS-12Hz checkpoint in the official layout.",
    )
    parser.add_argument("out_dir", type=Path, help="directory to write (created if missing)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--variant", choices=VARIANTS, default="custom_voice")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--mean-frames",
        type=float,
        default=None,
        help="average utterance length in frames before the random talker emits EOS "
        f"(default: {', '.join(f'{name} {p.mean_frames:g}' for name, p in PRESETS.items())})",
    )
    args = parser.parse_args(argv)
    path = write_qwen3_tts_checkpoint(args.out_dir, args.preset, args.seed, args.variant, args.mean_frames)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Random-weight `speech_tokenizer/` directories in the official layout, for tests and benchmarks.

No model hub is reachable here, so tests and benchmarks build their own checkpoints. The default
init of the reference leaves the codebooks at zero (constant output), so:
  - "mild": codebooks N(0, 1), default conv/linear init, the last conv scaled so that the output
    has RMS ~0.1 around a zero mean (nothing saturates the final clamp);
  - "stressed": as mild, plus LayerScale and ConvNeXt gamma ~0.5 and SnakeBeta alpha, beta
    ~ N(0, 0.3), so the transformer (and its 72-frame window) matters more.
The same (preset, seed, init) always writes the same bytes.

    python -m codecstream.testing.random_speech_tokenizer OUT --preset tiny --seed 0 --init mild
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from codecstream.decoder.config import MODEL_TYPE, DecoderConfig
from codecstream.decoder.layers import ConvNeXtBlock, SnakeBeta
from codecstream.decoder.model import Qwen3TTSDecoder
from codecstream.decoder.transformer import LayerScale
from codecstream.protocol.checkpoint_files import DECODER_PREFIX, WEIGHTS_FILE
from codecstream.protocol.decoding import CODEBOOK_SIZE, FRAMES_PER_SECOND, SAMPLE_RATE_HZ
from safetensors.torch import save_file

PRESETS: dict[str, DecoderConfig] = {
    "real": DecoderConfig(),
    # The real codec's structure and rates (its codebooks, samples per frame, 72-frame window), small widths;
    # grouped-query attention (2 heads, 1 kv head) so that path is exercised too.
    "tiny": DecoderConfig(
        codebook_dim=32,
        latent_dim=64,
        decoder_dim=64,
        hidden_size=32,
        intermediate_size=64,
        head_dim=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=2,
    ),
}

INITS = ("mild", "stressed")
TARGET_RMS = 0.1
_CALIBRATION_FRAMES = 24

_REAL_ENCODER = {
    "_frame_rate": FRAMES_PER_SECOND,
    "audio_channels": 1,
    "codebook_dim": 256,
    "codebook_size": CODEBOOK_SIZE,
    "compress": 2,
    "dilation_growth_rate": 2,
    "head_dim": 64,
    "hidden_act": "gelu",
    "hidden_size": 512,
    "intermediate_size": 2048,
    "kernel_size": 7,
    "last_kernel_size": 3,
    "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000,
    "model_type": "mimi",
    "norm_eps": 1e-05,
    "num_attention_heads": 8,
    "num_filters": 64,
    "num_hidden_layers": 8,
    "num_key_value_heads": 8,
    "num_quantizers": 32,
    "num_residual_layers": 1,
    "num_semantic_quantizers": 1,
    "pad_mode": "constant",
    "residual_kernel_size": 3,
    "rope_theta": 10000.0,
    "sampling_rate": SAMPLE_RATE_HZ,
    "sliding_window": 250,
    "trim_right_ratio": 1.0,
    "upsample_groups": 512,
    "upsampling_ratios": [8, 6, 5, 4],
    "use_cache": False,
    "use_causal_conv": True,
    "use_conv_shortcut": False,
    "use_streaming": False,
    "vector_quantization_hidden_dimension": 256,
}
# The tiny encoder keeps the codec's rates and code space at small widths.
_TINY_ENCODER = {
    **_REAL_ENCODER,
    "codebook_dim": 16,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_filters": 4,
    "num_hidden_layers": 1,
    "upsample_groups": 32,
    "vector_quantization_hidden_dimension": 16,
}

PREPROCESSOR_CONFIG = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": SAMPLE_RATE_HZ,
}


def speech_tokenizer_config(decoder: DecoderConfig, encoder: dict | None = None) -> dict:
    """The whole `speech_tokenizer/config.json`, as the released checkpoints write it."""
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": MODEL_TYPE,
        "encoder_valid_num_quantizers": decoder.num_quantizers,
        "input_sample_rate": decoder.sample_rate,
        "output_sample_rate": decoder.sample_rate,
        "decode_upsample_rate": decoder.decode_upsample_rate,
        "encode_downsample_rate": decoder.decode_upsample_rate,
        "encoder_config": dict(_REAL_ENCODER if encoder is None else encoder),
        "decoder_config": decoder.to_json_block(),
        "transformers_version": "4.57.3",
        "dtype": "float32",
    }


@torch.no_grad()
def random_decoder(preset: str = "tiny", seed: int = 0, init: str = "mild") -> Qwen3TTSDecoder:
    """A decoder with deterministic random weights (see the module doc for the inits)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}, expected one of {sorted(PRESETS)}")
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}, expected one of {list(INITS)}")
    generator = torch.Generator().manual_seed(seed)
    torch_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen3TTSDecoder(PRESETS[preset])
    finally:
        torch.random.set_rng_state(torch_state)
    for name, param in model.named_parameters():
        if name.endswith("_codebook.embedding_sum"):
            param.normal_(0.0, 1.0, generator=generator)
    if init == "stressed":
        for module in model.modules():
            if isinstance(module, LayerScale):
                module.scale.fill_(0.5)
            elif isinstance(module, ConvNeXtBlock):
                module.gamma.fill_(0.5)
            elif isinstance(module, SnakeBeta):
                module.alpha.normal_(0.0, 0.3, generator=generator)
                module.beta.normal_(0.0, 0.3, generator=generator)
    model.refresh_derived()
    _scale_output(model, generator)
    return model.eval()


def _scale_output(model: Qwen3TTSDecoder, generator: torch.Generator) -> None:
    """Scale the last conv so random codes decode with RMS ~TARGET_RMS around a zero mean.

    Without this the output is mostly a constant offset (SnakeBeta's sin^2 term is never
    negative and the offset builds up through the stack), which would flatter every SNR.
    """
    codes = torch.randint(
        0, model.config.codebook_size, (1, _CALIBRATION_FRAMES, model.config.num_quantizers), generator=generator
    )
    # One thread: a conv's sums are split per thread, and the offset written into the last bias
    # must not depend on how many threads the caller runs (the same seed writes the same weights).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        hidden = model.front(codes)
        for _, layer in model.conv_layers():
            hidden = layer(hidden)
        signal = hidden.flatten()[model.samples_per_frame :]
        spread, offset = float(signal.std()), float(signal.mean())
    finally:
        torch.set_num_threads(threads)
    if spread > 0:
        last = model.decoder[-1].conv
        scale = TARGET_RMS / spread
        last.weight.mul_(scale)
        last.bias.copy_(-(offset - last.bias) * scale)


def write_speech_tokenizer(out_dir: Path, preset: str = "tiny", seed: int = 0, init: str = "mild") -> Path:
    """Write config.json, preprocessor_config.json and model.safetensors (`decoder.*` only) to out_dir.

    Returns out_dir. The encoder block of config.json is written (real or tiny widths) but no
    `encoder.*` weights: whoever needs an encoder adds them to the same file.
    """
    out_dir = Path(out_dir)
    model = random_decoder(preset, seed, init)
    out_dir.mkdir(parents=True, exist_ok=True)
    encoder = _TINY_ENCODER if preset == "tiny" else _REAL_ENCODER
    config = speech_tokenizer_config(model.config, encoder)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")
    tensors = {DECODER_PREFIX + name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m codecstream.testing.random_speech_tokenizer",
        description="Write a random-weight Qwen3-TTS-Tokenizer-12Hz speech_tokenizer/ directory.",
    )
    parser.add_argument("out_dir", type=Path, help="directory to write (created if missing)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", choices=INITS, default="mild")
    args = parser.parse_args(argv)
    path = write_speech_tokenizer(args.out_dir, args.preset, args.seed, args.init)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

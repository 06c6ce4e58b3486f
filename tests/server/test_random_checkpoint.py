"""The random-weight Qwen3-TTS checkpoint builder: the official layout, the real ids, the same bytes every time."""

from __future__ import annotations

import hashlib
import json

import pytest
from codecstream.protocol import decoder_digest
from codecstream.testing.random_checkpoint import (
    PRESETS,
    eos_logit_weight,
    qwen3_tts_config,
    write_qwen3_tts_checkpoint,
)
from codecstream.testing.random_text_tokenizer import SPECIAL_TOKENS, WHOLE_WORDS
from safetensors import safe_open
from transformers import AutoTokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_qwen3_tts_checkpoint(tmp_path_factory.mktemp("tiny"), preset="tiny", seed=0)


def tensor_names(path) -> dict[str, tuple]:
    with safe_open(str(path), framework="pt") as weights:
        return {
            name: (str(weights.get_slice(name).get_dtype()), tuple(weights.get_slice(name).get_shape()))
            for name in weights.keys()
        }


def test_the_directory_has_the_official_files(tiny):
    for name in (
        "config.json",
        "model.safetensors",
        "vocab.json",
        "merges.txt",
        "tokenizer_config.json",
        "speech_tokenizer/config.json",
        "speech_tokenizer/model.safetensors",
        "speech_tokenizer/preprocessor_config.json",
    ):
        assert (tiny / name).is_file(), name


def test_config_json_is_the_release_like_config_of_the_preset(tiny):
    # tests/testing/test_release_config.py compares that config with the release's.
    assert json.loads((tiny / "config.json").read_text()) == qwen3_tts_config(PRESETS["tiny"], "custom_voice")


def test_even_the_tiny_talker_has_the_head_dim_vllm_cpu_attention_needs(tiny):
    talker = json.loads((tiny / "config.json").read_text())["talker_config"]
    assert talker["head_dim"] >= 64 and talker["code_predictor_config"]["head_dim"] >= 64


def test_text_tokenizer_keeps_special_tokens_and_chat_template_words_on_their_real_ids(tiny):
    tokenizer = AutoTokenizer.from_pretrained(str(tiny))
    for token_id, token in SPECIAL_TOKENS.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id
    for word, token_id in WHOLE_WORDS.items():
        assert tokenizer(f"<|im_start|>{word}\n")["input_ids"] == [151644, token_id, 198]
    config = json.loads((tiny / "config.json").read_text())
    assert tokenizer.convert_tokens_to_ids("assistant") == config["assistant_token_id"] == 77091
    ids = tokenizer("<|im_start|>assistant\nHi there<|im_end|>\n")["input_ids"]
    assert tokenizer.decode(ids) == "<|im_start|>assistant\nHi there<|im_end|>\n"


def test_talker_weights_use_the_hf_names_with_split_projections_in_bfloat16(tiny):
    names = tensor_names(tiny / "model.safetensors")
    shape = PRESETS["tiny"].talker
    q_rows = shape.num_attention_heads * shape.head_dim
    assert names["talker.model.layers.0.self_attn.q_proj.weight"] == ("BF16", (q_rows, shape.hidden_size))
    for name in (
        "talker.model.codec_embedding.weight",
        "talker.model.text_embedding.weight",
        "talker.codec_head.weight",
        "talker.text_projection.linear_fc2.bias",
        "talker.model.layers.1.mlp.gate_proj.weight",
        "talker.model.layers.1.mlp.up_proj.weight",
        "talker.code_predictor.model.codec_embedding.14.weight",
        "talker.code_predictor.lm_head.14.weight",
        "talker.code_predictor.model.layers.0.self_attn.k_proj.weight",
    ):
        assert name in names, name
    assert names["talker.model.text_embedding.weight"][1][0] == 151936
    assert {dtype for dtype, _ in names.values()} == {"BF16"}


def test_speech_tokenizer_holds_encoder_and_decoder_weights(tiny):
    names = tensor_names(tiny / "speech_tokenizer" / "model.safetensors")
    assert any(name.startswith("encoder.encoder.") for name in names)
    assert any(name.startswith("encoder.quantizer.") for name in names)
    assert any(name.startswith("decoder.") for name in names)
    assert not any(name.startswith(("encoder.decoder.", "encoder.upsample.")) for name in names)
    assert decoder_digest(tiny).startswith("sha256:")


def test_the_same_seed_writes_the_same_bytes(tiny, tmp_path):
    again = write_qwen3_tts_checkpoint(tmp_path / "again", preset="tiny", seed=0)
    for name in ("model.safetensors", "speech_tokenizer/model.safetensors", "config.json", "vocab.json"):
        digests = [hashlib.sha256((root / name).read_bytes()).hexdigest() for root in (tiny, again)]
        assert digests[0] == digests[1], name


def test_a_longer_mean_utterance_means_a_weaker_eos_logit():
    assert eos_logit_weight(100, 128) < eos_logit_weight(40, 128) < eos_logit_weight(10, 128)
    with pytest.raises(ValueError, match="mean_frames must be > 1"):
        eos_logit_weight(1, 128)


def test_unknown_preset_and_variant_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        write_qwen3_tts_checkpoint(tmp_path, preset="huge")
    with pytest.raises(ValueError, match="unknown variant 'duet'"):
        write_qwen3_tts_checkpoint(tmp_path, variant="duet")

"""Loading the official speech_tokenizer/ layout, and refusing anything else with a clear message."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from codecstream.decoder import CheckpointError, Qwen3TTSDecoder, decode_utterance, load_decoder
from codecstream.protocol.digest import decoder_digest
from codecstream.testing.random_speech_tokenizer import PRESETS, random_decoder, write_speech_tokenizer
from safetensors.torch import load_file, save_file

from tests.conftest import random_codes


def _copy(source, destination):
    shutil.copytree(source, destination)
    return destination


def _rewrite_tensors(directory, edit) -> None:
    tensors = load_file(str(directory / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(directory / "model.safetensors"))


def test_the_real_preset_has_the_released_decoder_size():
    model = Qwen3TTSDecoder(PRESETS["real"])
    assert sum(p.numel() for p in model.parameters()) == 114_323_137


def test_written_config_has_the_official_fields(tiny_checkpoints):
    config = json.loads((tiny_checkpoints["mild"] / "config.json").read_text())
    assert config["model_type"] == "qwen3_tts_tokenizer_12hz"
    assert config["architectures"] == ["Qwen3TTSTokenizerV2Model"]
    assert config["decode_upsample_rate"] == 1920 and config["output_sample_rate"] == 24000
    decoder = config["decoder_config"]
    for field in ("codebook_dim", "codebook_size", "latent_dim", "decoder_dim", "sliding_window", "head_dim",
                  "num_semantic_quantizers", "upsample_rates", "upsampling_ratios"):  # fmt: skip
        assert field in decoder
    assert decoder["sliding_window"] == 72 and decoder["num_quantizers"] == 16 and decoder["codebook_size"] == 2048
    assert config["encoder_config"]["num_quantizers"] == 32
    assert (tiny_checkpoints["mild"] / "preprocessor_config.json").exists()


def test_every_written_tensor_is_a_decoder_tensor_and_loads_strictly(tiny_checkpoints):
    tensors = load_file(str(tiny_checkpoints["mild"] / "model.safetensors"))
    assert all(name.startswith("decoder.") for name in tensors)
    assert "decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum" in tensors
    assert "decoder.pre_transformer.layers.1.self_attn.q_proj.weight" in tensors
    assert "decoder.decoder.4.block.4.conv1.conv.weight" in tensors
    load_decoder(tiny_checkpoints["mild"])


def test_loaded_decoder_decodes_like_the_model_it_was_written_from(tiny_model):
    codes = random_codes(20)
    written = random_decoder("tiny", seed=0, init="mild")
    np.testing.assert_array_equal(decode_utterance(written, codes), decode_utterance(tiny_model, codes))


def test_same_seed_writes_the_same_weights_and_another_seed_does_not(tmp_path, tiny_checkpoints):
    again = write_speech_tokenizer(tmp_path / "again", preset="tiny", seed=0, init="mild")
    other = write_speech_tokenizer(tmp_path / "other", preset="tiny", seed=1, init="mild")
    assert decoder_digest(again) == decoder_digest(tiny_checkpoints["mild"])
    assert decoder_digest(other) != decoder_digest(again)


def test_same_seed_writes_the_same_weights_whatever_the_callers_thread_count():
    written = []
    for threads in (1, 2):
        torch.set_num_threads(threads)  # the autouse fixture restores the caller's count
        written.append(random_decoder("tiny", seed=0, init="mild").state_dict())
    assert [name for name, tensor in written[0].items() if not torch.equal(tensor, written[1][name])] == []


def test_random_weights_are_not_degenerate(tiny_models):
    for init, model in tiny_models.items():
        pcm = decode_utterance(model, random_codes(40, seed=3))[1920:]
        assert 0.05 < float(pcm.std()) < 0.2, init
        assert abs(float(pcm.mean())) < 0.02, init
        assert float(np.mean(np.abs(pcm) >= 1.0)) < 1e-3, init


def test_a_model_root_containing_speech_tokenizer_loads_too(tmp_path, tiny_checkpoints):
    root = tmp_path / "model"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "qwen3_tts"}))
    _copy(tiny_checkpoints["mild"], root / "speech_tokenizer")
    assert load_decoder(root).config.hidden_size == 32


def test_missing_tensors_are_named(tmp_path, tiny_checkpoints):
    directory = _copy(tiny_checkpoints["mild"], tmp_path / "st")
    _rewrite_tensors(directory, lambda t: t.pop("decoder.pre_conv.conv.weight"))
    with pytest.raises(CheckpointError, match=r"missing 1 tensors: decoder\.pre_conv\.conv\.weight"):
        load_decoder(directory)


def test_wrongly_shaped_tensors_are_named_with_both_shapes(tmp_path, tiny_checkpoints):
    directory = _copy(tiny_checkpoints["mild"], tmp_path / "st")
    _rewrite_tensors(directory, lambda t: t.update({"decoder.pre_conv.conv.bias": torch.zeros(7)}))
    with pytest.raises(CheckpointError, match=r"decoder\.pre_conv\.conv\.bias has shape \(7,\), expected \(64,\)"):
        load_decoder(directory)


def test_weights_of_another_size_are_refused(tmp_path, tiny_checkpoints):
    directory = _copy(tiny_checkpoints["mild"], tmp_path / "st")
    config = json.loads((directory / "config.json").read_text())
    config["decoder_config"]["hidden_size"] = 64
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="wrong shape"):
        load_decoder(directory)


def test_another_codec_is_refused_by_model_type(tmp_path, tiny_checkpoints):
    directory = _copy(tiny_checkpoints["mild"], tmp_path / "st")
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "qwen3_tts_tokenizer_25hz"
    (directory / "config.json").write_text(json.dumps(config))
    expected = "model_type is 'qwen3_tts_tokenizer_25hz', expected 'qwen3_tts_tokenizer_12hz'"
    with pytest.raises(CheckpointError, match=expected):
        load_decoder(directory)


def test_a_checkpoint_without_decoder_tensors_is_refused(tmp_path, tiny_checkpoints):
    directory = _copy(tiny_checkpoints["mild"], tmp_path / "st")
    save_file({"encoder.weight": torch.zeros(2)}, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match="contains no Qwen3-TTS-Tokenizer-12Hz decoder tensors"):
        load_decoder(directory)


def test_missing_files_are_named(tmp_path, tiny_checkpoints):
    directory = _copy(tiny_checkpoints["mild"], tmp_path / "st")
    (directory / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"has no model\.safetensors"):
        load_decoder(directory)
    with pytest.raises(CheckpointError, match="not a directory"):
        load_decoder(tmp_path / "nowhere")


def test_inconsistent_rates_are_refused(tmp_path, tiny_checkpoints):
    directory = _copy(tiny_checkpoints["mild"], tmp_path / "st")
    config = json.loads((directory / "config.json").read_text())
    config["decoder_config"]["upsample_rates"] = [8, 5, 4, 4]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="give 2560 samples per frame, decode_upsample_rate says 1920"):
        load_decoder(directory)


def test_the_command_line_writes_a_loadable_directory(tmp_path):
    out = tmp_path / "cli"
    result = subprocess.run(
        [sys.executable, "-m", "codecstream.testing.random_speech_tokenizer", str(out), "--preset", "tiny",
         "--seed", "2", "--init", "stressed"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert result.stdout.strip() == str(out)
    assert load_decoder(out).config.num_hidden_layers == 2


def test_a_sharded_checkpoint_loads_the_same_decoder_and_has_the_same_digest(tmp_path, tiny_checkpoints):
    single = tiny_checkpoints["mild"]
    sharded = _copy(single, tmp_path / "sharded")
    tensors = load_file(str(sharded / "model.safetensors"))
    (sharded / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({name: tensors[name] for name in part}, str(sharded / file))
    weight_map = {name: file for file, part in halves.items() for name in part}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert decoder_digest(sharded) == decoder_digest(single)
    codes = random_codes(6)
    np.testing.assert_array_equal(
        decode_utterance(load_decoder(sharded), codes), decode_utterance(load_decoder(single), codes)
    )


def test_every_checkpoint_problem_is_a_checkpoint_error_under_codecstream_error(tmp_path, tiny_checkpoints):
    from codecstream.protocol.errors import CodecStreamError

    truncated = _copy(tiny_checkpoints["mild"], tmp_path / "truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"cannot be read|truncated") as caught:
        load_decoder(truncated)
    assert isinstance(caught.value, CodecStreamError)

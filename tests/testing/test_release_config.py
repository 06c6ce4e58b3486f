"""The random checkpoints' config.json is the release's: field by field the config.json published with
Qwen3-TTS-12Hz-0.6B-CustomVoice (tests/data/), so the tests take the paths a real checkpoint takes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from codecstream.testing.random_checkpoint import PRESETS, qwen3_tts_config

RELEASE_CONFIG = Path(__file__).parents[1] / "data" / "qwen3-tts-12hz-0.6b-customvoice.config.json"
RELEASE = json.loads(RELEASE_CONFIG.read_text())

#: The fields whose value follows the model's size: the tiny preset differs in these and only these.
SIZE_FIELDS = frozenset(
    {
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "text_hidden_size",
        "mrope_section",
        "layer_types",  # one entry per code-predictor layer
        "tts_model_size",
    }
)
CODE_PREDICTOR = ("talker_config", "code_predictor_config")
#: What transformers 4.57 writes into every sub-config it saves: PretrainedConfig's generation
#: defaults, label maps and export flags. The release's code_predictor_config carries them and ours
#: need not; test_the_engine_reads_the_release_values_from_the_0_6b_config shows the loader sees
#: the same values without them. Excused there only: elsewhere a missing pad_token_id is a difference.
SERIALIZATION_DEFAULTS = frozenset(
    """
    _name_or_path add_cross_attention architectures bad_words_ids begin_suppress_tokens bos_token_id
    chunk_size_feed_forward cross_attention_hidden_size decoder_start_token_id diversity_penalty do_sample
    dtype early_stopping encoder_no_repeat_ngram_size eos_token_id exponential_decay_length_penalty
    finetuning_task forced_bos_token_id forced_eos_token_id id2label is_decoder is_encoder_decoder label2id
    length_penalty max_length min_length no_repeat_ngram_size num_beam_groups num_beams num_return_sequences
    output_attentions output_hidden_states output_scores pad_token_id prefix problem_type pruned_heads
    remove_invalid_values repetition_penalty return_dict return_dict_in_generate sep_token_id suppress_tokens
    task_specific_params temperature tf_legacy_loss tie_encoder_decoder tokenizer_class top_k top_p
    torchscript typical_p use_bfloat16
    """.split()
)
#: The name tables whose order a reader sees: vLLM-Omni's speech API takes the first spk_id as the default voice.
ORDERED_TABLES = ("spk_id", "spk_is_dialect", "codec_language_id")


def differences(ours, release, path: tuple = (), *, sizes_may_differ: bool = False) -> list[str]:
    """Every way `ours` departs from `release`, one line each, named by its path in the config."""
    where = ".".join(map(str, path)) or "config"
    if isinstance(ours, dict) and isinstance(release, dict):
        found = [
            f"{where}.{key}: missing (the release has {release[key]!r})"
            for key in release.keys() - ours.keys()
            if not (path == CODE_PREDICTOR and key in SERIALIZATION_DEFAULTS)
        ]
        found += [f"{where}.{key}: not in the release" for key in ours.keys() - release.keys()]
        for key in ours.keys() & release.keys():
            if not (sizes_may_differ and key in SIZE_FIELDS):
                found += differences(ours[key], release[key], (*path, key), sizes_may_differ=sizes_may_differ)
        return sorted(found)
    # JSON types too: false is not 0, 1 is not 1.0.
    if ours != release or type(ours) is not type(release):
        return [f"{where}: ours {ours!r}, the release {release!r}"]
    return []


def test_the_0_6b_custom_voice_config_is_the_release_config():
    assert differences(qwen3_tts_config(PRESETS["0.6b"], "custom_voice"), RELEASE) == []


def test_the_tiny_custom_voice_config_is_the_release_config_but_for_its_sizes():
    assert differences(qwen3_tts_config(PRESETS["tiny"], "custom_voice"), RELEASE, sizes_may_differ=True) == []


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_speakers_dialect_voices_and_languages_keep_the_release_order(preset):
    talker = qwen3_tts_config(PRESETS[preset], "custom_voice")["talker_config"]
    for table in ORDERED_TABLES:
        assert list(talker[table]) == list(RELEASE["talker_config"][table]), table


def test_a_missing_or_changed_field_is_a_difference_and_only_sizes_are_excused():
    ours = copy.deepcopy(RELEASE)
    talker = ours["talker_config"]
    del talker["pad_token_id"]  # a serialization default in the code predictor, not here
    talker["codec_language_id"]["german"] = 2052
    talker["spk_is_dialect"]["eric"] = False
    talker["hidden_size"] = 128
    del talker["code_predictor_config"]["num_hidden_layers"]
    del talker["code_predictor_config"]["top_k"]
    assert differences(ours, RELEASE, sizes_may_differ=True) == [
        "talker_config.code_predictor_config.num_hidden_layers: missing (the release has 5)",
        "talker_config.codec_language_id.german: ours 2052, the release 2053",
        "talker_config.pad_token_id: missing (the release has 2148)",
        "talker_config.spk_is_dialect.eric: ours False, the release 'sichuan_dialect'",
    ]


def test_the_engine_reads_the_release_values_from_the_0_6b_config():
    # What vLLM-Omni's loader makes of each file: the fields our config leaves out change nothing.
    from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSConfig

    def loaded(config: dict) -> dict:
        return Qwen3TTSConfig(**copy.deepcopy(config)).to_dict()

    assert differences(loaded(qwen3_tts_config(PRESETS["0.6b"], "custom_voice")), loaded(RELEASE)) == []


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("variant", ["base", "voice_design"])
def test_base_and_voice_design_are_the_release_config_without_preset_voices_or_dialects(preset, variant):
    # Dialects exist for the dialect voices, and only CustomVoice has preset voices.
    config = qwen3_tts_config(PRESETS[preset], variant)
    expected = copy.deepcopy(RELEASE)
    expected["tts_model_type"] = variant
    talker = expected["talker_config"]
    talker["spk_id"], talker["spk_is_dialect"] = {}, {}
    talker["codec_language_id"] = {
        name: id_ for name, id_ in talker["codec_language_id"].items() if "dialect" not in name
    }
    speaker_encoder = config.pop("speaker_encoder_config", None)
    assert differences(config, expected, sizes_may_differ=preset != "0.6b") == []
    assert list(config["talker_config"]["codec_language_id"]) == list(talker["codec_language_id"])
    # Only Base clones a voice; its x-vector is added to the talker's codec embeddings, so the widths match.
    if variant == "base":
        assert speaker_encoder["enc_dim"] == config["talker_config"]["hidden_size"]
    else:
        assert speaker_encoder is None

"""Checkpoints shaped like the release (tests/data/) take the paths a real Qwen3-TTS-12Hz-0.6B-CustomVoice
checkpoint takes: its dialect voices, its ten languages, its default voice.

The session's tiny CustomVoice checkpoint carries the release's speakers, dialect voices and languages
(tests/testing/test_release_config.py). A dialect voice asked for Auto makes the talker take its
dialect's language id (eric: sichuan_dialect, dylan: beijing_dialect). Random weights make the codes
nearly independent of the prompt, so which id a prompt carries is read from vLLM-Omni's own prompt
builder, and the engine shows that every such prompt generates frames.
"""

from __future__ import annotations

import json

import pytest
import torch
from codecstream.server.request import SynthesisRequest
from codecstream.testing.random_checkpoint import PRESETS, qwen3_tts_config
from codecstream.testing.random_text_tokenizer import write_text_tokenizer

TEXT = "四川话和北京话都是中文。"
THINK, NO_THINK, THINK_BOS, THINK_EOS = 2154, 2155, 2156, 2157
RELEASE_LANGUAGES = "Chinese English German Italian Portuguese Spanish Japanese Korean French Russian".split()


@pytest.fixture(scope="module")
def codec_prefill(tmp_path_factory):
    """codec_prefill(voice, language): the codec tag ids vLLM-Omni's talker puts before the speaker."""
    from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSConfig
    from vllm_omni.model_executor.models.qwen3_tts.prompt_embeds_builder import Qwen3TTSPromptEmbedsBuilder

    # The builder reads only config.json and the text tokenizer; its embeddings are stand-ins that
    # record the codec ids they are asked for.
    checkpoint = tmp_path_factory.mktemp("release-like-config")
    write_text_tokenizer(checkpoint)
    config = qwen3_tts_config(PRESETS["tiny"], "custom_voice")
    (checkpoint / "config.json").write_text(json.dumps(config))
    hf_config = Qwen3TTSConfig(**config)
    hidden = hf_config.talker_config.hidden_size
    looked_up: list[list[int]] = []

    def codec_embed(ids: torch.Tensor) -> torch.Tensor:
        looked_up.append(ids.flatten().tolist())
        return torch.zeros(*ids.shape, hidden, dtype=torch.bfloat16)

    text_embedding = torch.nn.Embedding(hf_config.talker_config.text_vocab_size, 1)
    builder = Qwen3TTSPromptEmbedsBuilder(
        config=hf_config,
        talker_config=hf_config.talker_config,
        model_path=str(checkpoint),
        text_embedding=text_embedding,
        text_projection=lambda embedded: torch.zeros(*embedded.shape[:-1], hidden, dtype=torch.bfloat16),
        codec_embed=codec_embed,
        residual_code_embeddings=lambda: [],
        speaker_encoder=None,
        tts_pad_embed=torch.zeros(1, hidden),
        encode_ref_audio_batch=lambda *args, **kwargs: [],
    )

    def prefill(voice: str, language: str) -> list[int]:
        looked_up.clear()
        information = {"text": [TEXT], "language": [language], "speaker": [voice], "instruct": [""]}
        with torch.no_grad():
            builder.build_prompt_embeds(task_type="CustomVoice", info_dict=information)
        return looked_up[0]

    return prefill


@pytest.mark.parametrize(
    ("voice", "language", "language_id"),
    [
        ("eric", "Auto", 2062),  # sichuan_dialect
        ("dylan", "Auto", 2074),  # beijing_dialect
        # vLLM-Omni 0.30 keeps a language named outright; qwen-tts switches Chinese to the dialect too.
        ("eric", "Chinese", 2055),
        ("dylan", "Chinese", 2055),
        ("ryan", "Auto", None),
        ("ryan", "Portuguese", 2071),
        ("ryan", "German", 2053),
    ],
)
def test_the_talker_prompt_carries_the_language_id_of_the_voice_and_language(
    codec_prefill, voice, language, language_id
):
    expected = [NO_THINK, THINK_BOS, THINK_EOS] if language_id is None else [THINK, THINK_BOS, language_id, THINK_EOS]
    assert codec_prefill(voice, language) == expected


@pytest.mark.engine
@pytest.mark.parametrize(
    ("voice", "language"),
    [
        ("eric", "Auto"),
        ("eric", "Chinese"),
        ("dylan", "Auto"),
        ("dylan", "Chinese"),
        ("ryan", "Portuguese"),
        ("ryan", "German"),
        ("serena", "Auto"),  # the release's first speaker: vLLM-Omni's speech API's default voice
    ],
)
def test_dialect_voices_and_the_release_languages_generate_frames(talker_engine, voice, language):
    request = SynthesisRequest(text=TEXT, voice=voice, language=language, seed=1, max_frames=8)
    codes = talker_engine.collect(request, f"release-like-{voice}-{language}").codes
    assert len(codes) > 0
    assert codes.min() >= 0 and codes.max() < 2048
    assert talker_engine.live_requests() == 0


@pytest.mark.engine
def test_the_source_offers_the_release_voices_and_languages(talker_engine):
    source = talker_engine.source
    voices = {"serena", "vivian", "uncle_fu", "ryan", "aiden", "ono_anna", "sohee", "eric", "dylan"}
    assert {voice.name for voice in source.offering.voices} == voices
    assert source.offering.default_voice == "serena"
    assert source.offering.languages[0] == "Auto" and set(RELEASE_LANGUAGES) <= set(source.offering.languages)
    assert not [name for name in source.offering.languages if "Dialect" in name]

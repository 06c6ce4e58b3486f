"""Facts of the released Qwen3-TTS-12Hz checkpoints that several roles need and no wire message
carries: the talker's codec-vocabulary special ids, and the CustomVoice release's languages and
preset speakers with their ids, in the release's order (its config.json, talker_config).

The server stops the talker at CODEC_EOS_TOKEN_ID and replays without a checkpoint as a server of
the release would answer; the test support writes random-weight checkpoints with these ids.
"""

from __future__ import annotations

#: Codec-side special ids of the released 12 Hz models (talker vocabulary of 3072 = 2048 codes + tags).
CODEC_IDS = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}
#: The token the talker samples on codebook 0 to end an utterance; it is never a frame.
CODEC_EOS_TOKEN_ID = CODEC_IDS["codec_eos_token_id"]
#: The release's languages and their codec ids, in its order.
LANGUAGE_IDS = {
    "chinese": 2055,
    "english": 2050,
    "german": 2053,
    "italian": 2070,
    "portuguese": 2071,
    "spanish": 2054,
    "japanese": 2058,
    "korean": 2064,
    "french": 2061,
    "russian": 2069,
}
#: The dialects the release's dialect voices switch to (entries of codec_language_id too).
DIALECT_IDS = {
    "beijing_dialect": 2074,
    "sichuan_dialect": 2062,
}
#: The CustomVoice release's preset speakers and their codec-vocabulary token ids, in its order:
#: vLLM-Omni's speech API takes the first as the default voice.
SPEAKER_IDS = {
    "serena": 3066,
    "vivian": 3065,
    "uncle_fu": 3010,
    "ryan": 3061,
    "aiden": 2861,
    "ono_anna": 2873,
    "sohee": 2864,
    "eric": 2875,
    "dylan": 2878,
}
#: The voices that speak a dialect: asked for Auto (or, in qwen-tts, Chinese), the talker takes the
#: dialect's language id instead.
SPEAKER_DIALECTS = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}

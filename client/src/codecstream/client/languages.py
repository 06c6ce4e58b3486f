"""The languages Qwen3-TTS speaks, as the model names them and as ISO 639-1 codes: the one table the
voice-agent plugins map their frameworks' language values through, both ways.

The server takes the model's names ("English"); frameworks hand over codes ("en", "en-US", Pipecat's
`Language.EN_GB`, LiveKit's `LanguageCode`). A regional variant speaks as its base language; a
language the model does not speak is refused here, before any turn, naming the ones it does.
"""

from __future__ import annotations

from codecstream.protocol.release import LANGUAGE_IDS

#: The ISO 639-1 code of each language the release speaks (its talker_config.codec_language_id).
_ISO_CODES = {
    "chinese": "zh",
    "english": "en",
    "german": "de",
    "italian": "it",
    "portuguese": "pt",
    "spanish": "es",
    "japanese": "ja",
    "korean": "ko",
    "french": "fr",
    "russian": "ru",
}
#: ISO 639-1 code -> the model's name, for every language of the release (protocol/release.py),
#: dialects aside; a language the release gains without a code here fails at import.
MODEL_LANGUAGES: dict[str, str] = {_ISO_CODES[name]: name.capitalize() for name in LANGUAGE_IDS}
_BY_NAME = {name.lower(): name for name in MODEL_LANGUAGES.values()}


def model_language(language: str) -> str:
    """The model's name for `language`: a code with or without region ("en", "en-US", "pt_BR") or a
    name in any case ("english"); "" stays "" and "auto" is "Auto" (the model picks). A language
    the model does not speak is a ValueError."""
    text = language.strip()
    if not text:
        return ""
    if text.lower() == "auto":
        return "Auto"  # the model picks, as the server's default does
    if text.lower() in _BY_NAME:
        return _BY_NAME[text.lower()]
    base = text.replace("_", "-").split("-", 1)[0].lower()
    if base in MODEL_LANGUAGES:
        return MODEL_LANGUAGES[base]
    spoken = ", ".join(f"{name} ({code})" for code, name in MODEL_LANGUAGES.items())
    raise ValueError(f"Qwen3-TTS does not speak {text[:40]!r}; it speaks {spoken}")


def language_code(name: str) -> str:
    """The ISO 639-1 code of one of the model's language names ("English" -> "en"), any case."""
    wanted = name.strip().lower()
    for code, known in MODEL_LANGUAGES.items():
        if known.lower() == wanted:
            return code
    raise ValueError(f"{name[:40]!r} is not one of the model's languages: {', '.join(MODEL_LANGUAGES.values())}")

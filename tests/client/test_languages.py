"""The language table the plugins map through (codecstream.client.languages), both ways."""

from __future__ import annotations

import pytest
from codecstream.client.languages import MODEL_LANGUAGES, language_code, model_language


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ("en", "English"),
        ("en-US", "English"),
        ("pt_BR", "Portuguese"),
        ("ZH", "Chinese"),
        ("german", "German"),
        ("Auto", "Auto"),
        ("", ""),
    ],
)
def test_codes_regions_and_names_map_to_the_model_s_name(given, name):
    assert model_language(given) == name


def test_every_name_maps_back_to_its_code():
    assert {language_code(name): name for name in MODEL_LANGUAGES.values()} == MODEL_LANGUAGES
    assert language_code("english") == "en"


@pytest.mark.parametrize("given", ["ar", "klingon", "e"])
def test_a_language_the_model_does_not_speak_names_those_it_does(given):
    with pytest.raises(ValueError, match="it speaks Chinese \\(zh\\), English \\(en\\)"):
        model_language(given)
    with pytest.raises(ValueError, match="not one of the model's languages"):
        language_code(given)

"""Every place that tells a voice-agent builder what to install says the same: the framework's extra
beside OpenVINO, the decoder runtime `decoder="auto"` takes first (README's role line, docs/client.md,
the plugin modules' own docstrings)."""

from __future__ import annotations

import pathlib
import re

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLACES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("client/src/**/plugins/*.py"))]
EXPECTED = {"pipecat": "openvino,pipecat", "livekit": "openvino,livekit"}


def install_lines() -> list[tuple[str, str]]:
    """(file, extras) of every `client[...]` install spec that names a framework's extra."""
    found = []
    for path in PLACES:
        for extras in re.findall(r"client\[([a-z0-9,]+)\]", path.read_text()):
            if set(extras.split(",")) & set(EXPECTED):
                found.append((path.relative_to(ROOT).as_posix(), extras))
    return found


def test_every_install_line_of_a_plugin_names_the_same_extras():
    lines = install_lines()
    assert {extras for _, extras in lines} == set(EXPECTED.values()), lines
    for framework, extras in EXPECTED.items():
        assert any(place == "README.md" and found == extras for place, found in lines), framework
        assert any(place.startswith("docs/") and found == extras for place, found in lines), framework
        assert any(place.endswith(f"plugins/{framework}.py") and found == extras for place, found in lines)


def test_the_extras_named_are_the_client_s_own():
    declared = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extras in EXPECTED.values():
        assert set(extras.split(",")) <= set(declared)

"""Fixture code ships only in codecstream-testing: no other distribution builds random weights."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
USER_DISTRIBUTIONS = ("protocol", "decoder", "client", "server", "export")
#: What a checkpoint builder does: draw weights and write them in the official layout.
BUILDS_WEIGHTS = re.compile(r"def write_(speech_tokenizer|qwen3_tts_checkpoint)\b|torch\.Generator\(\)\.manual_seed")


def test_no_user_distribution_ships_a_checkpoint_builder():
    shipped = [
        path.relative_to(ROOT)
        for name in USER_DISTRIBUTIONS
        for path in (ROOT / name / "src").rglob("*.py")
        if BUILDS_WEIGHTS.search(path.read_text()) or path.stem.startswith("random_")
    ]
    assert not shipped, f"fixture code outside codecstream-testing: {shipped}"

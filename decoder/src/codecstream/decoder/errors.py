"""Errors a caller can catch by kind. Bad codes raise the protocol's CodesError, shared by every part."""

from __future__ import annotations

from codecstream.protocol.errors import CodesError


class CheckpointError(ValueError):
    """The `speech_tokenizer/` directory is not a loadable Qwen3-TTS-Tokenizer-12Hz decoder."""


__all__ = ["CheckpointError", "CodesError"]

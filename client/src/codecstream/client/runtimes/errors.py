"""Why a decoder could not be opened: one exception type, with a message that says what to do."""

from __future__ import annotations

from codecstream.client.errors import CodecStreamError


class DecoderLoadError(CodecStreamError):
    """A decoder artifact or checkpoint that cannot be opened: missing or invalid manifest, sha256
    mismatch, a runtime that is not installed (the message names the extra to install), a codec
    this client does not decode, or a backend the source does not offer."""

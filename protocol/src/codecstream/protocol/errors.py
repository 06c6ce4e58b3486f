"""Errors of codecstream. Every message names what was wrong and what was expected.

`CodecStreamError` is the base of every error codecstream raises on purpose, client and protocol
alike, so an application catches one type; it lives here, in the package every role installs.
"""


class CodecStreamError(Exception):
    """Base class of every error codecstream raises on purpose."""


class ProtocolError(CodecStreamError, ValueError):
    """Data that does not follow the codecstream.v1 contract."""


class CodesError(ProtocolError):
    """Codes bytes or arrays with the wrong length, shape or values."""


class StreamOrderError(ProtocolError):
    """Messages of a stream in an order the contract forbids (gaps, duplicates, data after End)."""


class ManifestError(ProtocolError):
    """A decoder artifact directory whose manifest.json is missing or invalid, or whose files do not
    match it (the client reports it as DecoderLoadError)."""


class CheckpointError(ProtocolError):
    """A checkpoint whose decoder cannot be found or loaded: a missing file, a header that is not
    safetensors, tensors of another decoder."""


class DigestError(CheckpointError):
    """A checkpoint from which no decoder digest can be computed."""


class ChunkingError(ProtocolError):
    """A chunking policy with sizes out of range."""

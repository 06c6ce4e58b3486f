"""Errors of the codec-frame core. Every message names what was wrong and what was expected."""


class ProtocolError(ValueError):
    """Base class: data that does not follow the codecstream.v1 contract."""


class CodesError(ProtocolError):
    """Codes bytes or arrays with the wrong length, shape or values."""


class StreamOrderError(ProtocolError):
    """Messages of a stream in an order the contract forbids (gaps, duplicates, data after End)."""


class CodecMismatchError(ProtocolError):
    """A decoder whose codec spec or weights digest does not match the stream's."""


class ChunkingError(ProtocolError):
    """A chunking policy with sizes out of range."""

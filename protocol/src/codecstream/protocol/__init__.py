"""The codec-frame core of codecstream.v1: pure Python and numpy, shared by client and server."""

from codecstream.protocol.chunking import DEFAULT_RAMP, ChunkSchedule
from codecstream.protocol.codec_spec import qwen3_tts_12hz_spec, spec_differences
from codecstream.protocol.codes import pack_codes, unpack_codes, validate_codes
from codecstream.protocol.codes_file import CodesFile, load_codes_file, save_codes_file
from codecstream.protocol.decoding import FrameDecoder
from codecstream.protocol.digest import DigestError, decoder_digest
from codecstream.protocol.errors import (
    ChunkingError,
    CodecStreamError,
    CodesError,
    ProtocolError,
    StreamOrderError,
)
from codecstream.protocol.reassembler import ReceivedChunk, StreamReassembler

__all__ = [
    "DEFAULT_RAMP",
    "ChunkSchedule",
    "ChunkingError",
    "CodecStreamError",
    "CodesError",
    "CodesFile",
    "DigestError",
    "FrameDecoder",
    "ProtocolError",
    "ReceivedChunk",
    "StreamOrderError",
    "StreamReassembler",
    "decoder_digest",
    "load_codes_file",
    "pack_codes",
    "qwen3_tts_12hz_spec",
    "save_codes_file",
    "spec_differences",
    "unpack_codes",
    "validate_codes",
]

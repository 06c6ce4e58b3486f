"""The codec spec of Qwen3-TTS-Tokenizer-12Hz and the check that a decoder fits a stream."""

from __future__ import annotations

from codecstream.protocol.decoding import CODEBOOK_SIZE, NUM_CODEBOOKS, SAMPLE_RATE_HZ, SAMPLES_PER_FRAME
from codecstream.protocol.preview import preview
from codecstream.v1 import codec_pb2

QWEN3_TTS_12HZ_NAME = "qwen3-tts-tokenizer-12hz"
QWEN3_TTS_12HZ_VERSION = "v2"
QWEN3_TTS_12HZ_LEFT_CONTEXT = 72

#: A whole decoder digest ("sha256:" and 64 hex digits) fits in a quoted value.
_QUOTED_CHARS = 80
#: Every field of CodecSpec, in contract order: what must match between a decoder and a stream.
CODEC_SPEC_FIELDS = tuple(field.name for field in codec_pb2.CodecSpec.DESCRIPTOR.fields)


def qwen3_tts_12hz_spec(decoder_digest: str) -> codec_pb2.CodecSpec:
    """The spec of the Qwen3-TTS 12 Hz codec ("tokenizer v2") for the given decoder weights."""
    return codec_pb2.CodecSpec(
        codec_name=QWEN3_TTS_12HZ_NAME,
        codec_version=QWEN3_TTS_12HZ_VERSION,
        num_codebooks=NUM_CODEBOOKS,
        codebook_size=CODEBOOK_SIZE,
        sample_rate_hz=SAMPLE_RATE_HZ,
        samples_per_frame=SAMPLES_PER_FRAME,
        decoder_left_context_frames=QWEN3_TTS_12HZ_LEFT_CONTEXT,
        decoder_digest=decoder_digest,
    )


def spec_differences(expected: codec_pb2.CodecSpec, actual: codec_pb2.CodecSpec) -> list[str]:
    """Human-readable differences, e.g. ["decoder_digest: expected 'sha256:ab..', got 'sha256:cd..'"].

    Either side may come from a client, so strings are quoted with `preview`.
    """
    return [
        f"{field}: expected {_quoted(getattr(expected, field))}, got {_quoted(getattr(actual, field))}"
        for field in CODEC_SPEC_FIELDS
        if getattr(expected, field) != getattr(actual, field)
    ]


def _quoted(value: str | int) -> str:
    return preview(value, _QUOTED_CHARS) if isinstance(value, str) else repr(value)

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class CodecSpec(_message.Message):
    __slots__ = ("codec_name", "codec_version", "num_codebooks", "codebook_size", "sample_rate_hz", "samples_per_frame", "decoder_left_context_frames", "decoder_digest")
    CODEC_NAME_FIELD_NUMBER: _ClassVar[int]
    CODEC_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_CODEBOOKS_FIELD_NUMBER: _ClassVar[int]
    CODEBOOK_SIZE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_FRAME_FIELD_NUMBER: _ClassVar[int]
    DECODER_LEFT_CONTEXT_FRAMES_FIELD_NUMBER: _ClassVar[int]
    DECODER_DIGEST_FIELD_NUMBER: _ClassVar[int]
    codec_name: str
    codec_version: str
    num_codebooks: int
    codebook_size: int
    sample_rate_hz: int
    samples_per_frame: int
    decoder_left_context_frames: int
    decoder_digest: str
    def __init__(self, codec_name: _Optional[str] = ..., codec_version: _Optional[str] = ..., num_codebooks: _Optional[int] = ..., codebook_size: _Optional[int] = ..., sample_rate_hz: _Optional[int] = ..., samples_per_frame: _Optional[int] = ..., decoder_left_context_frames: _Optional[int] = ..., decoder_digest: _Optional[str] = ...) -> None: ...

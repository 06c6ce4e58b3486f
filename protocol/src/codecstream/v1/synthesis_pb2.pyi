import datetime

from codecstream.v1 import codec_pb2 as _codec_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_TYPE_UNSPECIFIED: _ClassVar[TaskType]
    TASK_TYPE_CUSTOM_VOICE: _ClassVar[TaskType]
    TASK_TYPE_VOICE_DESIGN: _ClassVar[TaskType]
    TASK_TYPE_BASE: _ClassVar[TaskType]

class EndReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    END_REASON_UNSPECIFIED: _ClassVar[EndReason]
    END_REASON_EOS: _ClassVar[EndReason]
    END_REASON_CANCELLED: _ClassVar[EndReason]
    END_REASON_MAX_FRAMES: _ClassVar[EndReason]
    END_REASON_ERROR: _ClassVar[EndReason]

class ServingState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVING_STATE_UNSPECIFIED: _ClassVar[ServingState]
    SERVING_STATE_SERVING: _ClassVar[ServingState]
    SERVING_STATE_NOT_SERVING: _ClassVar[ServingState]
TASK_TYPE_UNSPECIFIED: TaskType
TASK_TYPE_CUSTOM_VOICE: TaskType
TASK_TYPE_VOICE_DESIGN: TaskType
TASK_TYPE_BASE: TaskType
END_REASON_UNSPECIFIED: EndReason
END_REASON_EOS: EndReason
END_REASON_CANCELLED: EndReason
END_REASON_MAX_FRAMES: EndReason
END_REASON_ERROR: EndReason
SERVING_STATE_UNSPECIFIED: ServingState
SERVING_STATE_SERVING: ServingState
SERVING_STATE_NOT_SERVING: ServingState

class SynthesizeRequest(_message.Message):
    __slots__ = ("start", "cancel", "ack", "resume", "text")
    START_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    start: Start
    cancel: Cancel
    ack: Ack
    resume: Resume
    text: TextInput
    def __init__(self, start: _Optional[_Union[Start, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., resume: _Optional[_Union[Resume, _Mapping]] = ..., text: _Optional[_Union[TextInput, _Mapping]] = ...) -> None: ...

class TextInput(_message.Message):
    __slots__ = ("text", "flush", "end_of_input")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    END_OF_INPUT_FIELD_NUMBER: _ClassVar[int]
    text: str
    flush: bool
    end_of_input: bool
    def __init__(self, text: _Optional[str] = ..., flush: bool = ..., end_of_input: bool = ...) -> None: ...

class Start(_message.Message):
    __slots__ = ("text", "voice", "language", "instructions", "task_type", "reference_audio", "seed", "sampling", "max_frames", "chunking", "client_request_id", "expected_codec", "resumable", "streaming_text")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_AUDIO_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAMES_FIELD_NUMBER: _ClassVar[int]
    CHUNKING_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CODEC_FIELD_NUMBER: _ClassVar[int]
    RESUMABLE_FIELD_NUMBER: _ClassVar[int]
    STREAMING_TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    voice: str
    language: str
    instructions: str
    task_type: TaskType
    reference_audio: ReferenceAudio
    seed: int
    sampling: SamplingParams
    max_frames: int
    chunking: ChunkingPolicy
    client_request_id: str
    expected_codec: _codec_pb2.CodecSpec
    resumable: bool
    streaming_text: bool
    def __init__(self, text: _Optional[str] = ..., voice: _Optional[str] = ..., language: _Optional[str] = ..., instructions: _Optional[str] = ..., task_type: _Optional[_Union[TaskType, str]] = ..., reference_audio: _Optional[_Union[ReferenceAudio, _Mapping]] = ..., seed: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., max_frames: _Optional[int] = ..., chunking: _Optional[_Union[ChunkingPolicy, _Mapping]] = ..., client_request_id: _Optional[str] = ..., expected_codec: _Optional[_Union[_codec_pb2.CodecSpec, _Mapping]] = ..., resumable: bool = ..., streaming_text: bool = ...) -> None: ...

class ReferenceAudio(_message.Message):
    __slots__ = ("audio", "transcript")
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    audio: bytes
    transcript: str
    def __init__(self, audio: _Optional[bytes] = ..., transcript: _Optional[str] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "repetition_penalty")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., repetition_penalty: _Optional[float] = ...) -> None: ...

class ChunkingPolicy(_message.Message):
    __slots__ = ("first_chunk_frames", "ramp_frames")
    FIRST_CHUNK_FRAMES_FIELD_NUMBER: _ClassVar[int]
    RAMP_FRAMES_FIELD_NUMBER: _ClassVar[int]
    first_chunk_frames: int
    ramp_frames: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, first_chunk_frames: _Optional[int] = ..., ramp_frames: _Optional[_Iterable[int]] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("played_frames",)
    PLAYED_FRAMES_FIELD_NUMBER: _ClassVar[int]
    played_frames: int
    def __init__(self, played_frames: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class Resume(_message.Message):
    __slots__ = ("stream_id", "last_acked_seq")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    last_acked_seq: int
    def __init__(self, stream_id: _Optional[str] = ..., last_acked_seq: _Optional[int] = ...) -> None: ...

class SynthesizeResponse(_message.Message):
    __slots__ = ("header", "chunk", "end")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    header: Header
    chunk: Chunk
    end: End
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., end: _Optional[_Union[End, _Mapping]] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("stream_id", "codec", "reference_codes", "reference_frames", "client_request_id", "started_at", "max_frames", "resume_window_ms")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_CODES_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FRAMES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAMES_FIELD_NUMBER: _ClassVar[int]
    RESUME_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    codec: _codec_pb2.CodecSpec
    reference_codes: bytes
    reference_frames: int
    client_request_id: str
    started_at: _timestamp_pb2.Timestamp
    max_frames: int
    resume_window_ms: int
    def __init__(self, stream_id: _Optional[str] = ..., codec: _Optional[_Union[_codec_pb2.CodecSpec, _Mapping]] = ..., reference_codes: _Optional[bytes] = ..., reference_frames: _Optional[int] = ..., client_request_id: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_frames: _Optional[int] = ..., resume_window_ms: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("seq", "first_frame", "num_frames", "codes", "generated_at_us", "sent_at_us", "text_start", "text_end", "ends_text_span")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FIRST_FRAME_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    CODES_FIELD_NUMBER: _ClassVar[int]
    GENERATED_AT_US_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_US_FIELD_NUMBER: _ClassVar[int]
    TEXT_START_FIELD_NUMBER: _ClassVar[int]
    TEXT_END_FIELD_NUMBER: _ClassVar[int]
    ENDS_TEXT_SPAN_FIELD_NUMBER: _ClassVar[int]
    seq: int
    first_frame: int
    num_frames: int
    codes: bytes
    generated_at_us: int
    sent_at_us: int
    text_start: int
    text_end: int
    ends_text_span: bool
    def __init__(self, seq: _Optional[int] = ..., first_frame: _Optional[int] = ..., num_frames: _Optional[int] = ..., codes: _Optional[bytes] = ..., generated_at_us: _Optional[int] = ..., sent_at_us: _Optional[int] = ..., text_start: _Optional[int] = ..., text_end: _Optional[int] = ..., ends_text_span: bool = ...) -> None: ...

class End(_message.Message):
    __slots__ = ("reason", "frames_generated", "message", "stats", "text_offset_played")
    REASON_FIELD_NUMBER: _ClassVar[int]
    FRAMES_GENERATED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    TEXT_OFFSET_PLAYED_FIELD_NUMBER: _ClassVar[int]
    reason: EndReason
    frames_generated: int
    message: str
    stats: StreamStats
    text_offset_played: int
    def __init__(self, reason: _Optional[_Union[EndReason, str]] = ..., frames_generated: _Optional[int] = ..., message: _Optional[str] = ..., stats: _Optional[_Union[StreamStats, _Mapping]] = ..., text_offset_played: _Optional[int] = ...) -> None: ...

class StreamStats(_message.Message):
    __slots__ = ("time_to_first_frame_us", "duration_us", "chunks", "played_frames")
    TIME_TO_FIRST_FRAME_US_FIELD_NUMBER: _ClassVar[int]
    DURATION_US_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    PLAYED_FRAMES_FIELD_NUMBER: _ClassVar[int]
    time_to_first_frame_us: int
    duration_us: int
    chunks: int
    played_frames: int
    def __init__(self, time_to_first_frame_us: _Optional[int] = ..., duration_us: _Optional[int] = ..., chunks: _Optional[int] = ..., played_frames: _Optional[int] = ...) -> None: ...

class GetCodecInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCodecInfoResponse(_message.Message):
    __slots__ = ("codec", "model", "server_version", "languages", "task_types", "max_text_chars", "max_frames", "default_chunking", "resume_window_ms", "max_instructions_chars", "max_reference_transcript_chars", "max_reference_audio_bytes", "min_reference_audio_ms", "max_reference_audio_ms", "max_request_bytes", "first_message_timeout_ms", "stalled_client_timeout_ms", "min_clause_chars", "max_segment_chars", "text_idle_ms", "streamed_text_grows", "start_gate_tokens", "text_input_timeout_ms", "max_text_input_ms", "max_streams_per_client", "control_messages_per_s", "control_message_burst", "serving_state", "not_serving_reason")
    CODEC_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPES_FIELD_NUMBER: _ClassVar[int]
    MAX_TEXT_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAMES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_CHUNKING_FIELD_NUMBER: _ClassVar[int]
    RESUME_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_INSTRUCTIONS_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_REFERENCE_TRANSCRIPT_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_REFERENCE_AUDIO_BYTES_FIELD_NUMBER: _ClassVar[int]
    MIN_REFERENCE_AUDIO_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_REFERENCE_AUDIO_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    FIRST_MESSAGE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    STALLED_CLIENT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_CLAUSE_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_SEGMENT_CHARS_FIELD_NUMBER: _ClassVar[int]
    TEXT_IDLE_MS_FIELD_NUMBER: _ClassVar[int]
    STREAMED_TEXT_GROWS_FIELD_NUMBER: _ClassVar[int]
    START_GATE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEXT_INPUT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_TEXT_INPUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_STREAMS_PER_CLIENT_FIELD_NUMBER: _ClassVar[int]
    CONTROL_MESSAGES_PER_S_FIELD_NUMBER: _ClassVar[int]
    CONTROL_MESSAGE_BURST_FIELD_NUMBER: _ClassVar[int]
    SERVING_STATE_FIELD_NUMBER: _ClassVar[int]
    NOT_SERVING_REASON_FIELD_NUMBER: _ClassVar[int]
    codec: _codec_pb2.CodecSpec
    model: str
    server_version: str
    languages: _containers.RepeatedScalarFieldContainer[str]
    task_types: _containers.RepeatedScalarFieldContainer[TaskType]
    max_text_chars: int
    max_frames: int
    default_chunking: ChunkingPolicy
    resume_window_ms: int
    max_instructions_chars: int
    max_reference_transcript_chars: int
    max_reference_audio_bytes: int
    min_reference_audio_ms: int
    max_reference_audio_ms: int
    max_request_bytes: int
    first_message_timeout_ms: int
    stalled_client_timeout_ms: int
    min_clause_chars: int
    max_segment_chars: int
    text_idle_ms: int
    streamed_text_grows: bool
    start_gate_tokens: int
    text_input_timeout_ms: int
    max_text_input_ms: int
    max_streams_per_client: int
    control_messages_per_s: float
    control_message_burst: int
    serving_state: ServingState
    not_serving_reason: str
    def __init__(self, codec: _Optional[_Union[_codec_pb2.CodecSpec, _Mapping]] = ..., model: _Optional[str] = ..., server_version: _Optional[str] = ..., languages: _Optional[_Iterable[str]] = ..., task_types: _Optional[_Iterable[_Union[TaskType, str]]] = ..., max_text_chars: _Optional[int] = ..., max_frames: _Optional[int] = ..., default_chunking: _Optional[_Union[ChunkingPolicy, _Mapping]] = ..., resume_window_ms: _Optional[int] = ..., max_instructions_chars: _Optional[int] = ..., max_reference_transcript_chars: _Optional[int] = ..., max_reference_audio_bytes: _Optional[int] = ..., min_reference_audio_ms: _Optional[int] = ..., max_reference_audio_ms: _Optional[int] = ..., max_request_bytes: _Optional[int] = ..., first_message_timeout_ms: _Optional[int] = ..., stalled_client_timeout_ms: _Optional[int] = ..., min_clause_chars: _Optional[int] = ..., max_segment_chars: _Optional[int] = ..., text_idle_ms: _Optional[int] = ..., streamed_text_grows: bool = ..., start_gate_tokens: _Optional[int] = ..., text_input_timeout_ms: _Optional[int] = ..., max_text_input_ms: _Optional[int] = ..., max_streams_per_client: _Optional[int] = ..., control_messages_per_s: _Optional[float] = ..., control_message_burst: _Optional[int] = ..., serving_state: _Optional[_Union[ServingState, str]] = ..., not_serving_reason: _Optional[str] = ...) -> None: ...

class ListDecoderArtifactsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListDecoderArtifactsResponse(_message.Message):
    __slots__ = ("artifacts",)
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    artifacts: _containers.RepeatedCompositeFieldContainer[DecoderArtifact]
    def __init__(self, artifacts: _Optional[_Iterable[_Union[DecoderArtifact, _Mapping]]] = ...) -> None: ...

class DecoderArtifact(_message.Message):
    __slots__ = ("manifest_json",)
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    manifest_json: str
    def __init__(self, manifest_json: _Optional[str] = ...) -> None: ...

class DownloadDecoderArtifactRequest(_message.Message):
    __slots__ = ("sha256", "offset")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    offset: int
    def __init__(self, sha256: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class DownloadDecoderArtifactResponse(_message.Message):
    __slots__ = ("offset", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ListVoicesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListVoicesResponse(_message.Message):
    __slots__ = ("voices", "default_voice")
    VOICES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_VOICE_FIELD_NUMBER: _ClassVar[int]
    voices: _containers.RepeatedCompositeFieldContainer[Voice]
    default_voice: str
    def __init__(self, voices: _Optional[_Iterable[_Union[Voice, _Mapping]]] = ..., default_voice: _Optional[str] = ...) -> None: ...

class Voice(_message.Message):
    __slots__ = ("name", "description", "languages")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    languages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., languages: _Optional[_Iterable[str]] = ...) -> None: ...

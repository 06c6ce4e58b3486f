"""Start message -> SynthesisRequest, with a precise gRPC status for everything it refuses.

This is the one place a Start is checked: what it returns is canonical (the voice and language
spelled as the model spells them, the limits applied), and the code sources trust it. Every check
is cheap and bounded (lengths are compared before anything is scanned), so it runs on the event
loop; decoding the reference audio and tokenizing the prompt come later, off it. Client input
appears in messages only through `preview`.
"""

from __future__ import annotations

import dataclasses
import math
import struct

from codecstream.protocol.chunking import ChunkSchedule
from codecstream.protocol.codec_spec import spec_differences
from codecstream.protocol.errors import ChunkingError
from codecstream.protocol.preview import preview
from codecstream.server.errors import Refusal, invalid
from codecstream.server.limits import MAX_CLIENT_REQUEST_ID_BYTES, MAX_NAME_BYTES, ServerLimits
from codecstream.server.request import AUTO_LANGUAGE, ModelOffering, SamplingOverrides, SynthesisRequest, TaskType
from codecstream.server.text_input import StreamedText, text_length_problem
from codecstream.v1 import codec_pb2
from codecstream.v1 import synthesis_pb2 as pb

TASK_TYPES = {
    pb.TASK_TYPE_UNSPECIFIED: TaskType.CUSTOM_VOICE,
    pb.TASK_TYPE_CUSTOM_VOICE: TaskType.CUSTOM_VOICE,
    pb.TASK_TYPE_VOICE_DESIGN: TaskType.VOICE_DESIGN,
    pb.TASK_TYPE_BASE: TaskType.BASE,
}
TASK_TYPE_ENUMS = {
    TaskType.CUSTOM_VOICE: pb.TASK_TYPE_CUSTOM_VOICE,
    TaskType.VOICE_DESIGN: pb.TASK_TYPE_VOICE_DESIGN,
    TaskType.BASE: pb.TASK_TYPE_BASE,
}
#: vLLM's own range for the talker's temperature: it refuses anything above 2 and silently raises
#: anything between 0 and 0.01 to 0.01, so those are refused here rather than changed.
MIN_TEMPERATURE = 0.01
MAX_TEMPERATURE = 2.0


@dataclasses.dataclass(frozen=True)
class ParsedStart:
    #: The request, without its reference audio decoded yet (see reference_audio.py).
    request: SynthesisRequest
    schedule: ChunkSchedule
    #: ReferenceAudio.audio, read once: every read of a bytes field copies it (MBs here).
    reference_audio: bytes


def parse_start(
    start: pb.Start, offering: ModelOffering, codec: codec_pb2.CodecSpec, limits: ServerLimits
) -> ParsedStart:
    """Check a Start against the contract, the limits and what the loaded model offers."""
    if start.HasField("expected_codec"):
        differences = spec_differences(codec, start.expected_codec)
        if differences:
            raise Refusal(
                "FAILED_PRECONDITION", f"client decoder does not match this server's codec ({'; '.join(differences)})"
            )
    text = start.text
    problem = text_length_problem(len(text), limits.max_text_chars)
    if problem:
        raise invalid(problem)
    if not start.streaming_text and not text.strip():
        raise invalid("text is empty")
    task = _check_task_type(start.task_type, offering)
    if start.streaming_text:
        if task is TaskType.BASE:
            raise invalid("streaming_text is offered for CUSTOM_VOICE and VOICE_DESIGN, not BASE")
        if start.resumable:
            raise invalid("streaming_text and resumable cannot be combined (text sent while disconnected is lost)")
    reference_audio = start.reference_audio.audio
    _check_reference(reference_audio, start.reference_audio.transcript, task, limits)
    instructions = start.instructions
    if len(instructions) > limits.max_instructions_chars:
        raise invalid(f"instructions has {len(instructions)} characters, the limit is {limits.max_instructions_chars}")
    if task is TaskType.VOICE_DESIGN and not instructions.strip():
        raise invalid("task type VOICE_DESIGN needs instructions describing the voice")
    language = _check_language(start.language, offering)
    voice = _check_voice(start.voice, task, offering)
    if start.max_frames > limits.max_frames:
        raise invalid(f"max_frames {start.max_frames} exceeds the server limit {limits.max_frames}")
    if len(start.client_request_id.encode()) > MAX_CLIENT_REQUEST_ID_BYTES:
        raise invalid(f"client_request_id is longer than {MAX_CLIENT_REQUEST_ID_BYTES} bytes")
    try:
        schedule = ChunkSchedule.from_policy(start.chunking, limits.default_chunking)
    except ChunkingError as error:
        raise invalid(f"chunking: {error}") from None
    streamed_text = StreamedText(text, limits) if start.streaming_text else None
    request = SynthesisRequest(
        text="" if streamed_text else text,
        task_type=task,
        voice=voice,
        language=language,
        instructions=instructions,
        reference_text=start.reference_audio.transcript,
        seed=start.seed if start.HasField("seed") else None,
        sampling=_parse_sampling(start.sampling),
        max_frames=start.max_frames or limits.max_frames,
        streamed_text=streamed_text,
    )
    return ParsedStart(request, schedule, reference_audio)


def _task_name(task: TaskType) -> str:
    return pb.TaskType.Name(TASK_TYPE_ENUMS[task]).removeprefix("TASK_TYPE_")


def _check_task_type(value: int, offering: ModelOffering) -> TaskType:
    if value not in TASK_TYPES:
        raise invalid(f"unknown task type {value}; expected CUSTOM_VOICE, VOICE_DESIGN or BASE")
    task = TASK_TYPES[value]
    if task not in offering.task_types:
        served = ", ".join(_task_name(t) for t in offering.task_types)
        raise invalid(f"task type {_task_name(task)} is not served by this model (it serves {served})")
    return task


def _check_reference(audio: bytes, transcript: str, task: TaskType, limits: ServerLimits) -> None:
    if task is not TaskType.BASE:
        if audio or transcript:
            raise invalid("reference_audio is only used by task type BASE")
        return
    if not audio:
        raise invalid("task type BASE (voice clone) needs reference_audio.audio")
    if len(audio) > limits.max_reference_audio_bytes:
        raise invalid(
            f"reference_audio.audio is {len(audio)} bytes, the limit is {limits.max_reference_audio_bytes} bytes"
        )
    if len(transcript) > limits.max_reference_transcript_chars:
        raise invalid(
            f"reference_audio.transcript has {len(transcript)} characters, "
            f"the limit is {limits.max_reference_transcript_chars}"
        )


def _check_name_size(field: str, value: str) -> None:
    size = len(value.encode())
    if size > MAX_NAME_BYTES:
        raise invalid(f"{field} is {size} bytes, the limit is {MAX_NAME_BYTES}")


def _check_language(language: str, offering: ModelOffering) -> str:
    _check_name_size("language", language)
    if not language.strip() or language.strip().lower() == AUTO_LANGUAGE.lower():
        return AUTO_LANGUAGE
    known = {name.lower(): name for name in offering.languages}
    if language.strip().lower() not in known:
        raise invalid(f"unknown language {preview(language)}; this model speaks: {', '.join(offering.languages)}")
    return known[language.strip().lower()]


def _check_voice(voice: str, task: TaskType, offering: ModelOffering) -> str:
    _check_name_size("voice", voice)
    if not voice.strip():
        if task is not TaskType.CUSTOM_VOICE:
            return ""
        if not offering.default_voice:
            raise invalid("this model has no preset voices, so CUSTOM_VOICE cannot be served")
        return offering.default_voice
    if task is not TaskType.CUSTOM_VOICE:
        raise invalid(f"voice is only used by task type CUSTOM_VOICE, got voice {preview(voice)}")
    known = {v.name.lower(): v.name for v in offering.voices}
    if voice.strip().lower() not in known:
        names = ", ".join(v.name for v in offering.voices)
        raise invalid(f"unknown voice {preview(voice)}; this model has: {names}")
    return known[voice.strip().lower()]


def _as_written(value: float) -> float:
    """A float32 field as the client wrote it: the shortest decimal that is the same float32
    (0.01 arrives as 0.009999999776, which a float64 range check refuses)."""
    if not math.isfinite(value):
        return value
    for digits in range(1, 10):
        shortest = float(f"{value:.{digits}g}")
        if struct.unpack("f", struct.pack("f", shortest))[0] == value:
            return shortest
    return value


def _float_field(sampling: pb.SamplingParams, name: str) -> float | None:
    return _as_written(getattr(sampling, name)) if sampling.HasField(name) else None


def _parse_sampling(sampling: pb.SamplingParams) -> SamplingOverrides:
    temperature = _float_field(sampling, "temperature")
    if temperature is not None and not (
        math.isfinite(temperature) and MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE
    ):
        raise invalid(
            f"sampling.temperature must be in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], got {temperature:g}"
        )
    top_p = _float_field(sampling, "top_p")
    if top_p is not None and not 0 < top_p <= 1:
        raise invalid(f"sampling.top_p must be in (0, 1], got {top_p:g}")
    top_k = sampling.top_k if sampling.HasField("top_k") else None
    if top_k is not None and top_k < 1:
        raise invalid(f"sampling.top_k must be >= 1, got {top_k}")
    penalty = _float_field(sampling, "repetition_penalty")
    if penalty is not None and not (math.isfinite(penalty) and penalty > 0):
        raise invalid(f"sampling.repetition_penalty must be finite and > 0, got {penalty:g}")
    return SamplingOverrides(temperature=temperature, top_p=top_p, top_k=top_k, repetition_penalty=penalty)

"""Start message -> SynthesisRequest, with a precise gRPC status for everything it rejects."""

from __future__ import annotations

from codecstream.protocol.chunking import ChunkSchedule
from codecstream.protocol.codec_spec import spec_differences
from codecstream.protocol.errors import ChunkingError
from codecstream.server.limits import ServerLimits
from codecstream.server.source import CodeSource, RequestRejected, SamplingOverrides, SynthesisRequest, TaskType
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
MAX_CLIENT_REQUEST_ID_BYTES = 128


def _invalid(message: str) -> RequestRejected:
    return RequestRejected("INVALID_ARGUMENT", message)


def parse_start(start: pb.Start, source: CodeSource, limits: ServerLimits) -> tuple[SynthesisRequest, ChunkSchedule]:
    """Check a Start against the contract, the limits and what the loaded model offers."""
    if start.HasField("expected_codec"):
        differences = spec_differences(source.codec, start.expected_codec)
        if differences:
            raise RequestRejected(
                "FAILED_PRECONDITION", f"client decoder does not match this server's codec ({'; '.join(differences)})"
            )
    text = start.text
    if not text.strip():
        raise _invalid("text is empty")
    if len(text) > limits.max_text_chars:
        raise _invalid(f"text has {len(text)} characters, the limit is {limits.max_text_chars}")
    if start.task_type not in TASK_TYPES:
        raise _invalid(f"unknown task type {start.task_type}; expected CUSTOM_VOICE, VOICE_DESIGN or BASE")
    task = TASK_TYPES[start.task_type]
    served = source.supported_task_types()
    if task not in served:
        names = ", ".join(pb.TaskType.Name(TASK_TYPE_ENUMS[t]).removeprefix("TASK_TYPE_") for t in served)
        name = pb.TaskType.Name(TASK_TYPE_ENUMS[task]).removeprefix("TASK_TYPE_")
        raise _invalid(f"task type {name} is not served by this model (it serves {names})")
    has_reference = bool(start.reference_audio.audio)
    if task is TaskType.BASE and not has_reference:
        raise _invalid("task type BASE (voice clone) needs reference_audio.audio")
    if task is not TaskType.BASE and has_reference:
        raise _invalid("reference_audio is only used by task type BASE")
    if task is TaskType.VOICE_DESIGN and not start.instructions.strip():
        raise _invalid("task type VOICE_DESIGN needs instructions describing the voice")
    language = _check_language(start.language, source)
    voice = _check_voice(start.voice, task, source)
    if start.max_frames > limits.max_frames:
        raise _invalid(f"max_frames {start.max_frames} exceeds the server limit {limits.max_frames}")
    if len(start.client_request_id.encode()) > MAX_CLIENT_REQUEST_ID_BYTES:
        raise _invalid(f"client_request_id is longer than {MAX_CLIENT_REQUEST_ID_BYTES} bytes")
    try:
        schedule = ChunkSchedule.from_policy(start.chunking, limits.default_chunking)
    except ChunkingError as error:
        raise _invalid(f"chunking: {error}") from None
    request = SynthesisRequest(
        text=text,
        task_type=task,
        voice=voice,
        language=language,
        instructions=start.instructions,
        reference_audio=start.reference_audio.audio,
        reference_text=start.reference_audio.transcript,
        seed=start.seed if start.HasField("seed") else None,
        sampling=_parse_sampling(start.sampling),
        max_frames=start.max_frames or limits.max_frames,
    )
    return request, schedule


def _check_language(language: str, source: CodeSource) -> str:
    if not language or language.lower() == "auto":
        return "Auto"
    known = {name.lower(): name for name in source.languages()}
    if language.lower() not in known:
        raise _invalid(f"unknown language {language!r}; this model speaks: {', '.join(sorted(known.values()))}")
    return known[language.lower()]


def _check_voice(voice: str, task: TaskType, source: CodeSource) -> str:
    if not voice:
        return ""
    if task is not TaskType.CUSTOM_VOICE:
        raise _invalid(f"voice is only used by task type CUSTOM_VOICE, got voice {voice!r}")
    known = {v.name.lower(): v.name for v in source.voices()}
    if voice.lower() not in known:
        raise _invalid(f"unknown voice {voice!r}; this model has: {', '.join(sorted(known.values()))}")
    return known[voice.lower()]


def _parse_sampling(sampling: pb.SamplingParams) -> SamplingOverrides:
    if sampling.HasField("temperature") and not sampling.temperature > 0:
        raise _invalid(f"sampling.temperature must be > 0, got {sampling.temperature}")
    if sampling.HasField("top_p") and not 0 < sampling.top_p <= 1:
        raise _invalid(f"sampling.top_p must be in (0, 1], got {sampling.top_p}")
    if sampling.HasField("top_k") and sampling.top_k < 1:
        raise _invalid(f"sampling.top_k must be >= 1, got {sampling.top_k}")
    if sampling.HasField("repetition_penalty") and not sampling.repetition_penalty > 0:
        raise _invalid(f"sampling.repetition_penalty must be > 0, got {sampling.repetition_penalty}")
    return SamplingOverrides(
        temperature=sampling.temperature if sampling.HasField("temperature") else None,
        top_p=sampling.top_p if sampling.HasField("top_p") else None,
        top_k=sampling.top_k if sampling.HasField("top_k") else None,
        repetition_penalty=sampling.repetition_penalty if sampling.HasField("repetition_penalty") else None,
    )

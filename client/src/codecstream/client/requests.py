"""Building Start messages from keyword arguments a user would guess."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from codecstream.protocol.chunking import ChunkSchedule
from codecstream.v1 import codec_pb2
from codecstream.v1 import synthesis_pb2 as pb

TASK_TYPES = {
    "customvoice": pb.TASK_TYPE_CUSTOM_VOICE,
    "custom_voice": pb.TASK_TYPE_CUSTOM_VOICE,
    "voicedesign": pb.TASK_TYPE_VOICE_DESIGN,
    "voice_design": pb.TASK_TYPE_VOICE_DESIGN,
    "base": pb.TASK_TYPE_BASE,
    "clone": pb.TASK_TYPE_BASE,
}


class StartOptions(TypedDict, total=False):
    """The options of a synthesis request, as `stream_codes` and `synthesize` take them (both
    clients): every one optional, names as in the OpenAI-style speech API and the contract's Start.

    voice: a preset speaker (ListVoices); empty: the model's default voice.
    language: e.g. "English"; empty or "Auto": detected.
    instructions: style (CustomVoice) or the voice description (VoiceDesign).
    task_type: "CustomVoice" (default), "VoiceDesign" or "Base" (voice clone).
    reference_audio, reference_text: a WAV/FLAC/OGG file's bytes and what it says (Base).
    seed, temperature, top_p, top_k, repetition_penalty: sampling.
    max_frames: stop after this many frames (80 ms each); 0: the server's limit.
    chunking: frames per chunk, e.g. [1, 2, 4, 8] (the default; the last repeats).
    client_request_id: echoed in the Header and the server's log.
    resumable: reattach after a lost connection (default True).
    expected_codec: the CodecSpec of the decoder that will decode the codes.
    """

    voice: str
    language: str
    instructions: str
    task_type: str
    reference_audio: bytes
    reference_text: str
    seed: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    repetition_penalty: float | None
    max_frames: int
    chunking: Sequence[int] | ChunkSchedule | None
    client_request_id: str
    resumable: bool
    expected_codec: codec_pb2.CodecSpec | None


def build_start(
    text: str,
    *,
    voice: str = "",
    language: str = "",
    instructions: str = "",
    task_type: str = "CustomVoice",
    reference_audio: bytes = b"",
    reference_text: str = "",
    seed: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    repetition_penalty: float | None = None,
    max_frames: int = 0,
    chunking: Sequence[int] | ChunkSchedule | None = None,
    client_request_id: str = "",
    resumable: bool = True,
    expected_codec: codec_pb2.CodecSpec | None = None,
) -> pb.Start:
    try:
        task = TASK_TYPES[task_type.lower()]
    except KeyError:
        raise ValueError(f"unknown task_type {task_type!r}; expected CustomVoice, VoiceDesign or Base") from None
    start = pb.Start(
        text=text,
        voice=voice,
        language=language,
        instructions=instructions,
        task_type=task,
        max_frames=max_frames,
        client_request_id=client_request_id,
        resumable=resumable,
    )
    if reference_audio:
        start.reference_audio.audio = reference_audio
        start.reference_audio.transcript = reference_text
    if seed is not None:
        start.seed = seed
    for name, value in (
        ("temperature", temperature),
        ("top_p", top_p),
        ("top_k", top_k),
        ("repetition_penalty", repetition_penalty),
    ):
        if value is not None:
            setattr(start.sampling, name, value)
    if chunking is not None:
        schedule = chunking if isinstance(chunking, ChunkSchedule) else ChunkSchedule(tuple(chunking))
        start.chunking.CopyFrom(schedule.to_policy())
    if expected_codec is not None:
        start.expected_codec.CopyFrom(expected_codec)
    return start

"""Reference audio of a voice-clone request, checked and converted before any engine sees it.

The talker encodes the reference into codec frames itself (its speech_tokenizer encoder, at
24 kHz, one frame per 1920 samples). Decoding and resampling here, before the request goes in,
makes the frame count known up front (the prompt placeholder must have exactly as many positions
as the talker will build, and the client is told how many reference frames to expect), and keeps
audio the engine would fail on (too short, non-finite) away from it: an exception inside the
engine's worker takes the whole engine down. Decoding costs milliseconds to tens of
milliseconds, so the service runs it off the event loop; its libraries are imported with the module,
not by the first request (an import holds the interpreter lock for ~0.1 s).
"""

from __future__ import annotations

import dataclasses
import io
import math

import numpy as np
import soundfile
import soxr
from codecstream.protocol.decoding import SAMPLE_RATE_HZ, SAMPLES_PER_FRAME
from codecstream.server.limits import ServerLimits

#: Rates a reference file may have: telephone audio to studio masters.
MIN_SAMPLE_RATE_HZ = 8_000
MAX_SAMPLE_RATE_HZ = 192_000
MAX_CHANNELS = 2
_FIELD = "reference_audio.audio"


class ReferenceAudioError(ValueError):
    """Reference audio the server refuses; the message names the field and the limit."""


@dataclasses.dataclass(frozen=True)
class ReferenceAudio:
    samples: np.ndarray  # float32, mono, at the encoder's rate (SAMPLE_RATE_HZ)

    @property
    def num_frames(self) -> int:
        return math.ceil(self.samples.size / SAMPLES_PER_FRAME)


def decode_reference_audio(data: bytes, limits: ServerLimits) -> ReferenceAudio:
    """Decode WAV/FLAC/OGG bytes to 24 kHz mono float32; raise ReferenceAudioError saying what is
    wrong. Their size was checked with the rest of the Start (request_parsing.py)."""
    try:
        # The header alone says rate, channels and length: refuse before decoding anything.
        info = soundfile.info(io.BytesIO(data))
    except Exception as error:
        raise ReferenceAudioError(f"{_FIELD} is not a readable WAV, FLAC or OGG file ({_reason(error)})") from None
    if not 1 <= info.channels <= MAX_CHANNELS:
        raise ReferenceAudioError(f"{_FIELD} has {info.channels} channels; mono or stereo expected")
    if not MIN_SAMPLE_RATE_HZ <= info.samplerate <= MAX_SAMPLE_RATE_HZ:
        raise ReferenceAudioError(
            f"{_FIELD} is sampled at {info.samplerate} Hz; {MIN_SAMPLE_RATE_HZ} to {MAX_SAMPLE_RATE_HZ} Hz accepted"
        )
    _check_duration(info.frames / info.samplerate, limits)
    try:
        mono, rate = _read_mono(data)
    except ReferenceAudioError:
        raise
    except Exception as error:
        raise ReferenceAudioError(f"{_FIELD} could not be decoded ({_reason(error)})") from None
    # A header may lie about the length (a truncated file): check what was actually decoded.
    _check_duration(mono.size / rate, limits)
    if rate != SAMPLE_RATE_HZ:
        mono = soxr.resample(mono, rate, SAMPLE_RATE_HZ)
    return ReferenceAudio(np.ascontiguousarray(mono, dtype=np.float32))


def _read_mono(data: bytes) -> tuple[np.ndarray, int]:
    """Decode to mono float32 in blocks of a quarter second: libsndfile holds the GIL while it
    decodes (a large file at once stalls the event loop: docs/performance.md, "Measurements behind
    the code"), and lets go between blocks."""
    blocks = []
    offset = 0
    with soundfile.SoundFile(io.BytesIO(data)) as audio:
        rate, channels = audio.samplerate, audio.channels
        # Averaging channels as a matrix product: numpy's mean over a short axis is 10x slower.
        mix = np.full((channels, 1), 1.0 / channels, dtype=np.float32)
        for block in audio.blocks(blocksize=max(1, rate // 4), dtype="float32", always_2d=True):
            finite = np.isfinite(block)
            if not finite.all():
                index = offset + int(np.argwhere(~finite)[0][0])
                raise ReferenceAudioError(f"{_FIELD} has a non-finite sample (NaN or infinity) at sample {index}")
            blocks.append((block @ mix)[:, 0])
            offset += len(block)
    return (np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.float32)), rate


def _check_duration(seconds: float, limits: ServerLimits) -> None:
    # Rounded away from the limit: 23,999 samples at 24 kHz must not read "lasts 1.000 s, shorter
    # than the 1 s".
    if seconds < limits.min_reference_audio_s:
        shown = math.floor(seconds * 1000) / 1000
        raise ReferenceAudioError(
            f"{_FIELD} lasts {shown:.3f} s, shorter than the {limits.min_reference_audio_s:g} s "
            "the speaker encoder needs"
        )
    if seconds > limits.max_reference_audio_s:
        shown = math.ceil(seconds * 10) / 10
        raise ReferenceAudioError(
            f"{_FIELD} lasts {shown:.1f} s, longer than the {limits.max_reference_audio_s:g} s allowed"
        )


def _reason(error: Exception) -> str:
    # libsndfile's messages start with the file object's repr ("Error opening <_io.BytesIO object
    # at 0x...>: Format not recognised."): keep only the reason after it.
    return str(error).rsplit(": ", 1)[-1].strip().rstrip(".") or type(error).__name__


def silent_wav(seconds: float) -> bytes:
    """A WAV file of silence at the encoder's rate (to warm the voice-clone path up)."""
    out = io.BytesIO()
    soundfile.write(out, np.zeros(int(seconds * SAMPLE_RATE_HZ), dtype=np.float32), SAMPLE_RATE_HZ, format="WAV")
    return out.getvalue()

"""Reference audio of a voice-clone request, as the talker's speech-tokenizer encoder wants it.

The talker encodes the reference into codec frames itself (its speech_tokenizer encoder, at
24 kHz, one frame per 1920 samples). Resampling here, before the request goes in, makes the frame
count known up front: the prompt placeholder must have exactly as many positions as the talker
will build, and the client is told how many reference frames to expect.
"""

from __future__ import annotations

import dataclasses
import io
import math

import numpy as np

ENCODER_SAMPLE_RATE_HZ = 24_000
SAMPLES_PER_FRAME = 1_920
MAX_REFERENCE_SECONDS = 60.0


class ReferenceAudioError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class ReferenceAudio:
    samples: np.ndarray  # float32, mono, ENCODER_SAMPLE_RATE_HZ

    @property
    def num_frames(self) -> int:
        return math.ceil(self.samples.size / SAMPLES_PER_FRAME)


def decode_reference_audio(data: bytes) -> ReferenceAudio:
    """Decode WAV/FLAC/OGG bytes to 24 kHz mono float32; raise ReferenceAudioError saying what is wrong."""
    import soundfile

    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as error:
        raise ReferenceAudioError(f"reference_audio is not a readable WAV, FLAC or OGG file ({error})") from None
    if samples.shape[0] == 0:
        raise ReferenceAudioError("reference_audio has no samples")
    seconds = samples.shape[0] / rate
    if seconds > MAX_REFERENCE_SECONDS:
        raise ReferenceAudioError(
            f"reference_audio lasts {seconds:.1f} s, longer than the {MAX_REFERENCE_SECONDS:.0f} s allowed"
        )
    mono = samples.mean(axis=1)
    if rate != ENCODER_SAMPLE_RATE_HZ:
        import soxr

        mono = soxr.resample(mono, rate, ENCODER_SAMPLE_RATE_HZ)
    return ReferenceAudio(np.ascontiguousarray(mono, dtype=np.float32))


def silent_wav(seconds: float) -> bytes:
    """A WAV file of silence at the encoder's rate (to warm the voice-clone path up)."""
    import soundfile

    out = io.BytesIO()
    silence = np.zeros(int(seconds * ENCODER_SAMPLE_RATE_HZ), dtype=np.float32)
    soundfile.write(out, silence, ENCODER_SAMPLE_RATE_HZ, format="WAV")
    return out.getvalue()

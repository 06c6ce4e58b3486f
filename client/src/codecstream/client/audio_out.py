"""Where PCM goes: a WAV file (standard library, always there) or the speaker (sounddevice)."""

from __future__ import annotations

import pathlib
import wave

import numpy as np
from codecstream.client.errors import CodecStreamError
from codecstream.client.jitter_buffer import JitterBuffer
from codecstream.protocol.decoding import SAMPLE_RATE_HZ
from codecstream.protocol.pcm import to_pcm16


class AudioDeviceUnavailable(CodecStreamError):
    """No way to play sound here (no PortAudio library, no output device); WAV output still works."""


class WavWriter:
    """Streams PCM into a 16-bit mono WAV file as it arrives."""

    def __init__(self, path: pathlib.Path | str, sample_rate: int = SAMPLE_RATE_HZ) -> None:
        self.path = pathlib.Path(path)
        self._wave = wave.open(str(self.path), "wb")
        self._wave.setnchannels(1)
        self._wave.setsampwidth(2)
        self._wave.setframerate(sample_rate)
        self.samples_written = 0

    def write(self, samples: np.ndarray) -> None:
        self._wave.writeframes(to_pcm16(samples).tobytes())
        self.samples_written += len(samples)

    def close(self) -> None:
        self._wave.close()

    def __enter__(self) -> WavWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class Speaker:
    """Plays a JitterBuffer through the default output device (sounddevice / PortAudio)."""

    BLOCK_FRAMES = 480  # 20 ms at 24 kHz: small enough that a cancel is heard at once

    def __init__(self, buffer: JitterBuffer, device: int | str | None = None) -> None:
        try:
            import sounddevice
        except OSError as error:  # sounddevice raises OSError when libportaudio2 is missing
            raise AudioDeviceUnavailable(
                f"cannot play audio: {error} (install libportaudio2, or write a WAV with --out)"
            ) from None
        except ImportError:
            raise AudioDeviceUnavailable(
                "cannot play audio: sounddevice is not installed (pip install 'codecstream-client[audio]')"
            ) from None
        self.buffer = buffer

        def callback(outdata, frames, time_info, status) -> None:
            outdata[:, 0] = buffer.pull(frames)

        try:
            self._stream = sounddevice.OutputStream(
                samplerate=buffer.sample_rate,
                channels=1,
                dtype="float32",
                blocksize=self.BLOCK_FRAMES,
                device=device,
                callback=callback,
            )
            self._stream.start()
        except Exception as error:  # PortAudioError: no device, busy device, bad sample rate
            raise AudioDeviceUnavailable(f"cannot play audio: {error}") from None

    def close(self) -> None:
        self._stream.stop()
        self._stream.close()

"""Pure-PyTorch Qwen3-TTS-Tokenizer-12Hz decoder: full-utterance, 72-frame windowed and stateful streaming.

from codecstream.decoder import load_decoder, StatefulDecoder
decoder = StatefulDecoder(load_decoder("path/to/speech_tokenizer"))
decoder.prime(reference_codes)      # optional voice-clone context, plays nothing
pcm = decoder.decode(codes_chunk)   # (k, 16) ints -> k * 1920 float32 samples at 24 kHz
decoder.reset()                     # next decode starts a new utterance
"""

from codecstream.decoder.checkpoint import load_decoder
from codecstream.decoder.config import DecoderConfig
from codecstream.decoder.errors import CheckpointError, CodesError
from codecstream.decoder.full import FullUtteranceDecoder, decode_utterance
from codecstream.decoder.model import Qwen3TTSDecoder
from codecstream.decoder.streaming import StatefulDecoder, StatefulDecoderStep
from codecstream.decoder.torch_frame_decoder import TorchFrameDecoder
from codecstream.decoder.windowed import WindowedDecoder, WindowedDecoderModule

#: How a FrameDecoder over the torch model decodes (artifacts offer the first two: manifest.ARTIFACT_MODES).
DECODING_MODES = ("stateful", "windowed", "windowed-plain", "full")


def make_frame_decoder(model: Qwen3TTSDecoder, mode: str = "stateful") -> TorchFrameDecoder:
    """Wrap an already loaded model: "stateful", "windowed" (conv-split), "windowed-plain" or "full"."""
    if mode == "stateful":
        return StatefulDecoder(model)
    if mode == "windowed":
        return WindowedDecoder(model, conv_split=True)
    if mode == "windowed-plain":
        return WindowedDecoder(model, conv_split=False)
    if mode == "full":
        return FullUtteranceDecoder(model)
    raise ValueError(f"unknown decoding mode {mode!r}, expected one of {list(DECODING_MODES)}")


__all__ = [
    "DECODING_MODES",
    "CheckpointError",
    "CodesError",
    "DecoderConfig",
    "FullUtteranceDecoder",
    "Qwen3TTSDecoder",
    "StatefulDecoder",
    "StatefulDecoderStep",
    "TorchFrameDecoder",
    "WindowedDecoder",
    "WindowedDecoderModule",
    "decode_utterance",
    "load_decoder",
    "make_frame_decoder",
]

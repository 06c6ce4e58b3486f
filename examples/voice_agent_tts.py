"""codecstream as the TTS service of a voice agent, in the style of pipeline frameworks (Pipecat, LiveKit).

Each assistant turn has a context id; audio frames are pushed downstream tagged with it. When the
user interrupts, `interrupt()` cancels the turn on the server (reporting how much was played), drops
audio still queued for the speaker and resets the decoder, so the next turn starts clean at once.

    python examples/voice_agent_tts.py --server 127.0.0.1:50051 --decoder artifacts/decoder-onnx
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import uuid

import numpy as np
from codecstream.client import AsyncClient
from codecstream.client.jitter_buffer import JitterBuffer
from codecstream.protocol.decoding import FRAME_SECONDS, SAMPLE_RATE_HZ


@dataclasses.dataclass
class TTSAudioFrame:
    context_id: str
    samples: np.ndarray
    sample_rate: int = SAMPLE_RATE_HZ


class CodecStreamTTSService:
    """Turns text of one turn into audio frames; one turn speaks at a time."""

    def __init__(self, client: AsyncClient, decoder, voice: str = "vivian") -> None:
        self._client = client
        self._decoder = decoder
        self._voice = voice
        self._turn = None
        self.speaker = JitterBuffer()  # what a transport's audio output would drain

    async def run_tts(self, text: str) -> str:
        """Speak `text` as a new turn; returns the turn's context id once all of it is queued."""
        context_id = uuid.uuid4().hex[:8]
        self._turn = self._client.synthesize(
            text, decoder=self._decoder, voice=self._voice, client_request_id=context_id
        )
        async for chunk in self._turn:
            self.push_frame(TTSAudioFrame(context_id, chunk.samples))
        return context_id

    def push_frame(self, frame: TTSAudioFrame) -> None:
        self.speaker.push(frame.samples)

    async def interrupt(self) -> None:
        """The user started talking: stop the turn, drop queued audio, report what was heard."""
        played_frames = int(self.speaker.stats.played_s / FRAME_SECONDS)
        self.speaker.clear()
        if self._turn is not None:
            await self._turn.cancel(played_frames=played_frames)
        self.speaker = JitterBuffer()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="127.0.0.1:50051")
    parser.add_argument("--decoder", required=True)
    args = parser.parse_args()
    async with AsyncClient(args.server) as client:
        tts = CodecStreamTTSService(client, args.decoder)
        turn = asyncio.create_task(tts.run_tts("Let me tell you a long story about codec tokens and tiny devices."))
        await asyncio.sleep(0.5)
        await tts.interrupt()  # barge-in
        await asyncio.gather(turn, return_exceptions=True)
        context_id = await tts.run_tts("Okay, what would you like to know?")
        print(f"turn {context_id}: {tts.speaker.buffered_s:.2f} s of audio queued for the speaker")


if __name__ == "__main__":
    asyncio.run(main())

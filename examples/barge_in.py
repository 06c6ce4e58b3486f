"""Barge-in: the listener interrupts after N ms; the stream stops at once and a new answer starts.

python examples/barge_in.py --server 127.0.0.1:50051 --decoder artifacts/decoder-onnx --after-ms 800
"""

import argparse
import time

from codecstream.client import Client
from codecstream.protocol.decoding import FRAME_SECONDS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="127.0.0.1:50051")
    parser.add_argument("--decoder", required=True)
    parser.add_argument("--after-ms", type=float, default=800.0, help="interrupt this long after the request")
    args = parser.parse_args()

    with Client(args.server) as client:
        started = time.monotonic()
        answer = client.synthesize(
            "Here is a rather long answer that the listener will cut short.", decoder=args.decoder
        )
        for chunk in answer:
            if (time.monotonic() - started) * 1000 >= args.after_ms:
                # In a real app: the frames the speaker actually played, from its jitter buffer.
                end = answer.cancel(played_frames=chunk.first_frame + chunk.num_frames)
                print(
                    f"interrupted at frame {chunk.first_frame + chunk.num_frames}; "
                    f"server ended with reason {end.reason} after {end.frames_generated} frames"
                )
                break
        reply = client.synthesize("Sure, go ahead.", decoder=args.decoder)
        audio_s = sum(chunk.num_frames for chunk in reply) * FRAME_SECONDS
        print(f"new answer: {audio_s:.2f} s of audio, first audio {reply.stats.time_to_first_audio_s * 1000:.0f} ms")


if __name__ == "__main__":
    main()

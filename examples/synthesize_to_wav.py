"""Synthesize one sentence to a WAV file, decoding on this device.

python examples/synthesize_to_wav.py --server 127.0.0.1:50051 --decoder artifacts/decoder-onnx out.wav
"""

import argparse

from codecstream.client import Client
from codecstream.client.audio_out import WavWriter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--server", default="127.0.0.1:50051")
    parser.add_argument(
        "--decoder", required=True, help="artifact directory (codecstream export-decoder) or checkpoint"
    )
    parser.add_argument("--text", default="Codec tokens travel, audio is made here.")
    args = parser.parse_args()

    with Client(args.server) as client, WavWriter(args.out) as wav:
        stream = client.synthesize(args.text, decoder=args.decoder, voice="vivian")
        for chunk in stream:
            wav.write(chunk.samples)
    print(
        f"{stream.stats.audio_s:.2f} s of audio, "
        f"first audio after {stream.stats.time_to_first_audio_s * 1000:.0f} ms -> {args.out}"
    )


if __name__ == "__main__":
    main()

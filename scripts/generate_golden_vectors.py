#!/usr/bin/env python3
"""Write protocol/golden/vectors.json: serialized messages and streams with their decoded meaning.

A client in another language checks itself against these: parse each `hex`, compare with `json`
(protobuf JSON mapping) and, for chunks and streams, with the decoded `frames`; invalid streams
name the error class a conforming client raises. Regenerate with
`python scripts/generate_golden_vectors.py`; the test suite fails if the file is stale.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
from codecstream.protocol import pack_codes, qwen3_tts_12hz_spec
from codecstream.v1 import synthesis_pb2 as pb
from google.protobuf import json_format

OUT = pathlib.Path(__file__).resolve().parent.parent / "protocol" / "golden" / "vectors.json"
DIGEST = "sha256:" + "5e" * 32


def codes_for(first_frame: int, frames: int) -> np.ndarray:
    """Deterministic codes that exercise both bytes of the int16 and the range ends."""
    values = (np.arange(first_frame * 16, (first_frame + frames) * 16) * 131) % 2048
    codes = values.reshape(frames, 16).astype(np.int16)
    codes[0, 0] = 2047
    return codes


def response_hex(message: pb.SynthesizeResponse) -> str:
    return message.SerializeToString(deterministic=True).hex()


def entry(name: str, message, **meaning) -> dict:
    return {
        "name": name,
        "type": message.DESCRIPTOR.full_name,
        "hex": message.SerializeToString(deterministic=True).hex(),
        "json": json_format.MessageToDict(message),
        **meaning,
    }


def build() -> dict:
    spec = qwen3_tts_12hz_spec(DIGEST)
    reference = codes_for(100, 3)
    header = pb.SynthesizeResponse(
        header=pb.Header(
            stream_id="golden-1", codec=spec, reference_codes=pack_codes(reference), reference_frames=3, max_frames=2048
        )
    )
    chunks = []
    first = 0
    for seq, size in enumerate((2, 4, 3)):
        codes = codes_for(first, size)
        chunks.append(
            pb.SynthesizeResponse(
                chunk=pb.Chunk(
                    seq=seq,
                    first_frame=first,
                    num_frames=size,
                    codes=pack_codes(codes),
                    generated_at_us=1000 * (seq + 1),
                )
            )
        )
        first += size
    end = pb.SynthesizeResponse(
        end=pb.End(reason=pb.END_REASON_EOS, frames_generated=first, stats=pb.StreamStats(chunks=3))
    )
    start = pb.SynthesizeRequest(
        start=pb.Start(
            text="Hello, world.",
            voice="vivian",
            language="English",
            task_type=pb.TASK_TYPE_CUSTOM_VOICE,
            seed=42,
            chunking=pb.ChunkingPolicy(first_chunk_frames=2, ramp_frames=[4, 8, 16, 25]),
            resumable=True,
        )
    )
    all_frames = np.concatenate([codes_for(0, 2), codes_for(2, 4), codes_for(6, 3)])
    bad_range = pb.Chunk(seq=0, first_frame=0, num_frames=1, codes=np.full(16, 2048, "<i2").tobytes())
    return {
        "description": __doc__.strip().splitlines()[0],
        "codes_layout": "int16 little-endian, frame-major, num_frames x 16",
        "messages": [
            entry("start_custom_voice", start),
            entry("cancel_after_12_frames", pb.SynthesizeRequest(cancel=pb.Cancel(played_frames=12))),
            entry("ack_seq_3", pb.SynthesizeRequest(ack=pb.Ack(seq=3))),
            entry("resume_after_seq_1", pb.SynthesizeRequest(resume=pb.Resume(stream_id="golden-1", last_acked_seq=1))),
            entry("header_with_reference_codes", header, reference_frames=reference.tolist()),
            *(
                entry(f"chunk_seq_{i}", c, frames=codes_for(c.chunk.first_frame, c.chunk.num_frames).tolist())
                for i, c in enumerate(chunks)
            ),
            entry("end_eos", end),
            entry("start_streaming_text", pb.SynthesizeRequest(start=pb.Start(text="Hello", streaming_text=True))),
            entry("text_input_piece", pb.SynthesizeRequest(text=pb.TextInput(text=" there."))),
            entry("text_input_flush", pb.SynthesizeRequest(text=pb.TextInput(flush=True))),
            entry("text_input_end_of_input", pb.SynthesizeRequest(text=pb.TextInput(text=" Bye.", end_of_input=True))),
            entry(
                "chunk_with_text_span",
                pb.SynthesizeResponse(
                    chunk=pb.Chunk(
                        seq=0, first_frame=0, num_frames=2, codes=pack_codes(codes_for(0, 2)), text_start=0, text_end=12
                    )
                ),
                frames=codes_for(0, 2).tolist(),
                text="Hello there.",
            ),
            entry(
                "end_cancelled_with_text_offset",
                pb.SynthesizeResponse(
                    end=pb.End(
                        reason=pb.END_REASON_CANCELLED,
                        frames_generated=9,
                        stats=pb.StreamStats(chunks=3, played_frames=6),
                        text_offset_played=12,
                    )
                ),
            ),
        ],
        "streams": [
            {
                "name": "valid_eos",
                "messages": [response_hex(m) for m in (header, *chunks, end)],
                "frames": all_frames.tolist(),
                "error": None,
            },
            {
                "name": "gap",
                "messages": [response_hex(m) for m in (header, chunks[0], chunks[2])],
                "frames": None,
                "error": "StreamOrderError",
            },
            {
                "name": "duplicate",
                "messages": [response_hex(m) for m in (header, chunks[0], chunks[0])],
                "frames": None,
                "error": "StreamOrderError",
            },
            {
                "name": "chunk_before_header",
                "messages": [response_hex(chunks[0])],
                "frames": None,
                "error": "StreamOrderError",
            },
            {
                "name": "data_after_end",
                "messages": [response_hex(m) for m in (header, *chunks, end, chunks[0])],
                "frames": None,
                "error": "StreamOrderError",
            },
            {
                "name": "code_out_of_range",
                "messages": [response_hex(header), response_hex(pb.SynthesizeResponse(chunk=bad_range))],
                "frames": None,
                "error": "CodesError",
            },
        ],
    }


def render() -> str:
    return json.dumps(build(), indent=1, sort_keys=False) + "\n"


def main() -> int:
    OUT.write_text(render())
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())

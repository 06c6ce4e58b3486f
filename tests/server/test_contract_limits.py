"""The limits synthesis.proto's comments state are the ones the code enforces: each number a
client reads in the contract equals the constant the server (or the protocol package) checks."""

from __future__ import annotations

import pathlib
import re

import pytest
from codecstream.protocol.chunking import DEFAULT_RAMP, MAX_CHUNK_FRAMES, MAX_RAMP_ENTRIES
from codecstream.server.decoder_artifacts import PART_BYTES
from codecstream.server.limits import MAX_CLIENT_REQUEST_ID_BYTES, MAX_NAME_BYTES, MAX_STREAM_ID_BYTES
from codecstream.server.reference_audio import MAX_CHANNELS, MAX_SAMPLE_RATE_HZ, MIN_SAMPLE_RATE_HZ
from codecstream.server.request_parsing import MAX_TEMPERATURE, MIN_TEMPERATURE

PROTO = pathlib.Path(__file__).resolve().parents[2] / "protocol" / "codecstream" / "v1" / "synthesis.proto"


def comments() -> dict[str, str]:
    """Each message's and field's comment, by "Message" and "Message.field"."""
    found, pending, message = {}, [], None
    for line in PROTO.read_text().splitlines():
        line = line.strip()
        if line.startswith("//"):
            pending.append(line.removeprefix("//").strip())
            continue
        if opened := re.match(r"message (\w+) \{", line):
            message = opened.group(1)
            found[message] = " ".join(pending)
        elif message and (field := re.match(r"(?:optional |repeated )?[\w.]+ (\w+) = \d+;", line)):
            found[f"{message}.{field.group(1)}"] = " ".join(pending)
        elif line == "}":
            message = None
        pending = []
    return found


CASES = [
    ("Start.voice", r"at most (\d+) bytes", lambda n: int(n), MAX_NAME_BYTES),
    ("Start.language", r"at most (\d+) bytes", lambda n: int(n), MAX_NAME_BYTES),
    ("Start.client_request_id", r"At most (\d+) bytes", lambda n: int(n), MAX_CLIENT_REQUEST_ID_BYTES),
    ("Resume.stream_id", r"at most (\d+) bytes", lambda n: int(n), MAX_STREAM_ID_BYTES),
    ("ReferenceAudio.audio", r"(\d+) to (\d+) Hz", lambda low, high: (int(low), int(high)),
     (MIN_SAMPLE_RATE_HZ, MAX_SAMPLE_RATE_HZ)),
    ("ReferenceAudio.audio", r"(mono or stereo)", lambda _: 2, MAX_CHANNELS),
    ("SamplingParams.temperature", r"in \[([\d.]+), ([\d.]+)\]", lambda low, high: (float(low), float(high)),
     (MIN_TEMPERATURE, MAX_TEMPERATURE)),
    ("ChunkingPolicy.first_chunk_frames", r"in \[1, (\d+)\]", lambda n: int(n), MAX_CHUNK_FRAMES),
    ("ChunkingPolicy.ramp_frames", r"At most (\d+) entries, each in \[1, (\d+)\]",
     lambda entries, frames: (int(entries), int(frames)), (MAX_RAMP_ENTRIES, MAX_CHUNK_FRAMES)),
    ("ChunkingPolicy", r"the default ramp stops at (\d+) frames", lambda n: int(n), DEFAULT_RAMP[-1]),
    ("DownloadDecoderArtifactResponse.data", r"At most (\d+) KiB", lambda n: int(n) * 1024, PART_BYTES),
]  # fmt: skip


@pytest.mark.parametrize(("where", "pattern", "read", "enforced"), CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_the_contract_states_the_limit_the_code_enforces(where, pattern, read, enforced):
    comment = comments()[where]
    stated = re.search(pattern, comment)
    assert stated, f"synthesis.proto's comment on {where} no longer matches {pattern!r}: {comment!r}"
    assert read(*stated.groups()) == enforced

"""The committed golden vectors decode to their stated meaning, and are what the code produces today."""

import json
import pathlib
import sys

import numpy as np
import pytest
from codecstream.protocol import StreamReassembler, errors, unpack_codes
from codecstream.v1 import synthesis_pb2 as pb
from google.protobuf import json_format

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECTORS = json.loads((ROOT / "protocol" / "golden" / "vectors.json").read_text())
sys.path.insert(0, str(ROOT / "scripts"))
import generate_golden_vectors  # noqa: E402

TYPES = {
    "codecstream.v1.SynthesizeRequest": pb.SynthesizeRequest,
    "codecstream.v1.SynthesizeResponse": pb.SynthesizeResponse,
}


def test_golden_file_is_up_to_date():
    assert (ROOT / "protocol" / "golden" / "vectors.json").read_text() == generate_golden_vectors.render(), (
        "run `python scripts/generate_golden_vectors.py` and commit protocol/golden/vectors.json"
    )


@pytest.mark.parametrize("vector", VECTORS["messages"], ids=lambda v: v["name"])
def test_message_bytes_parse_to_the_stated_meaning(vector):
    message = TYPES[vector["type"]].FromString(bytes.fromhex(vector["hex"]))
    assert json_format.MessageToDict(message) == vector["json"]
    if "frames" in vector:
        chunk = message.chunk
        np.testing.assert_array_equal(unpack_codes(chunk.codes, chunk.num_frames), np.array(vector["frames"]))
    if "reference_frames" in vector:
        header = message.header
        np.testing.assert_array_equal(
            unpack_codes(header.reference_codes, header.reference_frames), np.array(vector["reference_frames"])
        )


@pytest.mark.parametrize("stream", VECTORS["streams"], ids=lambda s: s["name"])
def test_streams_reassemble_to_their_frames_or_raise_their_error(stream):
    reassembler = StreamReassembler()
    received = []

    def run():
        for hex_message in stream["messages"]:
            chunk = reassembler.accept(pb.SynthesizeResponse.FromString(bytes.fromhex(hex_message)))
            if chunk is not None:
                received.append(chunk.codes)

    if stream["error"]:
        with pytest.raises(getattr(errors, stream["error"])):
            run()
    else:
        run()
        np.testing.assert_array_equal(np.concatenate(received), np.array(stream["frames"]))
        assert reassembler.finished

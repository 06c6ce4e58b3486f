import json
import struct

import numpy as np
import pytest
from codecstream.protocol import DigestError, decoder_digest


def write_safetensors(path, tensors: dict[str, np.ndarray]) -> None:
    """A minimal safetensors writer (the format is a JSON header plus raw bytes)."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


@pytest.fixture
def tensors():
    rng = np.random.default_rng(0)
    return {
        "decoder.a.weight": rng.standard_normal((4, 3)),
        "decoder.b.bias": rng.standard_normal(5),
        "encoder.x.weight": rng.standard_normal(6),
    }


def test_digest_is_stable_under_tensor_order_and_ignores_encoder(tmp_path, tensors):
    write_safetensors(tmp_path / "a.safetensors", tensors)
    reordered = dict(reversed(list(tensors.items())))
    reordered["encoder.x.weight"] = reordered["encoder.x.weight"] + 1
    write_safetensors(tmp_path / "b.safetensors", reordered)
    digest = decoder_digest(tmp_path / "a.safetensors")
    assert digest.startswith("sha256:") and len(digest) == 7 + 64
    assert decoder_digest(tmp_path / "b.safetensors") == digest


def test_any_decoder_weight_change_changes_the_digest(tmp_path, tensors):
    write_safetensors(tmp_path / "a.safetensors", tensors)
    tensors["decoder.b.bias"] = tensors["decoder.b.bias"].copy()
    tensors["decoder.b.bias"][2] += 1e-6
    write_safetensors(tmp_path / "b.safetensors", tensors)
    assert decoder_digest(tmp_path / "a.safetensors") != decoder_digest(tmp_path / "b.safetensors")


def test_model_directory_resolves_to_its_speech_tokenizer(tmp_path, tensors):
    (tmp_path / "speech_tokenizer").mkdir()
    write_safetensors(tmp_path / "speech_tokenizer" / "model.safetensors", tensors)
    assert decoder_digest(tmp_path) == decoder_digest(tmp_path / "speech_tokenizer" / "model.safetensors")


def test_missing_or_foreign_files_raise_digest_error(tmp_path, tensors):
    with pytest.raises(DigestError, match="no speech-tokenizer weights"):
        decoder_digest(tmp_path)
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 20)
    with pytest.raises(DigestError, match="not a safetensors file"):
        decoder_digest(tmp_path / "junk.safetensors")
    write_safetensors(tmp_path / "enc.safetensors", {"encoder.x": np.zeros(2)})
    with pytest.raises(DigestError, match="no tensors named decoder"):
        decoder_digest(tmp_path / "enc.safetensors")


def test_a_sharded_checkpoint_has_the_digest_of_the_same_tensors_in_one_file(tmp_path, tensors):
    write_safetensors(tmp_path / "one.safetensors", tensors)
    sharded = tmp_path / "sharded" / "speech_tokenizer"
    sharded.mkdir(parents=True)
    names = list(tensors)
    write_safetensors(sharded / "model-00001-of-00002.safetensors", {n: tensors[n] for n in names[:1]})
    write_safetensors(sharded / "model-00002-of-00002.safetensors", {n: tensors[n] for n in names[1:]})
    weight_map = {n: f"model-0000{1 if i == 0 else 2}-of-00002.safetensors" for i, n in enumerate(names)}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert decoder_digest(tmp_path / "sharded") == decoder_digest(tmp_path / "one.safetensors")


def test_an_index_naming_a_missing_shard_raises_digest_error_naming_it(tmp_path, tensors):
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"decoder.a": "gone.safetensors"}})
    )
    with pytest.raises(DigestError, match=r"names shards that are not there: gone\.safetensors"):
        decoder_digest(tmp_path)

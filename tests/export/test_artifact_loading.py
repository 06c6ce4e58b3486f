"""open_decoder refuses what it cannot trust or run, with a message that says why."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from codecstream.client.runtimes import FORMATS, DecoderLoadError, open_decoder
from codecstream.protocol.manifest import MANIFEST_FILE, read_manifest
from codecstream.protocol.pcm import snr_db

from tests.conftest import random_codes


def copy_artifact(source: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    target = tmp_path / source.name
    shutil.copytree(source, target)
    return target


def edit_manifest(directory: pathlib.Path, edit) -> None:
    path = directory / MANIFEST_FILE
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("backend", FORMATS)
def test_an_artifact_modified_after_export_is_refused_by_its_sha256(backend, artifacts, tmp_path):
    fmt = FORMATS[backend]
    directory = copy_artifact(artifacts[(fmt, "stateful", "fp32")], tmp_path)
    file = directory / f"decoder.{fmt}"
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))
    with pytest.raises(
        DecoderLoadError,
        match=r"decoder\.\w+: sha256 mismatch: manifest.json says sha256:[0-9a-f]+, the file has sha256:",
    ):
        open_decoder(directory, backend=backend)


def test_a_directory_without_manifest_is_refused(artifacts, tmp_path):
    directory = copy_artifact(artifacts[("onnx", "stateful", "fp32")], tmp_path)
    (directory / MANIFEST_FILE).unlink()
    with pytest.raises(DecoderLoadError, match=r"has no manifest\.json: not a decoder artifact directory"):
        open_decoder(directory)


@pytest.mark.parametrize("backend", FORMATS)
def test_a_manifest_whose_state_shapes_do_not_match_the_file_is_refused(backend, artifacts, tmp_path):
    directory = copy_artifact(artifacts[(FORMATS[backend], "stateful", "fp32")], tmp_path)

    def widen_history(data):
        for spec in data["inputs"]:
            if spec["name"] == "pre_conv.history":
                spec["shape"][1] += 1

    edit_manifest(directory, widen_history)
    with pytest.raises(DecoderLoadError, match=r"does not match its manifest: input 2 \(pre_conv.history\) has shape"):
        open_decoder(directory, backend=backend)


def test_a_manifest_for_another_codec_is_refused(artifacts, tmp_path):
    directory = copy_artifact(artifacts[("onnx", "stateful", "fp32")], tmp_path)
    edit_manifest(directory, lambda data: data["codec"].update(num_codebooks=8))
    with pytest.raises(DecoderLoadError, match=r"codec mismatch: .*num_codebooks: expected 16, got 8"):
        open_decoder(directory)


@pytest.mark.parametrize("module, backend", [("onnxruntime", "onnx"), ("openvino", "openvino")])
def test_a_missing_runtime_is_named_with_the_extra_to_install(module, backend, artifacts, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # import it -> ImportError
    with pytest.raises(DecoderLoadError, match=rf"pip install 'codecstream-client\[{backend}\]'"):
        open_decoder(artifacts[("onnx", "stateful", "fp32")], backend=backend)


def test_auto_runs_the_onnx_file_on_onnx_runtime_where_openvino_is_missing(artifacts, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)
    assert open_decoder(artifacts[("onnx", "stateful", "fp32")]).backend == "onnx"


def test_openvino_is_refused_for_a_directory_without_the_onnx_file(artifacts):
    message = r"holds no onnx artifact \(it holds: pt2\); the openvino backend runs onnx artifacts"
    with pytest.raises(DecoderLoadError, match=message):
        open_decoder(artifacts[("pt2", "stateful", "fp32")], backend="openvino")


def test_a_decoder_whose_first_decode_fails_is_refused_at_load(artifacts, monkeypatch):
    from codecstream.client.runtimes.onnx_program import OnnxProgram

    def broken_run(self, inputs):
        raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code")

    monkeypatch.setattr(OnnxProgram, "run", broken_run)
    with pytest.raises(DecoderLoadError, match=r"the decoder loaded but its first decode failed: .*RUNTIME_EXCEPTION"):
        open_decoder(artifacts[("onnx", "stateful", "fp32")], backend="onnx")


def test_asking_for_a_format_the_directory_does_not_hold_is_refused(artifacts):
    with pytest.raises(DecoderLoadError, match="holds no pte artifact \\(it holds: onnx\\)"):
        open_decoder(artifacts[("onnx", "stateful", "fp32")], backend="pte")


def test_a_checkpoint_is_decoded_by_torch_only(tiny_checkpoint):
    with pytest.raises(DecoderLoadError, match="only the torch backend decodes; for onnx, export it first"):
        open_decoder(tiny_checkpoint, backend="onnx")


@pytest.mark.parametrize("backend", ["auto", "onnx"])
def test_onnx_artifacts_decode_in_a_process_without_torch(backend, artifacts):
    """The laptop/Jetson client: OpenVINO or ONNX Runtime, no torch (made unimportable in the child)."""
    directory = artifacts[("onnx", "stateful", "fp32")]
    program = (
        "import sys, numpy as np\n"
        "sys.modules['torch'] = None\n"
        "from codecstream.client.runtimes import open_decoder\n"
        f"decoder = open_decoder({str(directory)!r}, backend={backend!r})\n"
        f"pcm = decoder.decode(np.array({random_codes(5).tolist()}))\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print(decoder.backend, pcm.shape, pcm.dtype)\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    expected = "openvino" if backend == "auto" else backend  # auto: OpenVINO first, installed here
    assert result.stdout.strip() == f"{expected} (9600,) float32"


ONNX_FP32 = ("onnx", "stateful", "fp32")


def test_openvino_keeps_the_compiled_decoder_and_the_next_open_imports_it(artifacts, cache, monkeypatch):
    source = artifacts[ONNX_FP32]
    first = open_decoder(source, backend="openvino")
    again = open_decoder(source, backend="openvino")
    monkeypatch.setenv("CODECSTREAM_OPENVINO_CACHE", "0")
    uncached = open_decoder(source, backend="openvino")
    assert "from the cache" not in first.description
    assert "compiled program from the cache" in again.description
    assert "from the cache" not in uncached.description
    folder = cache / "openvino" / read_manifest(source).artifacts["onnx"].sha256.replace(":", "-")
    assert list(folder.glob("*.blob"))
    codes = random_codes(6, 3)
    np.testing.assert_array_equal(again.new_stream().decode(codes), uncached.new_stream().decode(codes))


def test_openvino_s_kept_program_belongs_to_the_artifact_s_bytes_not_its_path(artifacts, cache, tmp_path):
    open_decoder(artifacts[ONNX_FP32], backend="openvino")
    moved = copy_artifact(artifacts[ONNX_FP32], tmp_path)
    assert "compiled program from the cache" in open_decoder(moved, backend="openvino").description


def test_openvino_compiles_again_under_other_settings_and_keeps_only_the_newest_program(artifacts, cache):
    source = artifacts[ONNX_FP32]
    open_decoder(source, backend="openvino", threads=1)
    assert "from the cache" not in open_decoder(source, backend="openvino", threads=2).description
    folder = cache / "openvino" / read_manifest(source).artifacts["onnx"].sha256.replace(":", "-")
    assert len(list(folder.glob("*.blob"))) == 1


def test_openvino_compiles_again_a_kept_program_it_cannot_import(artifacts, cache, caplog):
    source = artifacts[ONNX_FP32]
    reference = open_decoder(source, backend="openvino").new_stream().decode(random_codes(4, 2))
    folder = cache / "openvino" / read_manifest(source).artifacts["onnx"].sha256.replace(":", "-")
    (kept,) = folder.glob("*.blob")
    kept.write_bytes(kept.read_bytes()[: kept.stat().st_size // 3])  # a disk that filled up, say
    decoder = open_decoder(source, backend="openvino")
    assert "from the cache" not in decoder.description and "cannot be imported" in caplog.text
    np.testing.assert_array_equal(decoder.new_stream().decode(random_codes(4, 2)), reference)
    assert "compiled program from the cache" in open_decoder(source, backend="openvino").description


@pytest.mark.parametrize("key", [ONNX_FP32, ("onnx", "windowed", "fp32"), ("onnx", "stateful", "int8")])
def test_openvino_runs_every_snake_beta_of_an_onnx_artifact_as_one_fused_operation(key, artifacts, cache, monkeypatch):
    snake_betas = 4 * 7 + 1  # a decoder block: one before its upsampling, two a residual unit (3); the output
    fused = open_decoder(artifacts[key], backend="openvino")
    monkeypatch.setenv("CODECSTREAM_OPENVINO_OPS", "0")
    standard = open_decoder(artifacts[key], backend="openvino")
    assert f"{snake_betas} SnakeBeta fused" in fused.description
    assert "0 SnakeBeta fused" in standard.description
    if key[2] == "fp32":  # int8 quantizes activations per call, so the last bits of a SnakeBeta move
        codes = random_codes(12, 5)  # a rounding step there; its own parity test bounds it
        assert snr_db(standard.new_stream().decode(codes), fused.new_stream().decode(codes)) > 110


def test_openvino_keeps_the_compiled_programs_of_the_two_artifacts_opened_last(artifacts, cache):
    for key in (("onnx", "stateful", "fp32"), ("onnx", "windowed", "fp32"), ("onnx", "stateful", "int8")):
        open_decoder(artifacts[key], backend="openvino")
    kept = {folder.name for folder in (cache / "openvino").iterdir()}
    assert kept == {read_manifest(artifacts[key]).artifacts["onnx"].sha256.replace(":", "-") for key in
                    (("onnx", "windowed", "fp32"), ("onnx", "stateful", "int8"))}  # fmt: skip


def test_openvino_compiles_without_a_cache_it_cannot_write(artifacts, tmp_path, monkeypatch, caplog):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv("CODECSTREAM_CACHE_DIR", str(not_a_folder))
    decoder = open_decoder(artifacts[ONNX_FP32], backend="openvino")
    assert decoder.new_stream().decode(random_codes(2, 1)).size
    assert "OpenVINO compiles without a cache" in caplog.text

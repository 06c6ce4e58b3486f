"""`codecstream export-decoder` and `codecstream parity decoder`: exit codes, one-line errors, outputs."""

from __future__ import annotations

import importlib.util
import json
import shlex
import shutil

import numpy as np
import pytest
from codecstream.client import cli
from codecstream.client.runtimes import open_decoder
from codecstream.export.cli import artifact_summary, register_parity
from codecstream.protocol.codes_file import save_codes_file
from codecstream.protocol.digest import decoder_digest
from codecstream.protocol.manifest import MANIFEST_FILE, read_manifest

from tests.conftest import random_codes
from tests.malicious_server import DIGEST, manifest_json, sha256

from .conftest import codecstream, export_command


def run_in_process(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_parity_decoder(capsys, artifact, checkpoint, *args: str) -> tuple[int, str, str]:
    command = ["parity", "decoder", "--artifact", str(artifact), "--checkpoint", str(checkpoint), *args]
    return run_in_process(capsys, *command)


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


def test_export_decoder_refuses_an_unsupported_combination_in_one_line(tiny_checkpoint, tmp_path, capsys):
    code, _, err = run_in_process(
        capsys,
        "export-decoder",
        str(tiny_checkpoint),
        "--format",
        "onnx",
        "--dtype",
        "bf16",
        "--out",
        str(tmp_path / "out"),
    )
    assert code == 2
    assert one_line(err) == (
        "codecstream export-decoder: error: --dtype bf16 is not supported for onnx artifacts "
        "(supported: fp32, int8); bf16 is available for pt2"
    )
    assert not (tmp_path / "out").exists()


def test_export_decoder_reports_a_bad_checkpoint_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, _, err = run_in_process(
        capsys, "export-decoder", str(tmp_path / "empty"), "--format", "pt2", "--quiet", "--out", str(tmp_path / "out")
    )
    assert code == 2
    assert one_line(err).startswith("codecstream export-decoder: error: cannot read checkpoint: ")


def test_export_decoder_names_the_extra_when_an_exporter_dependency_is_missing(
    tiny_checkpoint, tmp_path, capsys, monkeypatch
):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real_find_spec(name, *a)
    )
    code, _, err = run_in_process(
        capsys, "export-decoder", str(tiny_checkpoint), "--format", "onnx", "--out", str(tmp_path)
    )
    assert code == 2
    assert one_line(err) == (
        "codecstream export-decoder: error: onnx export needs onnxscript, which is not installed: "
        "pip install 'codecstream-export[onnx]'"
    )


def test_exporting_another_graph_into_an_artifact_directory_is_refused_before_converting(
    artifacts, tiny_checkpoint, tmp_path, capsys
):
    directory = tmp_path / "stateful"
    shutil.copytree(artifacts[("onnx", "stateful", "fp32")], directory)
    code, _, err = run_in_process(
        capsys, *export_command(tiny_checkpoint, "pt2", "windowed", "fp32", directory), "--quiet"
    )
    assert code == 2
    assert (
        "already holds stateful fp32 artifacts (onnx) of another graph (differs in mode, inputs, outputs, window)"
        in one_line(err)
    )
    assert sorted(read_manifest(directory).artifacts) == ["onnx"]


def test_formats_of_one_graph_share_a_directory_and_auto_prefers_the_onnx_file(artifacts, tiny_checkpoint, tmp_path):
    directory = tmp_path / "stateful"
    shutil.copytree(artifacts[("onnx", "stateful", "fp32")], directory)
    result = codecstream(*export_command(tiny_checkpoint, "pt2", "stateful", "fp32", directory))
    assert result.returncode == 0, result.stderr
    assert "[5/5] checking the artifact through the client runtime" in result.stderr
    manifest = read_manifest(directory)
    assert sorted(manifest.artifacts) == ["onnx", "pt2"]
    check = manifest.artifacts["pt2"].export_check["snr_db"]
    assert check == "inf" or check > 90  # JSON has no infinity: identical output is written "inf"
    assert open_decoder(directory).backend == "openvino"  # the first .onnx runtime, installed here
    codes = random_codes(30)
    from codecstream.protocol.pcm import snr_db

    assert snr_db(open_decoder(directory).decode(codes), open_decoder(directory, backend="pt2").decode(codes)) > 90


def test_an_artifact_below_its_check_floor_is_refused_and_the_directory_keeps_what_it_held(
    artifacts, tiny_checkpoint, tmp_path, capsys
):
    # An fp32 .pte exported at 29 dB against the eager decoder (real size, Intel Xeon with AMX) was
    # written and listed like a good one; a floor refuses it. Forced here with a floor no artifact reaches.
    directory = tmp_path / "stateful"
    shutil.copytree(artifacts[("pt2", "stateful", "fp32")], directory)
    held = sorted(path.name for path in directory.iterdir())
    code, _, err = run_in_process(
        capsys, *export_command(tiny_checkpoint, "onnx", "stateful", "fp32", directory), "--quiet",
        "--min-check-db", "1000",
    )  # fmt: skip
    assert code == 2
    assert "the onnx artifact decodes at" in one_line(err)
    assert "below the 1000 dB floor for fp32 artifacts (--min-check-db): it was not written" in err
    assert sorted(path.name for path in directory.iterdir()) == held  # no .onnx, no partial, no staging folder
    assert sorted(read_manifest(directory).artifacts) == ["pt2"]
    assert open_decoder(directory).decode(random_codes(4)).size == 4 * 1920


def test_every_exported_manifest_records_what_the_client_needs(artifacts, tiny_checkpoint):
    from codecstream.protocol.digest import decoder_digest

    for (fmt, mode, dtype), directory in artifacts.items():
        manifest = read_manifest(directory)
        entry = manifest.artifacts[fmt]
        assert (manifest.mode, manifest.dtype) == (mode, dtype)
        assert manifest.codec["decoder_digest"] == decoder_digest(tiny_checkpoint)
        assert (manifest.min_chunk_frames, manifest.max_chunk_frames) == (1, 25)
        assert entry.sha256.startswith("sha256:") and entry.size_bytes == (directory / entry.file).stat().st_size
        assert "torch" in entry.versions
        assert (entry.quantization is not None) == (dtype == "int8")
        if mode == "stateful":
            assert [spec.name for spec in manifest.state][:2] == ["position", "pre_conv.history"]
            assert manifest.inputs[1:] == manifest.state
        else:
            assert (manifest.window.context_frames, manifest.window.min_context_frames) == (72, 10)


def test_parity_decoder_passes_and_writes_json_and_png(artifacts, tiny_checkpoint, tmp_path, capsys):
    out_json, out_png = tmp_path / "parity.json", tmp_path / "parity.png"
    code, out, _ = run_parity_decoder(
        capsys,
        artifacts[("onnx", "stateful", "fp32")],
        tiny_checkpoint,
        "--frames",
        "120",
        "--seed",
        "1",
        "--json",
        str(out_json),
        "--plot",
        str(out_png),
    )
    assert code == 0, out
    assert "result     PASS: SNR" in out
    report = json.loads(out_json.read_text())
    assert report["passed"] is True and report["snr_db"] > 90
    assert report["max_lsb_error"] <= 1 and report["max_abs_error"] < 1e-4
    assert [chunk["frames"] for chunk in report["chunks"]] == [1, 2, 4, 8, *[8] * 13, 1]
    assert all(chunk["snr_db"] == "inf" or chunk["snr_db"] > 90 for chunk in report["chunks"])
    assert report["codes"] == {"source": "random", "seed": 1, "frames": 120, "reference_frames": 0}
    assert report["decoder"]["backend"] == "openvino" and report["command"].startswith(  # auto, installed here
        "codecstream parity decoder --artifact"
    )
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_parity_decoder_primes_the_reference_codes_of_a_codes_file(artifacts, tiny_checkpoint, tmp_path, capsys):
    codes_file = tmp_path / "clone.npz"
    save_codes_file(codes_file, random_codes(40, seed=2), reference_codes=random_codes(30, seed=3))
    code, out, _ = run_parity_decoder(
        capsys,
        artifacts[("pte", "stateful", "fp32")],
        tiny_checkpoint,
        "--codes",
        str(codes_file),
        "--chunking",
        "4",
    )
    assert code == 0, out
    assert "40 frames (" in out and "PASS" in out


def test_parity_decoder_exits_1_below_the_threshold(artifacts, tiny_checkpoint, capsys):
    code, out, _ = run_parity_decoder(
        capsys,
        artifacts[("onnx", "stateful", "fp32")],
        tiny_checkpoint,
        "--frames",
        "30",
        "--threshold-db",
        "400",
    )
    assert code == 1
    assert "result     FAIL: SNR" in out


def test_parity_decoder_refuses_a_checkpoint_with_other_weights(artifacts, other_checkpoint, capsys):
    code, _, err = run_parity_decoder(
        capsys,
        artifacts[("onnx", "stateful", "fp32")],
        other_checkpoint,
        "--frames",
        "10",
    )
    assert code == 2
    assert "was exported from other decoder weights" in one_line(err)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--chunking", "2,0"], "chunk size 1 is 0 frames, expected 1..250"),
        (["--codes", "/nonexistent/codes.npy"], "no such codes file"),
    ],
)
def test_parity_decoder_reports_bad_input_in_one_line(args, message, artifacts, tiny_checkpoint, capsys):
    code, _, err = run_parity_decoder(
        capsys,
        artifacts[("onnx", "stateful", "fp32")],
        tiny_checkpoint,
        *args,
    )
    assert code == 2
    assert message in one_line(err)


def test_parity_is_a_group_other_distributions_extend(capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="codecstream")
    checks = register_parity(parser.add_subparsers(dest="command"))
    extra = checks.add_parser("loudness", help="a check added by the caller")
    extra.set_defaults(handler=lambda args: 0)
    args = parser.parse_args(["parity", "loudness"])
    assert args.handler(args) == 0
    assert {"decoder", "e2e"} <= set(checks.choices)  # e2e comes from the codecstream.parity entry points


def test_quantized_parity_is_reported_next_to_fp32(artifacts, tiny_checkpoint, tmp_path, capsys):
    reports = {}
    for key in [("onnx", "stateful", "fp32"), ("onnx", "stateful", "int8"), ("pt2", "stateful", "bf16")]:
        out_json = tmp_path / f"{'-'.join(key)}.json"
        run_parity_decoder(
            capsys,
            artifacts[key],
            tiny_checkpoint,
            "--frames",
            "100",
            "--threshold-db",
            "0",
            "--json",
            str(out_json),
        )
        reports[key] = json.loads(out_json.read_text())
    print(
        "\n"
        + "\n".join(
            f"{' '.join(key)}: SNR {r['snr_db']} dB, max {r['max_lsb_error']} LSB" for key, r in reports.items()
        )
    )
    assert reports[("onnx", "stateful", "fp32")]["snr_db"] > reports[("pt2", "stateful", "bf16")]["snr_db"]
    assert all(np.isfinite(r["max_abs_error"]) for r in reports.values())


def test_the_export_line_names_the_file_s_sha256_and_the_decoder_digest_apart(tmp_path):
    # Issue 53: the line showed the file's sha256 as a bare "sha256:…", and the decoder's
    # description the weights digest the same way: two different "sha256" for one artifact.
    data = b"an exported graph"
    (tmp_path / "decoder.onnx").write_bytes(data)
    (tmp_path / MANIFEST_FILE).write_text(manifest_json("onnx", "decoder.onnx", data))
    line = artifact_summary(tmp_path, read_manifest(tmp_path), "onnx")
    assert f"file {sha256(data)[:23]}…" in line
    assert f"decoder digest {DIGEST[:19]}…" in line


def test_parity_e2e_records_the_command_that_ran_with_every_request_flag_and_no_token(
    replay_server_factory, checkpoint, tmp_path, capsys
):
    # Issue 53: benchmarks/results/parity_e2e.json's command left out `--voice ryan --seed 7`, so
    # running it again made another stream.
    server = replay_server_factory(codes=random_codes(12), decoder_digest=decoder_digest(checkpoint))
    report = tmp_path / "e2e.json"
    command = [
        "parity", "e2e", "--server", server.target, "--text", "Parity check.", "--voice", "ryan", "--seed", "7",
        "--max-frames", "12", "--decoder", str(checkpoint), "--backend", "torch", "--checkpoint", str(checkpoint),
        "--token", "s3cret", "--json", str(report),
    ]  # fmt: skip
    code, out, err = run_in_process(capsys, *command)
    assert code == 0, out + err
    recorded = json.loads(report.read_text())["command"]
    assert recorded == shlex.join(["codecstream", *command]).replace("s3cret", "REDACTED")

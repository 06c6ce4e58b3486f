"""The benchmarks' cache of exported artifacts, and the .pte's paired speed ratio (issue 41)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from artifact_bench import ensure_exported
from pte_speed_ratio import summary


def test_an_export_for_other_settings_is_made_again(tmp_path):
    directory, exports = tmp_path / "artifact", []

    def export() -> None:
        exports.append(1)
        directory.mkdir()
        (directory / "manifest.json").write_text("{}")

    assert ensure_exported(directory, export, settings="max_chunk_frames=8") is not None
    assert ensure_exported(directory, export, settings="max_chunk_frames=8") is None
    # A run with larger chunks must not reuse the artifact exported for 8 frames.
    assert ensure_exported(directory, export, settings="max_chunk_frames=25") is not None
    assert len(exports) == 2


def test_the_ratio_pairs_calls_of_the_same_round():
    # Round 2 ran on a slower host for every runtime: paired, the C++ runtime's .pte is 1.1x the
    # fastest other runtime in every round, and 0.8x the Python runtime's.
    times = {
        "pte-cpp": [0.11, 0.22, 0.11],
        "pte-python": [0.1375, 0.275, 0.1375],
        "openvino": [0.10, 0.20, 0.10],
        "onnx": [0.15, 0.30, 0.15],
    }
    result = summary(times)
    assert result["fastest_other"] == "openvino"
    assert result["pte-cpp_over_fastest_paired_median"] == 1.1
    assert result["pte-python_over_fastest_paired_median"] == 1.375
    assert result["cpp_over_python_paired_median"] == 0.8
    assert result["median_ms"] == {"pte-cpp": 110.0, "pte-python": 137.5, "openvino": 100.0, "onnx": 150.0}
    assert result["rounds"] == 3

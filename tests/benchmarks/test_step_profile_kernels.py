"""gpu_step_profile's kernel table (where the GPU's own time goes): kernels grouped by name, per step,
ranked by time."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from gpu_step_profile import top_gpu_kernels


def test_kernels_are_grouped_by_name_and_ranked_by_time_per_step():
    events = [
        {"name": "gemm", "dur": 300.0},
        {"name": "gemm", "dur": 100.0},
        {"name": "Memcpy DtoH", "dur": 50.0},
        {"name": "rms_norm", "dur": 20.0},
        {"name": "k" * 200, "dur": 1.0},
    ]
    table = top_gpu_kernels(events, steps=2, keep=3)
    assert table == [
        {"name": "gemm", "per_step": 1.0, "ms_per_step": 0.2},
        {"name": "Memcpy DtoH", "per_step": 0.5, "ms_per_step": 0.025},
        {"name": "rms_norm", "per_step": 0.5, "ms_per_step": 0.01},
    ]
    assert len(top_gpu_kernels(events, steps=1)[-1]["name"]) == 160

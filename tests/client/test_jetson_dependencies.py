"""Jetson readiness: `codecstream-client[onnx]` resolves to binary wheels for linux/aarch64, Python 3.10.

JetPack 6 (Ubuntu 22.04, glibc 2.35, Python 3.10) is the target. pip is asked to pick wheels as if
it ran there (`--platform`, `--python-version`, `--only-binary=:all:`), which fails if any
dependency has no aarch64 wheel and would need a compiler on the device. The two local
distributions are built as wheels first (they are not on PyPI). Needs PyPI, nothing else.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
JETPACK6_GLIBC_MINOR = 35
PLATFORMS = [
    "manylinux2014_aarch64",
    *(f"manylinux_2_{minor}_aarch64" for minor in range(17, JETPACK6_GLIBC_MINOR + 1)),
]

pytestmark = pytest.mark.pypi


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True, text=True, timeout=900
    )


def test_client_with_onnx_runtime_resolves_to_aarch64_wheels_for_python_3_10(tmp_path):
    local = tmp_path / "local"
    built = pip(
        "wheel", "--no-deps", "--no-build-isolation", "-w", str(local), str(ROOT / "protocol"), str(ROOT / "client")
    )
    assert built.returncode == 0, built.stderr
    downloads = tmp_path / "downloads"
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    resolved = pip(
        "download",
        "--only-binary=:all:",
        *platforms,
        "--python-version",
        "3.10",
        "--implementation",
        "cp",
        "--find-links",
        str(local),
        "-d",
        str(downloads),
        f"codecstream-client[onnx]=={(ROOT / 'VERSION').read_text().strip()}",
    )
    assert resolved.returncode == 0, resolved.stdout[-2000:] + resolved.stderr[-3000:]
    wheels = sorted(path.name for path in downloads.glob("*.whl"))
    by_name = {name.split("-")[0].lower().replace("_", "-"): name for name in wheels}
    print("\n" + "\n".join(wheels))
    for package in ("onnxruntime", "numpy", "grpcio", "protobuf"):
        assert package in by_name, f"{package} missing from {wheels}"
    for package in ("onnxruntime", "numpy", "grpcio"):
        assert "aarch64" in by_name[package] and ("cp310" in by_name[package] or "abi3" in by_name[package]), by_name[
            package
        ]
    assert not {"torch", "executorch", "codecstream-decoder"} & set(by_name)

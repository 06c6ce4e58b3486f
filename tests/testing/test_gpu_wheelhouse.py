"""scripts/gpu-wheelhouse: this checkout's wheels, cut into parts, install offline into a target folder.

The CUDA stack's download (1.4 GB) is left out (--own-only): what is checked is the build of the
project's own wheels, the parts and the offline install from them. Needs PyPI for the wheels' build
backend (setuptools, in pip's isolated build), nothing else.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-wheelhouse"
VERSION = (ROOT / "VERSION").read_text().strip()
OWN = ("client", "decoder", "protocol", "server", "testing")
PART_LIMIT = 62 * 2**20

# One worker builds the module's wheelhouse under the suite's `-n 2 --dist loadgroup`.
pytestmark = [pytest.mark.pypi, pytest.mark.install, pytest.mark.xdist_group("gpu-wheelhouse")]


def run(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    return subprocess.run([*args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> pathlib.Path:
    house = tmp_path_factory.mktemp("gpu-wheelhouse") / "house"
    build_folders = {name: (ROOT / name / "build").exists() for name in OWN}
    built = run(str(SCRIPT), "build", "--own-only", "--parts", str(house))
    assert built.returncode == 0, built.stdout + built.stderr
    # Built from a copy: the checkout is left as it was (no build/ folder of setuptools in it).
    assert {name: (ROOT / name / "build").exists() for name in OWN} == build_folders
    return house


def test_the_wheelhouse_holds_this_checkouts_five_wheels_with_their_digests(wheelhouse):
    expected = [f"own/codecstream_{name}-{VERSION}-py3-none-any.whl" for name in OWN]
    assert sorted(str(path.relative_to(wheelhouse)) for path in wheelhouse.rglob("*.whl")) == expected
    manifest = [line.split("  ", 1) for line in (wheelhouse / "manifest.sha256").read_text().splitlines()]
    assert [name for _, name in manifest] == expected
    for digest, name in manifest:
        assert hashlib.sha256((wheelhouse / name).read_bytes()).hexdigest() == digest, name
    assert not (wheelhouse / "stack").exists() and not (wheelhouse / "lane").exists()


def test_the_parts_fit_the_size_limit_and_come_with_the_manifest_and_the_install_step(wheelhouse):
    parts = sorted((wheelhouse / "parts").glob("p[0-9][0-9]"))
    assert parts and [part.name for part in parts] == [f"p{index:02d}" for index in range(len(parts))]
    assert all(part.stat().st_size <= PART_LIMIT for part in parts)
    assert (wheelhouse / "parts" / "gpu-wheelhouse").read_bytes() == SCRIPT.read_bytes()
    assert (wheelhouse / "parts" / "manifest.sha256").read_bytes() == (wheelhouse / "manifest.sha256").read_bytes()


def test_install_from_the_parts_puts_the_server_into_the_target_folder_once(wheelhouse, tmp_path):
    target = tmp_path / "site"
    # From a folder that holds the parts and the script alone, as a host receives them.
    received = tmp_path / "received"
    shutil.copytree(wheelhouse / "parts", received)
    first = run("bash", str(received / "gpu-wheelhouse"), "install", str(received), "--target", str(target))
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"installed codecstream-server {VERSION} from {target}/codecstream/server" in first.stdout
    assert sorted(path.name for path in target.glob("*.dist-info")) == [
        f"codecstream_{name}-{VERSION}.dist-info" for name in OWN
    ]
    again = run("bash", str(received / "gpu-wheelhouse"), "install", str(received), "--target", str(target))
    assert again.returncode == 0 and f"{target} is up to date" in again.stdout


def test_install_refuses_parts_that_do_not_match_their_manifest(wheelhouse, tmp_path):
    received = tmp_path / "received"
    shutil.copytree(wheelhouse / "parts", received)
    data = bytearray((received / "p00").read_bytes())
    data[10_000] ^= 0xFF  # inside the first wheel (the tar holds the manifest, a few hundred bytes, then the wheels)
    (received / "p00").write_bytes(bytes(data))
    result = run("bash", str(received / "gpu-wheelhouse"), "install", str(received), "--target", str(tmp_path / "t"))
    assert result.returncode == 1
    assert "does not match its manifest" in result.stderr
    assert not (tmp_path / "t").exists()

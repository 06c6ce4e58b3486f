"""The .proto files are the spec: lint-clean, backward compatible, and the stubs are their output."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RELEASES = sorted((ROOT / "protocol" / "releases").glob("*.binpb"))
sys.path.insert(0, str(ROOT / "scripts"))
import generate_protos  # noqa: E402


def buf() -> str:
    found = shutil.which("buf", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("buf")
    assert found, "the buf CLI is missing: install the buf-bin package"
    return found


def run_buf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([buf(), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_contract_passes_buf_lint_standard():
    result = run_buf("lint")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("release", RELEASES, ids=lambda p: p.stem)
def test_contract_has_no_breaking_change_against_released_versions(release):
    result = run_buf("breaking", "--against", str(release))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_current_version_has_its_contract_recorded_to_check_later_versions_against():
    version = (ROOT / "VERSION").read_text().strip()
    assert ROOT / "protocol" / "releases" / f"v{version}.binpb" in RELEASES, (
        f"record the contract of {version}: buf build -o protocol/releases/v{version}.binpb"
    )


def test_committed_python_stubs_match_a_fresh_generation(tmp_path):
    fresh = generate_protos.generate(tmp_path)
    committed_dir = ROOT / "protocol" / "src" / "codecstream" / "v1"
    stale = [
        p.name
        for p in fresh
        if not (committed_dir / p.name).exists() or (committed_dir / p.name).read_bytes() != p.read_bytes()
    ]
    assert not stale, f"stale stubs {stale}: run `python scripts/generate_protos.py` and commit the result"

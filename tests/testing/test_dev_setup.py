"""scripts/setup-dev-env as the demo's console shows it: its steps, and an installer's errors, but not
the installer's package lists (316 lines of them reached the demo's console)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup-dev-env"

#: What uv writes to stderr for an install unless it is told --quiet (-q); its errors it always writes.
FAKE_UV = textwrap.dedent(
    """\
    #!/bin/sh
    quiet=no
    for word in "$@"; do
        case "$word" in -q|--quiet) quiet=yes ;; esac
    done
    case "$*" in *"$FAIL_ON"*)
        echo "error: No solution found when resolving dependencies" >&2
        exit 1 ;;
    esac
    if [ "$quiet" = no ]; then
        echo "Resolved 40 packages in 1.20s" >&2
        i=0
        while [ $i -lt 40 ]; do echo " + package-$i==1.0" >&2; i=$((i + 1)); done
    fi
    """
)
#: The venv's python as the script uses it: `-c` checks, `-m pip install`, the import check on stdin.
FAKE_PYTHON = '#!/bin/sh\n[ "$1" = - ] && cat >/dev/null\nexit 0\n'


def run_setup(tmp_path: pathlib.Path, fail_on: str = "no such word") -> subprocess.CompletedProcess:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for name, text in (("uv", FAKE_UV), ("python", FAKE_PYTHON)):
        (venv / "bin" / name).write_text(text)
        (venv / "bin" / name).chmod(0o755)
    env = {**os.environ, "VENV": str(venv), "FAIL_ON": fail_on}
    return subprocess.run([str(SETUP)], capture_output=True, text=True, env=env, timeout=60)


pytestmark = pytest.mark.skipif(
    not (shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK)), reason="setup-dev-env wants nginx first"
)


def test_setup_prints_its_steps_and_no_package_lists(tmp_path):
    result = run_setup(tmp_path)
    assert result.returncode == 0, result.stderr
    assert all(line.startswith("[setup-dev-env") for line in result.stdout.splitlines() if line.strip())
    assert result.stderr == ""


def test_an_installer_error_still_reaches_the_console_and_fails_the_setup(tmp_path):
    result = run_setup(tmp_path, fail_on="executorch==")
    assert result.returncode == 1
    assert "error: No solution found when resolving dependencies" in result.stderr

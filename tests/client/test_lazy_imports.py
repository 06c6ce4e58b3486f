"""A program that only decodes does not pay for the streaming client at start-up (decoder ready
time, docs/performance.md), and the package's public names still resolve."""

from __future__ import annotations

import subprocess
import sys

import codecstream.client
import pytest


def test_importing_the_runtimes_leaves_the_grpc_client_unimported():
    probe = "import sys, codecstream.client.runtimes; print('codecstream.client.client' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_choosing_the_runtime_beside_a_cpu_only_onnx_runtime_does_not_import_it():
    # Issue 54 defect 8: pipecat-ai requires onnxruntime, so beside OpenVINO every decoder's open
    # imported it (0.25 s of a cold first turn) to ask for a GPU the CPU-only wheel never has.
    pytest.importorskip("openvino")
    pytest.importorskip("onnxruntime")
    probe = (
        "import sys; from codecstream.client import runtimes; "
        "print(runtimes._preference()[0], 'onnxruntime' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["openvino", "False"]


def test_every_public_name_resolves_and_is_listed():
    for name in codecstream.client.__all__:
        assert getattr(codecstream.client, name).__name__ == name
    assert set(codecstream.client.__all__) <= set(dir(codecstream.client))
    assert codecstream.client.__version__ not in ("", None)
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        codecstream.client.NoSuchName  # noqa: B018

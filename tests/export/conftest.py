"""Artifacts of the tiny random checkpoint, exported through the real CLI once per set of inputs.

Lowering to ExecuTorch is slow Python graph work (~1 min of CPU per graph even for the tiny
preset, which has the full conv stack), so the exports run as parallel subprocesses, two at a
time: one per core on CI. Each export is kept in .cache/test-artifacts/ under a key of everything
that shapes it (the sources of the exporter, decoder, client and protocol, the versions of the
export toolchain, the checkpoint's digest, the export arguments): a later run with nothing changed
copies it instead of exporting again, while a fresh clone (CI) exports everything.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version

import pytest
import torch
from codecstream.testing.random_speech_tokenizer import write_speech_tokenizer

# These tests check numbers, not speed: one thread avoids oversubscribing CI's two cores (a torch
# op split over two threads waits for the busier core on every call).
torch.set_num_threads(1)

#: (format, mode, dtype) of every artifact the suite exports, slowest first.
EXPORTS = [
    ("pte", "stateful", "fp32"),
    ("pte", "windowed", "fp32"),
    ("onnx", "stateful", "fp32"),
    ("onnx", "windowed", "fp32"),
    ("onnx", "stateful", "int8"),
    ("pt2", "stateful", "fp32"),
    ("pt2", "windowed", "fp32"),
    ("pt2", "stateful", "bf16"),
    ("pt2", "stateful", "bf16-mixed"),
]
MAX_CHUNK_FRAMES = 25
PARALLEL_EXPORTS = 2
#: pytest-timeout's limit for a test that uses the exports: the first one exports them all in its
#: setup (a fresh clone: 10.5 min on an AVX2-only AMD EPYC Zen 3 beside the engine tests, over the
#: suite's 600 s; each export has its own 900 s limit besides).
EXPORTING_TEST_TIMEOUT_S = 2400
ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "test-artifacts"
#: What an export depends on besides the checkpoint and its arguments.
_SOURCES = ("export", "decoder", "client", "protocol")
_TOOLCHAIN = ("torch", "executorch", "torchao", "onnx", "onnxscript", "onnxruntime")


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if "artifacts" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(EXPORTING_TEST_TIMEOUT_S))


def codecstream(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the `codecstream` command line in a fresh interpreter."""
    # Two exports run at once on two cores: more threads per process would only oversubscribe them.
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "codecstream.client.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def export_command(checkpoint: pathlib.Path, fmt: str, mode: str, dtype: str, out: pathlib.Path) -> list[str]:
    return [
        "export-decoder",
        str(checkpoint),
        "--format",
        fmt,
        "--mode",
        mode,
        "--dtype",
        dtype,
        "--max-chunk-frames",
        str(MAX_CHUNK_FRAMES),
        "--out",
        str(out),
    ]


@pytest.fixture(scope="session")
def built_openvino_operations(tmp_path_factory) -> pathlib.Path | None:
    """codecstream's OpenVINO operations, built once for the session (None where they cannot be)."""
    folder = tmp_path_factory.mktemp("openvino-operations")
    subprocess.run(
        [sys.executable, "-m", "codecstream.client.runtimes.openvino_extension"],
        env={**os.environ, "CODECSTREAM_CACHE_DIR": str(folder)}, capture_output=True, timeout=600,
    )  # fmt: skip
    built = folder / "openvino-ops"
    return built if built.is_dir() else None


@pytest.fixture
def cache(cache, built_openvino_operations) -> pathlib.Path:
    """The test's own client cache, holding the OpenVINO operations as an install that built them
    ahead has them: a decoder opened without them runs unfused while they build in the background,
    and these tests check the fused decoder and its kept program."""
    if built_openvino_operations is not None:
        shutil.copytree(built_openvino_operations, cache / "openvino-ops")
    return cache


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> pathlib.Path:
    return write_speech_tokenizer(tmp_path_factory.mktemp("checkpoint") / "tiny", preset="tiny", seed=0)


@pytest.fixture(scope="session")
def other_checkpoint(tmp_path_factory) -> pathlib.Path:
    """Same architecture, other weights (another decoder digest)."""
    return write_speech_tokenizer(tmp_path_factory.mktemp("checkpoint") / "tiny-seed1", preset="tiny", seed=1)


def inputs_key(checkpoint: pathlib.Path) -> str:
    """A digest of everything an export of `checkpoint` depends on but its arguments."""
    from codecstream.protocol.digest import decoder_digest

    digest = hashlib.sha256(decoder_digest(checkpoint).encode())
    for package in _SOURCES:
        for path in sorted((ROOT / package / "src").rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    for name in _TOOLCHAIN:
        try:
            digest.update(f"{name}=={version(name)}".encode())
        except PackageNotFoundError:
            digest.update(f"{name} missing".encode())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def artifacts(tiny_checkpoint, tmp_path_factory) -> dict[tuple[str, str, str], pathlib.Path]:
    """(format, mode, dtype) -> artifact directory, each holding one format (a copy the tests may
    change: the cache stays as exported)."""
    cached = {key: CACHE / inputs_key(tiny_checkpoint) / "-".join(key) for key in EXPORTS}

    def export(key):
        CACHE.mkdir(parents=True, exist_ok=True)
        staging = pathlib.Path(tempfile.mkdtemp(dir=CACHE, prefix="exporting-"))
        result = codecstream(*export_command(tiny_checkpoint, *key, staging / "out"))
        if result.returncode == 0:
            cached[key].parent.mkdir(parents=True, exist_ok=True)
            try:
                (staging / "out").rename(cached[key])  # atomic: a cache entry is whole or absent
            except OSError:  # another run stored the same export first
                if not (cached[key] / "manifest.json").is_file():
                    raise
        shutil.rmtree(staging, ignore_errors=True)
        return key, result

    missing = [key for key in EXPORTS if not (cached[key] / "manifest.json").is_file()]
    with concurrent.futures.ThreadPoolExecutor(PARALLEL_EXPORTS) as pool:
        results = dict(pool.map(export, missing))
    failed = {key: result for key, result in results.items() if result.returncode != 0}
    if failed:
        report = "\n\n".join(f"{key}: exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}" for key, r in failed.items())
        pytest.fail(f"export-decoder failed:\n{report}")
    root = tmp_path_factory.mktemp("artifacts")
    return {key: shutil.copytree(path, root / path.name) for key, path in cached.items()}

"""codecstream's ExecuTorch runtime (the C++ library a phone app links, reached here through ctypes):
it builds against the installed executorch wheel, decodes a .pte without torch, and refuses any file
that is not a sound program without taking the process down.

The library is built by the first test that needs it (a few seconds); where it cannot be built (no
C++ compiler or cmake) these tests skip with the reason, and a .pte runs on ExecuTorch's Python
runtime instead.
"""

from __future__ import annotations

import json
import pathlib
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
from codecstream.client.runtimes import DecoderLoadError, open_decoder
from codecstream.client.runtimes.pte_library import PteRuntimeUnavailable, pte_runtime
from codecstream.client.runtimes.pte_native import PteRuntimeError
from codecstream.client.runtimes.pte_trial import Trial
from codecstream.protocol.manifest import MANIFEST_FILE, file_sha256

from tests.conftest import random_codes

STATEFUL = ("pte", "stateful", "fp32")


@pytest.fixture(scope="module")
def runtime():
    try:
        return pte_runtime()
    except PteRuntimeUnavailable as reason:
        pytest.skip(f"codecstream's ExecuTorch runtime cannot be built here: {reason}")


def served_as(directory: pathlib.Path, content: bytes, target: pathlib.Path) -> pathlib.Path:
    """A copy of an artifact directory whose .pte holds `content` and whose manifest lists its
    digest: what a server that sends a bad program sends (the digest check passes)."""
    shutil.copytree(directory, target)
    (target / "decoder.pte").write_bytes(content)
    manifest = json.loads((target / MANIFEST_FILE).read_text())
    entry = manifest["artifacts"]["pte"]
    entry["sha256"], entry["size_bytes"] = file_sha256(target / "decoder.pte"), len(content)
    (target / MANIFEST_FILE).write_text(json.dumps(manifest))
    return target


def run_python(script: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout)


def test_a_pte_decodes_on_the_cpp_runtime_in_a_process_that_never_imports_torch(runtime, artifacts):
    script = (
        "import sys, numpy as np\n"
        "sys.modules['torch'] = None\n"
        "from codecstream.client.runtimes import open_decoder\n"
        "decoder = open_decoder(sys.argv[1], backend='pte', threads=2)\n"
        f"pcm = decoder.decode(np.array({random_codes(5).tolist()}))\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'torch' and sys.modules[m] is not None]\n"
        "print(decoder.description)\n"
        "print(pcm.shape, pcm.dtype)\n"
    )
    result = run_python(script, str(artifacts[STATEFUL]))
    assert result.returncode == 0, result.stderr[-2000:]
    description, shape = result.stdout.strip().splitlines()
    assert "C++ runtime" in description
    assert shape == "(9600,) float32"


def test_the_cpp_and_python_runtimes_decode_the_same_samples(runtime, artifacts, monkeypatch):
    codes = random_codes(30)
    decoded = {}
    for choice in ("native", "python"):
        monkeypatch.setenv("CODECSTREAM_PTE_RUNTIME", choice)
        decoder = open_decoder(artifacts[STATEFUL], backend="pte", threads=1)
        decoded[choice] = np.concatenate([decoder.decode(codes[i : i + 7]) for i in range(0, 30, 7)])
    np.testing.assert_allclose(decoded["native"], decoded["python"], atol=1e-5)


def test_a_chunk_the_program_does_not_take_is_an_error_and_the_program_stays_usable(runtime, artifacts):
    decoder = open_decoder(artifacts[STATEFUL], backend="pte", threads=1)
    program = decoder._program
    state = [program.zeros(spec) for spec in decoder._state_specs]
    with pytest.raises(PteRuntimeError, match=r"input 0 dimension 1 is 26, the method takes 1 to 25"):
        program.run([program.tensor(np.zeros((1, 26, 16))), *state])
    with pytest.raises(PteRuntimeError, match=r"takes \d+ inputs, 1 given"):
        program.run([program.tensor(np.zeros((1, 2, 16)))])
    with pytest.raises(PteRuntimeError, match=r"input \d+ has dtype 4, the method takes 6"):
        program.run([program.tensor(np.zeros((1, 2, 16))), *[np.zeros(s.shape, np.int64) for s in state]])
    assert decoder.decode(random_codes(3)).shape == (3 * 1920,)


def test_the_runner_reports_load_first_chunk_steady_calls_and_peak_memory(runtime, artifacts):
    command = [str(runtime.runner), str(artifacts[STATEFUL] / "decoder.pte"), "--threads", "1"]
    result = subprocess.run([*command, "--chunks", "1,3", "--calls", "2", "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["executorch"].startswith(runtime.executorch_version)
    assert set(record["chunks"]) == {"1", "3"}
    assert record["load_ms"] > 0 and record["first_chunk_2_frames_ms"] > 0 and record["peak_rss_mb"] > 0
    refused = subprocess.run([*command, "--chunks", "26"], capture_output=True, text=True)
    assert refused.returncode == 1
    assert "dimension 1 is 26, the method takes 1 to 25" in refused.stderr


def bad_programs(program: bytes) -> dict[str, bytes]:
    """Files a server could send instead of a program: not one at all, cut short, or with bits
    flipped (most in the flatbuffer that describes the program, where they change its meaning)."""
    rng = random.Random(52)
    flatbuffer_end = int.from_bytes(program[16:24], "little") if program[8:12] == b"eh00" else 4096
    cases = {
        "empty": b"",
        "random bytes": rng.randbytes(5000),
        # ExecuTorch's Python runtime aborts the process on this one (its logger decodes the bytes).
        "identifier not utf-8": program[:4] + b"\xff\xfe\x00\x80" + program[8:],
        "another format version": program[:4] + b"ET99" + program[8:],
    }
    for fraction in (0.001, 0.01, 0.3, 0.9, 0.9999):
        cases[f"truncated to {fraction:.2%}"] = program[: int(len(program) * fraction)]
    for index in range(40):
        flipped = bytearray(program)
        end = flatbuffer_end if index % 4 else len(program)
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(8, end)] ^= 1 << rng.randrange(8)
        cases[f"bit flips {index}"] = bytes(flipped)
    return cases


def test_no_file_a_server_sends_crashes_the_process_it_is_refused_or_decodes(runtime, artifacts, tmp_path):
    """Each case opens (and, if it opens, decodes) in one child process; a crash there fails the
    test naming the case, instead of killing pytest."""
    cases = bad_programs((artifacts[STATEFUL] / "decoder.pte").read_bytes())
    directories = [served_as(artifacts[STATEFUL], data, tmp_path / f"case{i}") for i, data in enumerate(cases.values())]
    script = (
        "import sys, numpy as np\n"
        "from codecstream.client.runtimes import DecoderLoadError, open_decoder\n"
        "for directory in sys.argv[1:]:\n"
        "    print('CASE', directory, flush=True)\n"
        "    try:\n"
        "        decoder = open_decoder(directory, backend='pte', threads=1)\n"
        "        decoder.decode(np.ones((9, 16), np.int64))\n"
        "        print('DECODED', flush=True)\n"
        "    except DecoderLoadError as error:\n"
        "        print('REFUSED', error, flush=True)\n"
    )
    result = run_python(script, *map(str, directories), timeout=1200)
    names = dict(zip(map(str, directories), cases, strict=True))
    last = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("CASE")][-1:]
    assert result.returncode == 0, f"crashed on {names.get(last[0]) if last else None}: {result.stderr[-2000:]}"
    outcomes = [line.split()[0] for line in result.stdout.splitlines() if line.split()[0] in ("DECODED", "REFUSED")]
    assert len(outcomes) == len(cases)
    refusals = {line for line in result.stdout.splitlines() if line.startswith("REFUSED")}
    assert any("is not an ExecuTorch program: no ExecuTorch header at bytes 4-8" in line for line in refusals)
    assert any("not a valid ExecuTorch program" in line for line in refusals)


def test_a_program_that_crashes_its_trial_run_is_refused_naming_the_signal(tmp_path):
    crash = subprocess.Popen(
        [sys.executable, "-c", "import os; os.abort()"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    trial = Trial(crash, tmp_path / "decoder.pte", tmp_path / "mark")
    with pytest.raises(DecoderLoadError, match=r"decoder.pte: the program crashed the ExecuTorch runtime \(SIGABRT\)"):
        trial.wait()
    assert not (tmp_path / "mark").exists()


def test_a_program_runs_its_trial_once_and_again_once_its_file_changes(runtime, artifacts, tmp_path, monkeypatch):
    monkeypatch.setenv("CODECSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    started = []
    import codecstream.client.runtimes.pte_trial as pte_trial

    real_popen = pte_trial.subprocess.Popen

    def counting_popen(command, *args, **kwargs):
        if "codecstream.client.runtimes.pte_trial_child" in command:
            started.append(command)
        return real_popen(command, *args, **kwargs)

    monkeypatch.setattr(pte_trial.subprocess, "Popen", counting_popen)
    directory = shutil.copytree(artifacts[STATEFUL], tmp_path / "artifact")
    open_decoder(directory, backend="pte", threads=1)
    open_decoder(directory, backend="pte", threads=1)
    assert len(started) == 1
    program = directory / "decoder.pte"
    program.write_bytes(program.read_bytes())  # the same bytes, another file: tried again
    open_decoder(directory, backend="pte", threads=1)
    assert len(started) == 2


def test_without_a_compiler_the_runtime_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    from codecstream.client.runtimes import pte_library

    monkeypatch.setattr(pte_library.sys, "executable", str(tmp_path / "python"))
    with pytest.raises(
        PteRuntimeUnavailable, match=r"cmake is not installed \(pip install cmake|no C\+\+ compiler found"
    ):
        pte_library._build(tmp_path / "cache", pte_library.executorch_package(), "test")


@pytest.mark.install
@pytest.mark.pypi
def test_the_executorch_extra_installs_without_torch_and_decodes_a_pte(runtime, artifacts, tmp_path):
    """docs/client.md's install line, in a fresh virtual environment: no torch, a .pte decodes."""
    root = pathlib.Path(__file__).resolve().parents[2]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = [python, "-m", "pip", "install", "-q", str(root / "protocol"), f"{root / 'client'}[executorch]"]
    result = subprocess.run(install, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    script = (
        "import importlib.util, sys, numpy as np\n"
        "from codecstream.client.runtimes import open_decoder\n"
        "decoder = open_decoder(sys.argv[1], backend='pte', threads=1)\n"
        "print(decoder.decode(np.ones((4, 16), np.int64)).shape, importlib.util.find_spec('torch') is None)\n"
    )
    done = subprocess.run([python, "-c", script, str(artifacts[STATEFUL])], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "(7680,) True"


def test_a_runtime_that_cannot_be_built_is_not_tried_again_in_the_process(tmp_path, monkeypatch):
    from codecstream.client.runtimes import pte_library

    attempts = []

    def failing_build(*args):
        attempts.append(args)
        raise PteRuntimeUnavailable("no C++ compiler found (set CXX, or install g++ or clang++)")

    monkeypatch.setenv("CODECSTREAM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pte_library, "_build", failing_build)
    for _ in range(2):
        with pytest.raises(PteRuntimeUnavailable, match="no C\\+\\+ compiler found"):
            pte_library.pte_runtime()
    assert len(attempts) == 1

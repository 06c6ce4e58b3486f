"""codecstream's rewrites of the decoder for OpenVINO: the fused SnakeBeta, built on the client,
put in the graph, exact enough; parallel matrix products merged, bit for bit.

The operation is checked on a graph written here with OpenVINO's own operators in the shape the
exporter gives SnakeBeta; tests/export checks it inside the exported decoders.
"""

from __future__ import annotations

import logging
import pathlib
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

openvino = pytest.importorskip("openvino")
from codecstream.client.runtimes import openvino_extension, openvino_program  # noqa: E402
from codecstream.client.runtimes.openvino_extension import extension_library  # noqa: E402
from codecstream.client.runtimes.openvino_fusion import (  # noqa: E402
    fuse_snake_beta,
    fused_count,
    merge_parallel_matmuls,
)
from codecstream.testing.waiting import wait_for  # noqa: E402
from openvino import opset13 as ops  # noqa: E402

from tests.conftest import random_codes  # noqa: E402

CHANNELS = 4


def snake_beta_model(alpha: np.ndarray, inv_beta: np.ndarray, *, alpha_shape=(CHANNELS, 1)):
    """SnakeBeta as the ONNX export writes it: Add(x, Multiply(inv_beta, Multiply(s, s))), s = Sin(x * alpha)."""
    x = ops.parameter([1, CHANNELS, -1], np.float32, name="x")
    sine = ops.sin(ops.multiply(x, ops.constant(alpha.reshape(alpha_shape).astype(np.float32))))
    scaled = ops.multiply(ops.constant(inv_beta.reshape(CHANNELS, 1).astype(np.float32)), ops.multiply(sine, sine))
    return openvino.Model([ops.add(x, scaled)], [x], "snake_beta")


def run(model, x: np.ndarray) -> np.ndarray:
    compiled = openvino.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled(x[None])[0][0]


def fused(model):
    library = extension_library(openvino)
    core = openvino.Core()
    core.add_extension(str(library))
    count = fuse_snake_beta(model, library)
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled, count


def test_the_fused_snake_beta_is_within_a_few_float32_steps_of_the_exact_value_over_the_whole_range(cache):
    alpha = np.array([1.0, 0.37, 2.9, 11.0])
    inv_beta = np.array([1.0, 0.5, 3.0, -0.25])
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.normal(0, 1, 4000),
            rng.normal(0, 30, 4000),
            np.arange(-40, 41) * np.pi / 2,  # the reduction's quadrant boundaries
            [0.0, -0.0, 1e-40, -1e-38, 1e3, 7e3, 9e3, -2e4, 1e6, 3.4e38],  # tiny, near and past the range
        ]
    ).astype(np.float32)
    x = np.tile(x, (CHANNELS, 1))
    compiled, count = fused(snake_beta_model(alpha, inv_beta))
    y = compiled(x[None])[0][0]
    assert count == 1 and fused_count(compiled) == 1

    # The graph multiplies alpha * x in float32 (overflowing to infinity, whose sine is NaN); the
    # sine and the rest are exact here.
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = (x * alpha[:, None].astype(np.float32)).astype(np.float64)
        inv = inv_beta[:, None].astype(np.float32).astype(np.float64)
        exact = x + inv * np.sin(scaled) ** 2
    np.testing.assert_array_equal(np.isnan(y), np.isnan(exact))
    allowed = 4 * np.finfo(np.float32).eps * (np.abs(x) + np.abs(inv))
    finite = ~np.isnan(exact)
    assert np.all(np.abs(y - exact)[finite] <= allowed[finite]), np.max(np.abs(y - exact)[finite] / allowed[finite])


def test_the_fused_snake_beta_keeps_infinities_and_nans_as_the_formula_does(cache):
    x = np.tile(np.array([np.inf, -np.inf, np.nan, 1.0], dtype=np.float32), (CHANNELS, 1))
    compiled, _ = fused(snake_beta_model(np.ones(CHANNELS), np.ones(CHANNELS)))
    y = compiled(x[None])[0][0]
    with np.errstate(invalid="ignore"):
        expected = run(snake_beta_model(np.ones(CHANNELS), np.ones(CHANNELS)), x)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
    np.testing.assert_allclose(y[:, 3], expected[:, 3], rtol=1e-6)


def test_a_sine_that_is_not_a_per_channel_snake_beta_is_left_as_it_is(cache):
    # alpha of shape (C,) broadcasts along time, not over channels: not SnakeBeta's shape.
    model = snake_beta_model(np.linspace(0.5, 2, CHANNELS), np.ones(CHANNELS), alpha_shape=(CHANNELS,))
    assert fuse_snake_beta(model, extension_library(openvino)) == 0


def test_the_operations_library_is_built_once_and_reused(cache, caplog):
    caplog.set_level(logging.INFO)
    library = extension_library(openvino)
    openvino_extension._built.cache_clear()  # a new process: the cache on disk, not in memory
    assert extension_library(openvino) == library and library.is_file()
    assert caplog.text.count("built codecstream's OpenVINO operations") == 1


@pytest.mark.parametrize(
    "compiler, reason",
    [("/nonexistent/c++", "no C++ compiler found"), ("false", "could not build snake_beta.cpp")],
)
def test_without_a_working_compiler_the_standard_graph_runs_and_the_log_says_why(
    compiler, reason, cache, monkeypatch, tmp_path, caplog
):
    empty = tmp_path / "bin"
    empty.mkdir()
    (empty / "false").symlink_to("/bin/false")
    monkeypatch.setenv("PATH", str(empty))  # neither c++, g++ nor clang++
    monkeypatch.setenv("CXX", compiler)
    assert extension_library(openvino) is None
    assert reason in caplog.text and "without codecstream's fused operations" in caplog.text


def slow_compiler(folder: pathlib.Path, seconds: float) -> str:
    """The system's C++ compiler, starting `seconds` late (a slow machine, a busy one)."""
    script = folder / "slow-c++"
    script.write_text(f'#!/bin/sh\nsleep {seconds}\nexec {shutil.which("c++") or shutil.which("g++")} "$@"\n')
    script.chmod(0o755)
    return str(script)


def library_path(cache: pathlib.Path) -> pathlib.Path:
    return openvino_extension._target(cache, pathlib.Path(openvino.__file__).parent, openvino.__version__)


def test_a_decoder_s_load_does_not_wait_for_the_operations_they_are_built_beside_it_for_the_next(
    cache, monkeypatch, tmp_path
):
    # Issue 54 defect 8: building them took 2.3-3.2 s of a cold first turn.
    monkeypatch.setenv("CXX", slow_compiler(tmp_path, 2))
    _, library = openvino_program._core(openvino)  # what a decoder's load asks for
    target = library_path(cache)
    assert library is None and not target.is_file()  # the graph runs as exported; the build goes on
    wait_for(target.is_file, 120, "the operations built in a process of their own")
    assert openvino_program._core(openvino)[1] == target  # the next decoder runs them


def test_a_build_that_failed_is_said_once_with_its_reason_and_not_started_again_by_later_loads(
    cache, monkeypatch, tmp_path, caplog
):
    failing = tmp_path / "failing-c++"
    failing.write_text("#!/bin/sh\necho 'error: no room' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CXX", str(failing))
    assert openvino_program._core(openvino)[1] is None
    marker = library_path(cache).with_name(library_path(cache).name + ".failed")
    wait_for(marker.is_file, 120, "the failed build's marker")
    assert "could not build snake_beta.cpp: error: no room" in marker.read_text()

    openvino_extension._started.clear()  # a new process, as far as the build is concerned
    monkeypatch.setattr(subprocess, "Popen", None)  # starting a build now would fail the test
    assert openvino_program._core(openvino)[1] is None
    assert "error: no room" in caplog.text and "without codecstream's fused operations" in caplog.text


def test_the_operations_can_be_built_ahead_by_an_install_script(cache):
    done = subprocess.run(
        [sys.executable, "-m", "codecstream.client.runtimes.openvino_extension"], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == str(library_path(cache))
    assert openvino_program._core(openvino)[1] == library_path(cache)


def test_the_operations_can_be_turned_off(cache, monkeypatch):
    monkeypatch.setenv("CODECSTREAM_OPENVINO_OPS", "0")
    assert extension_library(openvino) is None
    assert not (cache / "openvino-ops").exists()


def test_products_of_one_input_by_constant_weights_become_one_with_the_same_outputs():
    rng = np.random.default_rng(1)
    x = ops.parameter([1, -1, 8], np.float32, name="x")
    weights = [rng.normal(size=(8, width)).astype(np.float32) for width in (16, 4, 16)]
    outputs = [ops.matmul(x, ops.constant(w), False, False) for w in weights]
    other = ops.matmul(ops.relu(x), ops.constant(weights[0]), False, False)  # another input: left alone
    model = openvino.Model([*outputs, other], [x], "projections")
    data = rng.normal(size=(5, 8)).astype(np.float32)
    expected = openvino.Core().compile_model(model.clone(), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(data[None])

    assert merge_parallel_matmuls(model) == 3
    assert sum(node.get_type_name() == "MatMul" for node in model.get_ordered_ops()) == 2
    merged = openvino.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(data[None])
    for index in range(4):
        np.testing.assert_array_equal(merged[index], expected[index])


#: A client process: a stream open on a server, the OpenVINO runtime loaded as the client loads it,
#: then a second of streaming. Prints the forks it made and whether OpenVINO's telemetry was loaded.
CLIENT_LOADING_OPENVINO = textwrap.dedent(
    """
    import asyncio, os, sys
    forks = []
    os.register_at_fork(before=lambda: forks.append(1))
    from codecstream.client import AsyncClient
    from codecstream.client.runtimes.openvino_import import import_openvino

    async def main():
        async with AsyncClient(sys.argv[1]) as client:
            stream = client.stream_codes("Hello there.", voice="ryan")
            await stream.open()
            import_openvino()
            async for _ in stream:
                await asyncio.sleep(0.05)  # 20 frames at 100 frames/s, a second in all
        print(len(forks), "openvino_telemetry" in sys.modules)

    asyncio.run(main())
    """
)


def test_a_client_loading_openvino_forks_nothing_and_prints_nothing_on_stderr(replay_server_factory):
    # Issue 54 defect 7: every client process printed gRPC's "fork_posix.cc ... skipping fork() handlers":
    # `import openvino` loads its model conversion API, whose import sends a usage event to Google
    # Analytics from a forked process while gRPC's threads run. The client converts no model.
    server = replay_server_factory(codes=random_codes(20), fps=100.0)
    done = subprocess.run(
        [sys.executable, "-c", CLIENT_LOADING_OPENVINO, server.target], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "False"]
    assert done.stderr == ""

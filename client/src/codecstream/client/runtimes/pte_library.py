"""codecstream's ExecuTorch runtime (pte_runtime/*.cpp), built once on the client against the
installed executorch wheel.

The executorch wheel carries ExecuTorch's C++ runtime (libexecutorch, the XNNPACK delegate, the
CPU kernels), its headers and a CMake package, none of which needs torch; only its Python
extension does. `pte_runtime/` is a small CMake project over that package: the library the client
calls through ctypes (`pte_native.py`) and the command-line runner. A C++ library must be built
against the ExecuTorch it is loaded beside (its C++ interface changes between releases), so it is
built on the client the first time a `.pte` is opened (a few seconds; cmake and a C++ compiler),
like torch's C++ extensions and codecstream's OpenVINO operations, and kept in the client's cache
under a key of its sources, the ExecuTorch version and location, and the compiler.
`python -m codecstream.client.runtimes.pte_library` builds it ahead (a container image, a kiosk)
and prints where it is.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from codecstream.client.cache import cache_root

log = logging.getLogger(__name__)

#: The CMake project, shipped as package data beside this module.
SOURCE = pathlib.Path(__file__).parent / "pte_runtime"
SOURCES = ("CMakeLists.txt", "codecstream_pte.h", "codecstream_pte.cpp", "pte_runner.cpp")
_LIBRARY = {"darwin": "libcodecstream_pte.dylib", "win32": "codecstream_pte.dll"}.get(
    sys.platform, "libcodecstream_pte.so"
)
_RUNNER = "codecstream-pte-runner"
BUILD_TIMEOUT_S = 600


class PteRuntimeUnavailable(Exception):
    """Why codecstream's ExecuTorch runtime cannot be built or loaded here (one line)."""


@dataclasses.dataclass(frozen=True)
class PteRuntimeBuild:
    library: pathlib.Path
    runner: pathlib.Path
    executorch_version: str


def pte_runtime() -> PteRuntimeBuild:
    """The runtime for the installed executorch, built into the cache if it is not there yet;
    PteRuntimeUnavailable says why it cannot be."""
    package = executorch_package()
    built = _built(cache_root(), package, importlib.metadata.version("executorch"))
    if isinstance(built, PteRuntimeUnavailable):
        raise PteRuntimeUnavailable(str(built))
    return built


def executorch_package() -> pathlib.Path:
    """The installed executorch package's directory (found without importing it)."""
    try:
        spec = importlib.util.find_spec("executorch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise PteRuntimeUnavailable("executorch is not installed: pip install 'codecstream-client[executorch]'")
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def _built(cache: pathlib.Path, package: pathlib.Path, version: str) -> PteRuntimeBuild | PteRuntimeUnavailable:
    """Once per process and cache: a failed build gives the same reason again without retrying."""
    try:
        return _build(cache, package, version)
    except PteRuntimeUnavailable as reason:
        return reason


def _build(cache: pathlib.Path, package: pathlib.Path, executorch_version: str) -> PteRuntimeBuild:
    config = package / "share" / "cmake" / "executorch-config.cmake"
    if not config.is_file() or not any((package / "lib").glob("libexecutorch.*")):
        raise PteRuntimeUnavailable(
            f"executorch {executorch_version} at {package} ships no C++ runtime to build against "
            "(the executorch wheels from 1.5 on do: pip install 'codecstream-client[executorch]')"
        )
    cmake, compiler = _tool("cmake"), _compiler()
    key = hashlib.sha256()
    for name in SOURCES:
        key.update(name.encode() + b"\0" + (SOURCE / name).read_bytes())
    for part in (executorch_version, str(package), platform.machine(), compiler):
        key.update(part.encode() + b"\0")
    target = cache / "pte-runtime" / key.hexdigest()[:16]
    build = PteRuntimeBuild(target / _LIBRARY, target / _RUNNER, executorch_version)
    if build.library.is_file() and build.runner.is_file():
        return build
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PteRuntimeUnavailable(f"cannot write {target.parent}: {error}") from None
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        staged = pathlib.Path(scratch) / "out"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = [cmake, "-S", str(SOURCE), "-B", str(pathlib.Path(scratch) / "build"), *generator]
        configure += [f"-Dexecutorch_DIR={config.parent}", f"-DCMAKE_CXX_COMPILER={compiler}"]
        configure += ["-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={staged}"]
        configure += [f"-DCMAKE_RUNTIME_OUTPUT_DIRECTORY={staged}"]
        _run(configure, "configure")
        _run([cmake, "--build", str(pathlib.Path(scratch) / "build"), "--parallel", "2"], "build")
        # The finished folder is renamed into place whole: another process that builds the same
        # runtime at the same time never loads a half-written library.
        try:
            os.replace(staged, target)
        except OSError:
            if not (build.library.is_file() and build.runner.is_file()):
                raise PteRuntimeUnavailable(f"cannot write {target}") from None
    log.info("built codecstream's ExecuTorch runtime in %.1f s: %s", time.perf_counter() - began, target)
    return build


def _run(command: list[str], step: str) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PteRuntimeUnavailable(f"cmake could not {step} the ExecuTorch runtime: {error}") from None
    if result.returncode != 0:
        output = result.stdout + result.stderr
        first_error = next((line for line in output.splitlines() if "error" in line.lower()), output[-300:])
        raise PteRuntimeUnavailable(f"cmake could not {step} the ExecuTorch runtime: {first_error.strip()}")


def _tool(name: str) -> str:
    # pip's cmake package puts its script beside the interpreter, which need not be on PATH.
    for candidate in (shutil.which(name), pathlib.Path(sys.executable).parent / name):
        if candidate and pathlib.Path(candidate).is_file():
            return str(candidate)
    raise PteRuntimeUnavailable(f"{name} is not installed (pip install {name}, or your system's package)")


def _compiler() -> str:
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and (path := shutil.which(candidate)):
            return path
    raise PteRuntimeUnavailable("no C++ compiler found (set CXX, or install g++ or clang++)")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        build = pte_runtime()
    except PteRuntimeUnavailable as reason:
        print(f"codecstream's ExecuTorch runtime cannot be built here: {reason}", file=sys.stderr)
        return 1
    print(f"library: {build.library}\nrunner:  {build.runner}\nExecuTorch {build.executorch_version}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""codecstream's own OpenVINO operations (openvino_ops/*.cpp), compiled once on the client.

OpenVINO takes operations from a shared library (`Core.add_extension`). The library must be built
against the OpenVINO it is loaded into, whose wheel carries the headers and libraries for that,
so it is built on the client (seconds, with the C++ compiler of $CXX, else c++, g++ or
clang++) and kept in the client's cache under a key of its source, the OpenVINO version and the
compiler, like torch's C++ extensions. Where it cannot be built (no compiler, no headers) the
decoder runs the exported graph as it is, a little slower, and says so once in the log.
CODECSTREAM_OPENVINO_OPS=0 turns the operations off.

A decoder's load never waits for the compiler: where the library is not built yet, the decoder runs
the graph as exported and the library is built beside it, in a process of its own at the lowest
priority (it finishes even if this one exits first), for every decoder opened after it. A failed
build leaves its reason beside the library's name, so it is said once, not tried by every process.
An install script or an image build can build it ahead:

    python -m codecstream.client.runtimes.openvino_extension
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from codecstream.client.cache import cache_root

log = logging.getLogger(__name__)

#: The operations' source, shipped as package data beside this module.
SOURCE = pathlib.Path(__file__).parent / "openvino_ops" / "snake_beta.cpp"
_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden")
_LIBRARY_SUFFIX = {"darwin": ".dylib", "win32": ".dll"}.get(sys.platform, ".so")
BUILD_TIMEOUT_S = 300
_PINNED: list = []
#: What a failed build leaves beside the library's name: its reason, one line.
_FAILED_SUFFIX = ".failed"


class ExtensionUnavailable(Exception):
    """Why the operations library cannot be built or loaded here (one line, for the log)."""


def extension_library(openvino, *, wait: bool = True) -> pathlib.Path | None:
    """The operations library for this OpenVINO, built into the cache if it is not there yet;
    None (logged once) where it is turned off or cannot be built. `wait` False (a decoder's load):
    None at once unless it is built, its build started in the background."""
    if os.environ.get("CODECSTREAM_OPENVINO_OPS", "1") == "0":
        return None
    cache, package = cache_root(), pathlib.Path(openvino.__file__).parent
    if wait:
        return _built(cache, package, openvino.__version__)
    return _built_or_building(cache, package, openvino.__version__)


@functools.cache
def _built(cache: pathlib.Path, package: pathlib.Path, openvino_version: str) -> pathlib.Path | None:
    """The library, or None; once per process and cache (a failed build is neither tried nor logged again)."""
    try:
        target = _target(cache, package, openvino_version)
        if not target.is_file():
            _build(target, package)
        return _loaded(target)
    except (ExtensionUnavailable, OSError) as reason:
        warn_unavailable(str(reason))
        return None


def _built_or_building(cache: pathlib.Path, package: pathlib.Path, openvino_version: str) -> pathlib.Path | None:
    try:
        target = _target(cache, package, openvino_version)
        if target.is_file():
            return _loaded(target)
        failed = target.with_name(target.name + _FAILED_SUFFIX)
        if failed.is_file():
            raise ExtensionUnavailable(failed.read_text(errors="replace").strip() or "its build failed")
    except (ExtensionUnavailable, OSError) as reason:
        _warn_once(str(reason))
        return None
    _build_in_background(cache)
    return None


@functools.cache
def _warn_once(reason: str) -> None:
    warn_unavailable(reason)


def _loaded(library: pathlib.Path) -> pathlib.Path:
    # Held open for the life of the process: OpenVINO unloads a library when the last Core or
    # NodeFactory that added it goes, while compiled programs still run its operations.
    if library not in _PINNED:
        ctypes.CDLL(str(library))
        _PINNED.append(library)
    return library


def warn_unavailable(reason: str) -> None:
    log.warning("OpenVINO runs the decoder without codecstream's fused operations (about 8%% slower): %s", reason)


_background = threading.Lock()
_started: set[pathlib.Path] = set()


def _build_in_background(cache: pathlib.Path) -> None:
    """Start this module's build in a process of its own, once per process and cache."""
    with _background:
        if cache in _started:
            return
        _started.add(cache)
    environment = {**os.environ, "CODECSTREAM_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", __name__, "--background"]
    try:
        # Its own session: it finishes its build (a few seconds) though this process exits first.
        process = subprocess.Popen(
            command, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    except OSError as error:
        _warn_once(f"its build could not be started: {error}")
        return
    threading.Thread(target=process.wait, name="codecstream-openvino-ops-build", daemon=True).start()
    log.info("building codecstream's OpenVINO operations in the background; decoders opened after it use them")


def _target(cache: pathlib.Path, package: pathlib.Path, openvino_version: str) -> pathlib.Path:
    """Where the library for this OpenVINO, compiler and source is kept (checked buildable here)."""
    if sys.platform == "win32":
        raise ExtensionUnavailable("building them is supported on Linux and macOS only")
    if not (package / "include" / "openvino" / "core" / "op_extension.hpp").is_file() or len(_linked(package)) != 2:
        raise ExtensionUnavailable(f"this OpenVINO ({package}) has no C++ headers and libraries to build against")
    key = hashlib.sha256(SOURCE.read_bytes())
    for part in (openvino_version, platform.machine(), _compiler(), *_FLAGS):
        key.update(part.encode() + b"\0")
    return cache / "openvino-ops" / f"codecstream_openvino_ops-{key.hexdigest()[:16]}{_LIBRARY_SUFFIX}"


def _linked(package: pathlib.Path) -> list[pathlib.Path]:
    # libopenvino.so.2641 / libopenvino.2641.dylib and libtbb.so.12, not libopenvino_c or libtbbmalloc
    libs = package / "libs"
    return sorted(libs.glob("libopenvino.*"))[:1] + sorted(libs.glob("libtbb.*"))[:1]


def _build(target: pathlib.Path, package: pathlib.Path) -> None:
    """Compile the library into `target`; a failure leaves its reason beside it and raises."""
    failed = target.with_name(target.name + _FAILED_SUFFIX)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ExtensionUnavailable(f"cannot write {target.parent}: {error}") from None
    try:
        _compile(target, package)
    except ExtensionUnavailable as reason:
        _replace(failed, str(reason).encode())
        raise
    failed.unlink(missing_ok=True)


def _compile(target: pathlib.Path, package: pathlib.Path) -> None:
    began = time.perf_counter()
    compiler, libs = _compiler(), package / "libs"
    with tempfile.TemporaryDirectory() as scratch:
        built = pathlib.Path(scratch) / target.name
        command = [compiler, *_FLAGS, f"-I{package / 'include'}", str(SOURCE), *map(str, _linked(package))]
        command += [f"-Wl,-rpath,{libs}", "-o", str(built)]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise ExtensionUnavailable(f"{compiler} failed to run: {error}") from None
        if result.returncode != 0:
            first_error = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr[-300:])
            raise ExtensionUnavailable(f"{compiler} could not build {SOURCE.name}: {first_error.strip()}")
        _replace(target, built.read_bytes())
    log.info("built codecstream's OpenVINO operations in %.1f s: %s", time.perf_counter() - began, target)


def _replace(path: pathlib.Path, data: bytes) -> None:
    """Write `path` under a temporary name in its folder, then rename: another process that builds or
    reads it at the same time never sees half a file."""
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        staged.write_bytes(data)
        os.replace(staged, path)
    except OSError as error:
        staged.unlink(missing_ok=True)
        raise ExtensionUnavailable(f"cannot write {path}: {error}") from None


def _compiler() -> str:
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and (path := shutil.which(candidate)):
            return path
    raise ExtensionUnavailable("no C++ compiler found (set CXX, or install g++ or clang++)")


def main(argv: list[str] | None = None) -> int:
    """Build the library into the cache now; `--background`: as a decoder's load starts it (lowest
    priority, nothing printed)."""
    background = "--background" in (argv if argv is not None else sys.argv[1:])
    if background and hasattr(os, "nice"):
        os.nice(19)  # the compiler inherits it: a decoding process keeps the cores
    if not background:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    from codecstream.client.runtimes.openvino_import import import_openvino

    library = extension_library(import_openvino())
    if not background:
        print(library or "not built (the reason is above)")
    return 0 if library else 1


if __name__ == "__main__":
    sys.exit(main())

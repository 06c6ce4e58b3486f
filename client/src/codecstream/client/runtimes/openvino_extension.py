"""codecstream's own OpenVINO operations (openvino_ops/*.cpp), compiled once on the client.

OpenVINO takes operations from a shared library (`Core.add_extension`). The library must be built
against the OpenVINO it is loaded into, whose wheel carries the headers and libraries for that,
so it is built on the client the first time it is needed (a few seconds, with the C++ compiler
of $CXX, else c++, g++ or clang++) and kept in the client's cache under a key of its source,
the OpenVINO version and the compiler, like torch's C++ extensions. Where it cannot be built (no
compiler, no headers) the decoder runs the exported graph as it is, a little slower, and says so
once in the log. CODECSTREAM_OPENVINO_OPS=0 turns the operations off.
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
import time

from codecstream.client.cache import cache_root

log = logging.getLogger(__name__)

#: The operations' source, shipped as package data beside this module.
SOURCE = pathlib.Path(__file__).parent / "openvino_ops" / "snake_beta.cpp"
_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden")
_LIBRARY_SUFFIX = {"darwin": ".dylib", "win32": ".dll"}.get(sys.platform, ".so")
BUILD_TIMEOUT_S = 300
_PINNED: list = []


class ExtensionUnavailable(Exception):
    """Why the operations library cannot be built or loaded here (one line, for the log)."""


def extension_library(openvino) -> pathlib.Path | None:
    """The operations library for this OpenVINO, built into the cache if it is not there yet;
    None (logged once) where it is turned off or cannot be built."""
    if os.environ.get("CODECSTREAM_OPENVINO_OPS", "1") == "0":
        return None
    return _built(cache_root(), pathlib.Path(openvino.__file__).parent, openvino.__version__)


@functools.cache
def _built(cache: pathlib.Path, package: pathlib.Path, openvino_version: str) -> pathlib.Path | None:
    """The library, or None; once per process and cache (a failed build is neither tried nor logged again)."""
    try:
        library = _build(cache, package, openvino_version)
        # Held open for the life of the process: OpenVINO unloads a library when the last Core or
        # NodeFactory that added it goes, while compiled programs still run its operations.
        _PINNED.append(ctypes.CDLL(str(library)))
    except (ExtensionUnavailable, OSError) as reason:
        warn_unavailable(str(reason))
        return None
    return library


def warn_unavailable(reason: str) -> None:
    log.warning("OpenVINO runs the decoder without codecstream's fused operations (about 8%% slower): %s", reason)


def _build(cache: pathlib.Path, package: pathlib.Path, openvino_version: str) -> pathlib.Path:
    if sys.platform == "win32":
        raise ExtensionUnavailable("building them is supported on Linux and macOS only")
    include, libs = package / "include", package / "libs"
    # libopenvino.so.2641 / libopenvino.2641.dylib and libtbb.so.12, not libopenvino_c or libtbbmalloc
    linked = sorted(libs.glob("libopenvino.*"))[:1] + sorted(libs.glob("libtbb.*"))[:1]
    if not (include / "openvino" / "core" / "op_extension.hpp").is_file() or len(linked) != 2:
        raise ExtensionUnavailable(f"this OpenVINO ({package}) has no C++ headers and libraries to build against")
    compiler = _compiler()
    key = hashlib.sha256(SOURCE.read_bytes())
    for part in (openvino_version, platform.machine(), compiler, *_FLAGS):
        key.update(part.encode() + b"\0")
    target = cache / "openvino-ops" / f"codecstream_openvino_ops-{key.hexdigest()[:16]}{_LIBRARY_SUFFIX}"
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ExtensionUnavailable(f"cannot write {target.parent}: {error}") from None
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        built = pathlib.Path(scratch) / target.name
        command = [compiler, *_FLAGS, f"-I{include}", str(SOURCE), *map(str, linked), f"-Wl,-rpath,{libs}"]
        command += ["-o", str(built)]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise ExtensionUnavailable(f"{compiler} failed to run: {error}") from None
        if result.returncode != 0:
            first_error = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr[-300:])
            raise ExtensionUnavailable(f"{compiler} could not build {SOURCE.name}: {first_error.strip()}")
        # A temporary name in the target's folder, then a rename: another process that builds the
        # same library at the same time never loads a half-written file.
        staged = target.with_name(f".{target.name}.{os.getpid()}")
        try:
            shutil.copyfile(built, staged)
            os.replace(staged, target)
        except OSError as error:
            staged.unlink(missing_ok=True)
            raise ExtensionUnavailable(f"cannot write {target}: {error}") from None
    log.info("built codecstream's OpenVINO operations in %.1f s: %s", time.perf_counter() - began, target)
    return target


def _compiler() -> str:
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and (path := shutil.which(candidate)):
            return path
    raise ExtensionUnavailable("no C++ compiler found (set CXX, or install g++ or clang++)")

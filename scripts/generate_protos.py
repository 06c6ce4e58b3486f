#!/usr/bin/env python3
"""Regenerate the Python stubs of the codecstream.v1 contract: `python scripts/generate_protos.py`.

Output goes to protocol/src/ (committed). `--out DIR` writes elsewhere; the test suite uses it to
fail when the committed stubs are stale. The stubs depend on the grpcio-tools version, which the
development environment pins.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import grpc_tools
from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protocol"
DEFAULT_OUT = PROTO_ROOT / "src"


def proto_files() -> list[pathlib.Path]:
    return sorted((PROTO_ROOT / "codecstream").rglob("*.proto"))


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every contract file; return what was written."""
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    files = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {files}")
    return sorted((out_dir / "codecstream" / "v1").glob("*_pb2*.py*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="output root (default: protocol/src)")
    written = generate(parser.parse_args().out)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""OpenVINO's runtime imported without its model conversion API, for the programs and the operations library."""

from __future__ import annotations

import sys

from codecstream.client.runtimes.program import missing_runtime

#: OpenVINO's model conversion API, which `import openvino` loads unless it is already loaded.
_CONVERSION_API = "openvino.tools.ovc"


def import_openvino():
    """OpenVINO's runtime, without its model conversion API: the client converts no model, and that
    API's import sends a usage event to Google Analytics from a process it forks (openvino_telemetry)
    while the client's gRPC threads run, which gRPC reports on stderr ("fork_posix.cc ... skipping
    fork() handlers"); it also lengthens the import (docs/performance.md, "Measurements behind the
    code"). `openvino.convert_model` is then
    not on the package (`from openvino.tools.ovc import convert_model` works as ever); a program that
    imported OpenVINO itself first keeps the package as it imported it."""
    block = "openvino" not in sys.modules and _CONVERSION_API not in sys.modules
    if block:
        sys.modules[_CONVERSION_API] = None  # its import fails, and openvino/__init__.py goes on without it
    try:
        import openvino
    except ImportError as error:
        raise missing_runtime("OpenVINO", "openvino", error) from None
    finally:
        if block and sys.modules.get(_CONVERSION_API, "") is None:
            del sys.modules[_CONVERSION_API]
    return openvino

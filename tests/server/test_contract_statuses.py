"""The contract and the server agree: every RPC is registered, every status the server code can
return is listed in synthesis.proto's error list."""

from __future__ import annotations

import pathlib
import re
import types

from codecstream.server.handlers import synthesis_handler
from codecstream.v1 import synthesis_pb2 as pb

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROTO = ROOT / "protocol" / "codecstream" / "v1" / "synthesis.proto"
SERVER_SOURCES = sorted((ROOT / "server" / "src").rglob("*.py"))


def listed_statuses() -> set[str]:
    """Status names in the comment block above `service SynthesisService`."""
    text = PROTO.read_text()
    comment = text[: text.index("service SynthesisService")].rsplit("\n\n", 1)[-1]
    return set(re.findall(r"^//\s+([A-Z_]{5,})\s", comment, flags=re.MULTILINE))


def statuses_in_server_code() -> set[str]:
    """Status names the server code refuses, aborts or ends calls with: `Refusal("X"`, `invalid(`
    (INVALID_ARGUMENT), `grpc.StatusCode.X`, `set_status(context, "X"`."""
    found: set[str] = set()
    pattern = re.compile(
        r'Refusal\(\s*"([A-Z_]+)"|StatusCode\.([A-Z_]+)|\bset_status\(\s*context,\s*"([A-Z_]+)"|\b(invalid)\('
    )
    for path in SERVER_SOURCES:
        for match in pattern.finditer(path.read_text()):
            found.add("INVALID_ARGUMENT" if match.group(4) else match.group(1) or match.group(2) or match.group(3))
    return found


def test_every_status_the_server_returns_is_listed_in_the_contract():
    in_code = statuses_in_server_code()
    assert {"INVALID_ARGUMENT", "UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED", "UNAUTHENTICATED"} <= in_code
    assert in_code <= listed_statuses(), f"not listed in synthesis.proto: {sorted(in_code - listed_statuses())}"


def test_the_registered_handler_serves_every_rpc_of_the_contract():
    service = pb.DESCRIPTOR.services_by_name["SynthesisService"]
    servicer = types.SimpleNamespace(**{method.name: None for method in service.methods})
    handler = synthesis_handler(servicer)
    for method in service.methods:
        call = types.SimpleNamespace(method=f"/{service.full_name}/{method.name}")
        assert handler.service(call) is not None, f"{method.name} is not registered"

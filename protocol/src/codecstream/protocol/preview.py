"""Quoting untrusted input in error messages and log lines: a short prefix and the full size.

A status message travels in gRPC trailing metadata (Python clients refuse more than 16 KB of it;
grpc-js stalls on ~64 KB) and a log line should stay a line, so client input is never echoed whole.
"""

from __future__ import annotations

PREVIEW_CHARS = 32


def preview(value: str | bytes, limit: int = PREVIEW_CHARS) -> str:
    """`value` as repr, cut to `limit` characters: "'nobody'", or "'xxxxxxxx…' (70000 bytes)"."""
    size = len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else len(value)
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({size} bytes)"

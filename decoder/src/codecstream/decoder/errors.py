"""Errors a caller can catch by kind, all of them the protocol's (codecstream.protocol.errors), shared
by every part: CheckpointError for a checkpoint that cannot be loaded, CodesError for bad codes."""

from __future__ import annotations

from codecstream.protocol.errors import CheckpointError, CodesError

__all__ = ["CheckpointError", "CodesError"]

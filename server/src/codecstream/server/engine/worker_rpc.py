"""The server's calls into the talker stage's workers, by `EngineIntrospection`'s own method names.

vLLM-Omni's `collective_rpc` runs a worker method named by a string in the engine core's process
(engine/worker_extension.py), between two engine steps. Each call here names the method through
the class itself (`EngineIntrospection.codecstream_text_open.__name__`), so a method renamed there
is renamed here, and a misspelt one fails in the server, not as an unknown method in the engine.
The server imports the class for its names only: the text feeds it reaches live in the engine core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from codecstream.server.engine.worker_extension import EngineIntrospection

#: The talker's stage in the talker-only pipeline (engine/pipeline.py), the only one.
TALKER_STAGE = 0


class TalkerWorkers:
    """The talker stage's worker processes of one running engine (an `AsyncOmni`)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    async def can_feed_text(self) -> bool:
        """Whether requests can grow: every worker shares its scheduler's process."""
        return all(await self._call(EngineIntrospection.codecstream_text_feeding))

    async def runner_requests(self) -> int:
        """Requests whose state (KV-cache blocks, per-request buffers) the model runners hold."""
        return _count(await self._call(EngineIntrospection.codecstream_runner_request_count), "live requests")

    async def open_text(self, request_id: str, text_ids: int, final: bool) -> None:
        """Make the text feed of a growing request that starts with `text_ids` ids in its prompt."""
        await self._call(EngineIntrospection.codecstream_text_open, request_id, text_ids, final)

    async def feed_text(self, request_id: str, text_ids: list[int], final: bool) -> None:
        """More text ids for a growing request (and whether its input is complete)."""
        await self._call(EngineIntrospection.codecstream_text_feed, request_id, text_ids, final)

    async def close_text(self, request_id: str) -> dict[str, int] | None:
        """Forget a growing request's text; what the engine counted for it (steps taken, schedules
        held), None if no worker knew it."""
        counts = [item for item in await self._call(EngineIntrospection.codecstream_text_close, request_id) if item]
        return counts[0] if counts else None

    async def growing_requests_opened(self) -> int:
        """Growing requests the engine opened since it started (counted by the engine)."""
        return _count(await self._call(EngineIntrospection.codecstream_text_requests_opened), "growing requests")

    async def decode_only_steps(self) -> int:
        """Steps the runners prepared on codecstream's decode-only path (decode_step.py)."""
        return _count(await self._call(EngineIntrospection.codecstream_decode_only_steps), "decode-only steps")

    async def start_profile(self) -> None:
        await self._call(EngineIntrospection.codecstream_profile_start)

    async def stop_profile(self, trace_path: str) -> None:
        await self._call(EngineIntrospection.codecstream_profile_stop, trace_path)

    async def _call(self, method: Callable[..., Any], *args: Any) -> list[Any]:
        """Every worker's answer, in one flat list."""
        return _flatten(await self._engine.collective_rpc(method.__name__, args=args, stage_ids=[TALKER_STAGE]))


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [item for part in value for item in _flatten(part)]
    return [value]


def _count(answers: list[Any], what: str) -> int:
    wrong = [answer for answer in answers if not isinstance(answer, int)]
    if wrong:
        raise RuntimeError(f"engine returned {wrong[0]!r} for its count of {what}")
    return sum(answers)

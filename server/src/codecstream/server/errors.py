"""What can go wrong with a stream, as the server's layers tell each other.

Before a stream's Header the answer is a `Refusal` (a gRPC status and its message); after it,
`GenerationFailed` ends the stream with End(ERROR) (`TextInputExpired`, a streamed text left
waiting, is one the client caused) and `TextInputViolation` with End(ERROR) then
INVALID_ARGUMENT. `SourceUnavailable` is the engine itself failing. Messages name the field and
the limit and quote client input only through `preview`.
"""

from __future__ import annotations


class Refusal(Exception):
    """A call refused before its Header: `status` is a grpc.StatusCode name ('INVALID_ARGUMENT')."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def invalid(message: str) -> Refusal:
    return Refusal("INVALID_ARGUMENT", message)


class GenerationFailed(Exception):
    """Generation stopped on a failure; the message is one line a client may read (End.message)."""


class TextInputExpired(GenerationFailed):
    """A streamed text's client sent no speakable text, or no end_of_input, within the limits: the
    stream ends with End(ERROR) for the client's own doing, which is no failure of the server."""


class SourceUnavailable(Exception):
    """The source cannot serve at all (its engine died); the message says why, in one line."""


class TextInputViolation(Exception):
    """A TextInput the contract forbids; the message names the rule (never the client's text)."""


def one_line(error: BaseException, limit: int | None = 200, *, with_type: bool = False) -> str:
    """An error as one line a log or a client can take: its message's first line, cut at `limit`
    characters (None: not cut), or its type's name when it has no message. `with_type`: the type's
    name first ("OSError: ..."), where the type is what tells an unexpected failure apart."""
    message = str(error).strip()
    name = type(error).__name__
    if not message:
        text = name
    else:
        text = f"{name}: {message.splitlines()[0]}" if with_type else message.splitlines()[0]
    return text if limit is None or len(text) <= limit else text[:limit] + "…"

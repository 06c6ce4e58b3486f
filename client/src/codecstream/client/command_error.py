"""`CommandError`: why a `codecstream` command failed, printed as one line with an exit code.

It is not a library error: only the commands raise it (the client's and the sub-commands other
distributions add). It has a module of its own because under `python -m codecstream.client.cli`
the CLI module is `__main__`, where commands could not import the class the CLI catches.
"""

from __future__ import annotations


class CommandError(Exception):
    """A reason a CLI command failed, printed as one line; `exit_code` defaults to 1."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

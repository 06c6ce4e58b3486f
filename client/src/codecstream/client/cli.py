"""`codecstream`: the command line of the client (other distributions add commands to it).

Commands register through the `codecstream.commands` entry-point group: each entry point is a
function `register(subparsers)` that adds one sub-parser whose `handler(args) -> int` runs it.
The exporter adds `export-decoder` and `parity` this way, so the client stays installable alone.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from codecstream.client.command_error import CommandError
from codecstream.client.errors import CodecStreamError
from codecstream.protocol.errors import ProtocolError

#: Flags whose value is a secret: a recorded command line holds REDACTED in its place.
SECRET_FLAGS = ("--token",)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codecstream", description="codecstream client tools")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_entry_point_commands(subparsers, "codecstream.commands")
    return parser


def add_entry_point_commands(subparsers, group: str, prefix: str = "") -> None:
    """Let every entry point of `group` register its sub-command; one that fails to import becomes
    a sub-command that says why (a half-installed distribution must not break the others)."""
    for entry_point in sorted(entry_points(group=group), key=lambda e: e.name):
        try:
            register = entry_point.load()
        except ImportError as error:
            broken = subparsers.add_parser(entry_point.name, help=f"(unavailable: {error})")
            name = f"{prefix}{entry_point.name}"
            broken.set_defaults(handler=lambda args, e=error, n=name: _unavailable(n, e))
            continue
        register(subparsers)


def command_line(argv: Sequence[str]) -> str:
    """`codecstream ARGV` as a shell takes it, with every secret flag's value REDACTED."""
    words, secret_next = ["codecstream"], False
    for word in argv:
        flag, equals, _ = word.partition("=")
        if secret_next:
            words.append("REDACTED")
        elif flag in SECRET_FLAGS and equals:
            words.append(f"{flag}=REDACTED")
        else:
            words.append(word)
        secret_next = word in SECRET_FLAGS
    return shlex.join(words)


def _unavailable(name: str, error: ImportError) -> int:
    raise CommandError(f"command {name} is unavailable: {error}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    # What ran, for records that say how to reproduce them (parity reports).
    args.command_line = command_line(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("codecstream: interrupted", file=sys.stderr)
        return 130
    except (CommandError, CodecStreamError, ProtocolError, OSError) as error:
        print(f"codecstream {args.command}: error: {error}", file=sys.stderr)
        return getattr(error, "exit_code", 1)


if __name__ == "__main__":
    sys.exit(main())

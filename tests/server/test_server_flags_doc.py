"""docs/server.md's flag table is the parser's: a row for every flag `codecstream-server` takes, none
for a flag it does not, and each default as the parser has it."""

from __future__ import annotations

import argparse
import pathlib
import re

import pytest
from codecstream.server.cli import build_parser

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "server.md"


def documented() -> dict[str, str]:
    """The flag table's default cell of each flag (rows that name two flags give each its part)."""
    text = DOC.read_text()
    table = text[text.index("| flag | default | meaning |") :].split("\n\n", 1)[0]
    found = {}
    for row in table.splitlines()[2:]:
        flags_cell, default_cell = [cell.strip() for cell in row.strip("|").split(" | ")[:2]]
        flags = re.findall(r"`(--[a-z-]+)[^`]*`", flags_cell)
        parts = default_cell.split(", ")
        for index, flag in enumerate(flags):
            found[flag] = parts[index] if len(parts) == len(flags) else default_cell
    return found


def flags() -> dict[str, object]:
    """Every flag of the parser and its default."""
    return {
        action.option_strings[-1]: action.default
        for action in build_parser()._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    }


def test_the_flag_table_has_a_row_for_every_flag_and_none_for_a_flag_that_does_not_exist():
    assert sorted(documented()) == sorted(flags())


@pytest.mark.parametrize("flag", sorted(flags()))
def test_the_flag_table_states_each_default_as_the_parser_has_it(flag):
    default, cell = flags()[flag], documented().get(flag)
    assert cell is not None, f"docs/server.md has no row for {flag}"
    if default is None or default == [] or isinstance(default, pathlib.Path):
        # No literal default (absent, or worked out where the server runs): the row says what applies.
        assert cell and not cell[0].isdigit(), f"{flag}: {cell!r}"
    else:
        shown = f"{default:g}" if isinstance(default, (int, float)) else str(default)
        assert cell.split(" ")[0] == shown, f"{flag}: docs/server.md says {cell!r}, the parser {shown!r}"

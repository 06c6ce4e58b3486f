"""No class in the server's or the client's code over 300 lines: a class that long holds more than one
idea (issue 53), and a reader can no longer see what it is for."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MOST_LINES = 300


@pytest.mark.parametrize("distribution", ["server", "client"])
def test_no_class_is_over_300_lines(distribution):
    long = []
    for path in sorted((ROOT / distribution / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MOST_LINES:
                long.append(f"{path.relative_to(ROOT)}: {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, f"classes over {MOST_LINES} lines: {long}"

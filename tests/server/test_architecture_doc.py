"""docs/architecture.md stays true to the code: every module it names exists, its state table covers
every Phase of the session, and the modules import only what comes before them in its order."""

from __future__ import annotations

import ast
import pathlib
import re

from codecstream.server.session import Phase

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
SERVER = ROOT / "server" / "src" / "codecstream" / "server"


def test_every_module_the_page_names_exists():
    named = set(re.findall(r"`([a-z_/]+)\.py`", DOC)) | set(re.findall(r"`([a-z_/]+)\.[A-Za-z_]+`", DOC))
    server_modules = {str(p.relative_to(SERVER).with_suffix("")) for p in SERVER.rglob("*.py")}
    client = ROOT / "client" / "src" / "codecstream" / "client"
    client_modules = {p.stem for p in client.rglob("*.py")} | {p.name for p in client.iterdir() if p.is_dir()}
    unknown = {name for name in named if name not in server_modules | client_modules}
    assert not unknown, f"docs/architecture.md names modules that do not exist: {sorted(unknown)}"


def test_the_state_table_covers_every_phase_of_the_session():
    rows = re.findall(r"^\| ([A-Z]+) \| .* \| ([A-Z]+) \|", DOC, flags=re.MULTILINE)
    assert {phase for phase, _ in rows} | {after for _, after in rows} == {phase.name for phase in Phase}


def test_the_server_modules_import_only_those_before_them_in_the_pages_order():
    order_line = DOC.split("Modules import strictly downward in this list:")[1].split("\n\n")[0]
    levels = [re.findall(r"`([a-z_/]+)`", level) for level in order_line.split("→")]
    level_of = {name.replace("/", "."): index for index, names in enumerate(levels) for name in names}
    upward = []
    for name, level in level_of.items():
        tree = ast.parse((SERVER / f"{name.replace('.', '/')}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("codecstream.server."):
                imported = node.module.removeprefix("codecstream.server.")
                if level_of.get(imported, -1) >= level and imported != name:
                    upward.append(f"{name} imports {imported}")
    assert not upward, upward

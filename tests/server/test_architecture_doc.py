"""docs/architecture.md stays true to the code: every module it names exists, its state table covers
every Phase of the session, every server module has one row in its module table, and a module
imports only modules of lower levels that run in every process it runs in."""

from __future__ import annotations

import ast
import functools
import pathlib
import re

from codecstream.server.session import Phase

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
SERVER = ROOT / "server" / "src" / "codecstream" / "server"
PACKAGE = "codecstream.server"
# A server module by its path under SERVER without ".py", as the page spells it: "engine/scheduler".
MODULES = {str(path.relative_to(SERVER).with_suffix("")): path for path in SERVER.rglob("*.py")}


@functools.cache
def table() -> dict[str, tuple[int, frozenset[str]]]:
    """The page's module table: module -> (level, the processes it runs in)."""
    rows = re.findall(r"^\| (\d+) \| `([a-z_/]+)` \| ([a-z ,]+) \| .+ \|$", DOC, flags=re.MULTILINE)
    names = [name for _, name, _ in rows]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    assert not duplicated, f"docs/architecture.md has more than one row for {duplicated}"
    return {name: (int(level), frozenset(processes.split(", "))) for level, name, processes in rows}


def server_module(dotted: str) -> str | None:
    """The server module a dotted name lies in (a module, or something defined in one), or None."""
    if dotted != PACKAGE and not dotted.startswith(f"{PACKAGE}."):
        return None
    parts = dotted.removeprefix(PACKAGE).lstrip(".").split(".") if dotted != PACKAGE else []
    for end in range(len(parts), -1, -1):
        path = "/".join(parts[:end])
        for name in (path, f"{path}/__init__" if path else "__init__"):
            if name in MODULES:
                return name
    return None


def imports(name: str) -> set[str]:
    """The server modules a module imports, at its top or inside a function."""
    package = ".".join([PACKAGE, *name.split("/")[:-1]])
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            found |= {server_module(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            # `from package import module` imports the module, `from module import name` the module.
            found |= {server_module(f"{module}.{alias.name}") for alias in node.names}
    return found - {None, name}


def named(name: str) -> set[str]:
    """The server modules a module names for vLLM-Omni to load ("codecstream.server.engine.x:Class")."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= {server_module(dotted) for dotted in re.findall(rf"{re.escape(PACKAGE)}\.[\w.]+", node.value)}
    return found - {None, name}


def test_every_module_the_page_names_exists():
    named_on_page = set(re.findall(r"`([a-z_/]+)\.py`", DOC)) | set(re.findall(r"`([a-z_/]+)\.[A-Za-z_]+`", DOC))
    client = ROOT / "client" / "src" / "codecstream" / "client"
    client_modules = {str(p.relative_to(client).with_suffix("")) for p in client.rglob("*.py")}
    client_modules |= {p.stem for p in client.rglob("*.py")} | {p.name for p in client.iterdir() if p.is_dir()}
    unknown = {name for name in named_on_page if name not in set(MODULES) | client_modules}
    assert not unknown, f"docs/architecture.md names modules that do not exist: {sorted(unknown)}"


def test_the_state_table_covers_every_phase_of_the_session():
    rows = re.findall(r"^\| ([A-Z]+) \| .* \| ([A-Z]+) \|", DOC, flags=re.MULTILINE)
    assert {phase for phase, _ in rows} | {after for _, after in rows} == {phase.name for phase in Phase}


def test_every_server_module_has_one_row_in_the_pages_module_table():
    unplaced = sorted(set(MODULES) - set(table()))
    assert not unplaced, f"docs/architecture.md's module table has no row for {unplaced}"
    unknown = sorted(set(table()) - set(MODULES))
    assert not unknown, f"docs/architecture.md's module table has rows for modules that do not exist: {unknown}"


def test_a_module_imports_or_names_only_modules_of_lower_levels():
    level = {name: row[0] for name, row in table().items()}
    upward = [
        f"{name} (level {level.get(name, 'missing')}) {how} {other} (level {level.get(other, 'missing')})"
        for name in sorted(MODULES)
        for how, others in (("imports", imports(name)), ("names", named(name)))
        for other in sorted(others)
        if name not in level or other not in level or level[other] >= level[name]
    ]
    assert not upward, upward


def test_a_module_imports_only_modules_that_run_in_every_process_it_runs_in():
    runs_in = {name: ", ".join(sorted(row[1])) for name, row in table().items()}
    crossing = [
        f"{name} (runs in {runs_in.get(name, 'missing')}) imports {other} (runs in {runs_in.get(other, 'missing')})"
        for name in sorted(MODULES)
        for other in sorted(imports(name))
        if name not in runs_in or other not in runs_in or not table()[name][1] <= table()[other][1]
    ]
    assert not crossing, crossing

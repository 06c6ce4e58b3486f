"""docs/architecture.md stays true to the code: every module it names exists, its state table covers
every Phase of the session, every module of every package under */src has one row in its package's
table, a module imports (a server module also names for vLLM-Omni to load) only modules of its own
package of lower levels, and a server module imports only modules that run in every process it runs
in. Imports across packages are tests/docs/test_packaging_doc.py's."""

from __future__ import annotations

import ast
import functools
import pathlib
import re

import pytest
from codecstream.server.session import Phase

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
#: Every package of every distribution: the folders under */src/codecstream/.
PACKAGES = {
    f"codecstream.{folder.name}": folder
    for folder in sorted(ROOT.glob("*/src/codecstream/*"))
    if folder.is_dir() and any(folder.glob("*.py"))
}


@functools.cache
def modules(package: str) -> dict[str, pathlib.Path]:
    """A package's modules by their path under its folder without ".py", as the page spells them:
    "engine/scheduler"."""
    folder = PACKAGES[package]
    return {str(path.relative_to(folder).with_suffix("")): path for path in folder.rglob("*.py")}


@functools.cache
def sections() -> dict[str, str]:
    """The page's text under each "### `codecstream.<package>`" heading, by package."""
    parts = re.split(r"^### `(codecstream\.[a-z0-9_]+)`.*$", DOC, flags=re.MULTILINE)
    found = {}
    for package, text in zip(parts[1::2], parts[2::2], strict=True):
        assert package not in found, f"docs/architecture.md has two sections for {package}"
        found[package] = text.split("\n## ", 1)[0]
    return found


@functools.cache
def table(package: str) -> dict[str, tuple[int, frozenset[str]]]:
    """A package's module table: module -> (level, the processes it runs in; empty where the table
    has no such column)."""
    rows = re.findall(r"^\| (\d+) \| `([a-z0-9_/]+)` \| (.+) \|$", sections().get(package, ""), flags=re.MULTILINE)
    names = [name for _, name, _ in rows]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    assert not duplicated, f"docs/architecture.md has more than one row for {package}'s {duplicated}"
    has_processes = "| runs in |" in sections().get(package, "")
    return {
        name: (int(level), frozenset(rest.split(" | ")[0].split(", ")) if has_processes else frozenset())
        for level, name, rest in rows
    }


def module_of(package: str, dotted: str) -> str | None:
    """The module of `package` a dotted name lies in (a module, or something defined in one), or None."""
    if dotted != package and not dotted.startswith(f"{package}."):
        return None
    parts = dotted.removeprefix(package).lstrip(".").split(".") if dotted != package else []
    for end in range(len(parts), -1, -1):
        path = "/".join(parts[:end])
        for name in (path, f"{path}/__init__" if path else "__init__"):
            if name in modules(package):
                return name
    return None


def imported_names(package: str, name: str) -> set[str]:
    """The dotted names a module imports, at its top or inside a function, relative imports resolved."""
    here = ".".join([package, *name.split("/")[:-1]])
    found = set()
    for node in ast.walk(ast.parse(modules(package)[name].read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            # `from package import module` imports the module, `from module import name` the module.
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def imports(package: str, name: str) -> set[str]:
    """The modules of its own package a module imports, at its top or inside a function."""
    return {module_of(package, dotted) for dotted in imported_names(package, name)} - {None, name}


def named(package: str, name: str) -> set[str]:
    """The modules of its own package a server module names for vLLM-Omni to load into its process
    ("codecstream.server.engine.x:Class"). Elsewhere a module's name in a string is a child process
    to start (`python -m`) or prose, and loads nothing beside the module."""
    if package != "codecstream.server":
        return set()
    found = set()
    for node in ast.walk(ast.parse(modules(package)[name].read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for dotted in re.findall(rf"{re.escape(package)}\.[\w.]+", node.value):
                found.add(module_of(package, dotted))
    return found - {None, name}


def test_every_package_under_src_has_a_section():
    assert set(sections()) == set(PACKAGES), (
        f"docs/architecture.md's sections {sorted(sections())} are not the packages {sorted(PACKAGES)}"
    )


def test_every_module_the_page_names_exists():
    on_page = set(re.findall(r"`([a-z0-9_/]+)\.py`", DOC)) | set(re.findall(r"`([a-z0-9_/]+)\.[A-Za-z_]+`", DOC))
    known = {"codecstream"}  # the namespace, as in `codecstream.client`
    for package in PACKAGES:
        known |= set(modules(package)) | {path.stem for path in modules(package).values()}
        known |= {path.name for path in PACKAGES[package].rglob("*") if path.is_dir()}
    unknown = sorted(name for name in on_page - known if not (ROOT / f"{name}.py").is_file())
    assert not unknown, f"docs/architecture.md names modules that do not exist: {unknown}"


def test_the_state_table_covers_every_phase_of_the_session():
    rows = re.findall(r"^\| ([A-Z]+) \| .* \| ([A-Z]+) \|", DOC, flags=re.MULTILINE)
    assert {phase for phase, _ in rows} | {after for _, after in rows} == {phase.name for phase in Phase}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_module_has_one_row_in_its_package_s_table(package):
    unplaced = sorted(set(modules(package)) - set(table(package)))
    assert not unplaced, f"docs/architecture.md's table of {package} has no row for {unplaced}"
    unknown = sorted(set(table(package)) - set(modules(package)))
    assert not unknown, f"docs/architecture.md's table of {package} has rows for modules that do not exist: {unknown}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_a_module_imports_or_names_only_modules_of_lower_levels(package):
    level = {name: row[0] for name, row in table(package).items()}
    upward = [
        f"{package}: {name} (level {level.get(name, 'missing')}) {how} {other} (level {level.get(other, 'missing')})"
        for name in sorted(modules(package))
        for how, others in (("imports", imports(package, name)), ("names", named(package, name)))
        for other in sorted(others)
        if name not in level or other not in level or level[other] >= level[name]
    ]
    assert not upward, upward


def test_a_server_module_imports_only_modules_that_run_in_every_process_it_runs_in():
    package = "codecstream.server"
    rows = table(package)
    runs_in = {name: ", ".join(sorted(row[1])) for name, row in rows.items()}
    crossing = [
        f"{name} (runs in {runs_in.get(name, 'missing')}) imports {other} (runs in {runs_in.get(other, 'missing')})"
        for name in sorted(modules(package))
        for other in sorted(imports(package, name))
        if name not in rows or other not in rows or not rows[name][1] <= rows[other][1]
    ]
    assert not crossing, crossing

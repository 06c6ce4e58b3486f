"""docs/packaging.md's distribution rule holds for the code: one row per distribution, each shipping
the packages its row names under the one `codecstream` namespace, depending on the codecstream
distributions its row names, importing only its own packages and those of the distributions it
depends on, and only the client owning the `codecstream` command."""

from __future__ import annotations

import ast
import functools
import pathlib
import re

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "packaging.md").read_text()
#: The distributions: every folder with a pyproject.toml of its own (the root's is tool configuration).
FOLDERS = sorted(path.parent.name for path in ROOT.glob("*/pyproject.toml"))
CODECSTREAM_DEPENDENCY = re.compile(r"^codecstream-([a-z]+)\b")


@functools.cache
def rows() -> dict[str, dict[str, str]]:
    """The page's table: folder -> its columns by header."""
    lines = [line for line in DOC.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    table = {}
    for line in lines[1:]:
        cells = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        table[cells["folder"].strip("`/")] = cells
    return table


def project(folder: str) -> dict:
    return tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["project"]


def codecstream_dependencies(requirements: list[str]) -> set[str]:
    """The folders of the codecstream distributions among requirements ("codecstream-protocol==0.5.0")."""
    return {match.group(1) for requirement in requirements if (match := CODECSTREAM_DEPENDENCY.match(requirement))}


def closure(folders: set[str]) -> set[str]:
    """These distributions and every codecstream distribution they depend on, however indirectly."""
    found, todo = set(), list(folders)
    while todo:
        folder = todo.pop()
        if folder not in found:
            found.add(folder)
            todo.extend(codecstream_dependencies(project(folder).get("dependencies", [])))
    return found


def packages(folder: str) -> set[str]:
    """The packages a distribution ships: the folders of its src/codecstream/."""
    return {f"codecstream.{path.name}" for path in (ROOT / folder / "src" / "codecstream").iterdir() if path.is_dir()}


def imported_codecstream_packages(path: pathlib.Path) -> set[str]:
    """The codecstream packages a module imports, at its top or inside a function ("codecstream.protocol")."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "codecstream" else [f"codecstream.{a.name}" for a in node.names]
        found |= {".".join(name.split(".")[:2]) for name in names if name.startswith("codecstream.")}
    return found


def test_the_page_has_one_row_per_distribution_named_as_its_pyproject_names_it():
    assert sorted(rows()) == FOLDERS
    named = {folder: row["distribution"].strip("`") for folder, row in rows().items()}
    assert named == {folder: project(folder)["name"] for folder in FOLDERS}


def test_codecstream_is_a_namespace_package_in_every_distribution():
    inits = sorted(str(path.relative_to(ROOT)) for path in ROOT.glob("*/src/codecstream/__init__.py"))
    assert not inits, f"codecstream must stay a namespace package: remove {inits}"


def test_each_distribution_ships_the_packages_its_row_names():
    for folder, row in rows().items():
        named = set(re.findall(r"`(codecstream\.[a-z0-9_]+)`", row["import"]))
        assert packages(folder) == named, f"{folder}/ ships {sorted(packages(folder))}; its row names {sorted(named)}"


def test_each_row_names_the_codecstream_distributions_and_extras_its_pyproject_declares():
    for folder, row in rows().items():
        required, _, extras = row["depends on"].partition("; extras ")
        listed = {word for word in re.findall(r"[a-z][a-z0-9-]*", required) if word in FOLDERS}
        declared = codecstream_dependencies(project(folder).get("dependencies", []))
        assert listed == declared, f"{folder}/'s row depends on {sorted(listed)}; its pyproject on {sorted(declared)}"
        listed_extras = set(re.findall(r"`([a-z0-9-]+)`", extras))
        declared_extras = set(project(folder).get("optional-dependencies", {}))
        assert listed_extras == declared_extras, (
            f"{folder}/'s row lists extras {sorted(listed_extras)}; its pyproject declares {sorted(declared_extras)}"
        )


def test_a_distribution_imports_only_its_own_packages_and_those_of_the_distributions_it_depends_on():
    owner = {package: folder for folder in FOLDERS for package in packages(folder)}
    climbing = []
    for folder in FOLDERS:
        extras = project(folder).get("optional-dependencies", {}).values()
        reachable = closure({folder}.union(*(codecstream_dependencies(extra) for extra in extras)))
        for path in sorted((ROOT / folder / "src").rglob("*.py")):
            for package in sorted(imported_codecstream_packages(path)):
                if owner.get(package) not in reachable:
                    where = owner.get(package, "no distribution")
                    climbing.append(f"{path.relative_to(ROOT)} imports {package} ({where}/)")
    assert not climbing, climbing


def test_only_the_client_owns_the_codecstream_command_and_the_others_add_sub_commands_to_it():
    owners = sorted(folder for folder in FOLDERS if "codecstream" in project(folder).get("scripts", {}))
    assert owners == ["client"]
    for folder in FOLDERS:
        if project(folder).get("entry-points", {}).get("codecstream.commands"):
            assert "client" in closure({folder}), f"{folder}/ adds codecstream commands without depending on the client"

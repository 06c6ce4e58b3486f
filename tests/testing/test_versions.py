"""One version for every distribution: the repository's VERSION file. Each distribution reads it
(through a link), the pins between them name it, and the installed packages report it."""

from __future__ import annotations

import pathlib
import re

import codecstream.client
import codecstream.server
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
DISTRIBUTIONS = ("protocol", "decoder", "client", "server", "export", "testing")
VERSION = (ROOT / "VERSION").read_text().strip()


def test_every_distribution_takes_its_version_from_the_one_version_file():
    for name in DISTRIBUTIONS:
        project = tomllib.loads((ROOT / name / "pyproject.toml").read_text())
        assert "version" not in project["project"] and "version" in project["project"]["dynamic"], name
        assert project["tool"]["setuptools"]["dynamic"]["version"] == {"file": "VERSION"}, name
        assert (ROOT / name / "VERSION").resolve() == (ROOT / "VERSION").resolve(), name


def test_every_pin_between_the_distributions_names_that_version():
    stale = []
    for name in DISTRIBUTIONS:
        text = (ROOT / name / "pyproject.toml").read_text()
        stale += [f"{name}: {m.group(0)}" for m in re.finditer(r"codecstream-[a-z]+==(\S+?)[\"',]", text)
                  if m.group(1) != VERSION]  # fmt: skip
    assert not stale, f"pins that are not {VERSION}: {stale} (run scripts/set-version {VERSION})"


def test_the_packages_report_the_installed_version():
    assert codecstream.client.__version__ == VERSION
    assert codecstream.server.__version__ == VERSION

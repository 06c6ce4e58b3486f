"""The release version is written in each distribution's pyproject.toml and in the pins between them;
they must all agree, and the packages report the installed one."""

from __future__ import annotations

import pathlib
import re

import codecstream.client
import codecstream.server
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
DISTRIBUTIONS = ("protocol", "decoder", "client", "server", "export", "testing")


def test_every_distribution_and_every_pin_between_them_name_one_version():
    projects = {name: tomllib.loads((ROOT / name / "pyproject.toml").read_text())["project"] for name in DISTRIBUTIONS}
    versions = {project["version"] for project in projects.values()}
    assert len(versions) == 1, versions
    pins = set()
    for project in projects.values():
        requirements = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            requirements += extra
        pins |= {m.group(1) for r in requirements if (m := re.match(r"codecstream-[a-z]+==(\S+)", r))}
    assert pins == versions


def test_the_packages_report_the_installed_version():
    version = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["project"]["version"]
    assert codecstream.client.__version__ == version
    assert codecstream.server.__version__ == version

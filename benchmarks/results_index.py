"""Write benchmarks/results/README.md: every record in benchmarks/results, the script that wrote it, the
commit it ran at, and the doc sections that quote it.

    python benchmarks/results_index.py            # rewrite the index
    python benchmarks/results_index.py --check    # exit 1 if the index is not what this would write

tests/benchmarks/test_results_index.py runs the check, so a record added without its row, or a doc
that stops quoting a record, fails the suite until the index is written again.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "README.md"
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
#: Records written before bench_record stamped every record with its commit.
BEFORE_STAMPING = "before stamping"


def _find(value, key: str):
    """The first string under `key` anywhere in a record (a dict of dicts and lists), or None."""
    if isinstance(value, dict):
        if isinstance(value.get(key), str) and value[key]:
            return value[key]
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            found = _find(item, key)
            if found:
                return found
    return None


def script_of(record: dict) -> str:
    """The script that wrote a record: its stamp, else its benchmark's name, else its command's."""
    if record.get("script"):
        return record["script"]
    names = [record.get("benchmark") or ""]
    command = _find(record, "command") or ""
    names += re.findall(r"([\w]+)\.py\b", command)
    for name in names:
        if name and (ROOT / "benchmarks" / f"{name}.py").is_file():
            return f"benchmarks/{name}.py"
    if "tests/gpu" in command:
        return "scripts/test-gpu (tests/gpu)"
    return "by hand (the record says how)"


def commit_of(record: dict) -> str:
    found = (_find(record, "commit") or "").split()
    return found[0][:12] if found and found[0] != "unknown" else BEFORE_STAMPING


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections_quoting(name: str) -> list[str]:
    """Links to the doc sections that name a record ("soak.json"), under the heading each is quoted in."""
    found = []
    pattern = re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w-])")
    for doc in DOCS:
        heading = None
        for line in doc.read_text().splitlines():
            if match := re.match(r"^#+ (.+)$", line):
                heading = match[1]
            elif pattern.search(line):
                where = f"{doc.relative_to(ROOT)}" + (f"#{_slug(heading)}" if heading else "")
                title = f"{doc.name}: {heading}" if heading else doc.name
                link = f"[{title}](../../{where})"
                if link not in found:
                    found.append(link)
    return found


def index() -> str:
    rows = []
    for path in sorted(RESULTS.glob("*.json")):
        record = json.loads(path.read_text())
        plot = f" (+ `{path.with_suffix('.png').name}`)" if path.with_suffix(".png").is_file() else ""
        quoted = "; ".join(sections_quoting(path.name)) or "not quoted by a doc"
        rows.append(f"| `{path.name}`{plot} | `{script_of(record)}` | {commit_of(record)} | {quoted} |")
    for folder in sorted(path for path in RESULTS.iterdir() if path.is_dir()):
        quoted = "; ".join(sections_quoting(folder.name)) or "not quoted by a doc"
        rows.append(f"| `{folder.name}/` (server and test logs) | | | {quoted} |")
    return (
        "# Benchmark records\n\n"
        "Written by `python benchmarks/results_index.py`; tests/benchmarks/test_results_index.py fails when it is\n"
        "stale. Each record holds the machine, the versions and the exact command; records written by\n"
        f'`bench_record.write_record` also the script and the commit ("{BEFORE_STAMPING}": an older record).\n'
        "docs/performance.md is where their figures are read.\n\n"
        "| record | script | commit | quoted in |\n"
        "|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the index is stale, write nothing")
    args = parser.parse_args()
    wanted = index()
    if args.check:
        stale = not INDEX.is_file() or INDEX.read_text() != wanted
        if stale:
            print(f"{INDEX.relative_to(ROOT)} is stale: run python benchmarks/results_index.py", file=sys.stderr)
        return 1 if stale else 0
    INDEX.write_text(wanted)
    print(f"wrote {INDEX.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""benchmarks/results/README.md indexes every record: a record without its row, or an index that no
longer says which doc sections quote a record, fails until `python benchmarks/results_index.py`
writes it again."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import results_index


def test_every_record_has_a_row_in_the_index():
    text = results_index.INDEX.read_text() if results_index.INDEX.is_file() else ""
    missing = [path.name for path in sorted(results_index.RESULTS.glob("*.json")) if f"| `{path.name}`" not in text]
    assert not missing, f"benchmarks/results/README.md has no row for {missing}: run python benchmarks/results_index.py"


def test_the_index_is_what_the_generator_writes_now():
    assert results_index.INDEX.read_text() == results_index.index(), (
        "benchmarks/results/README.md is stale: run python benchmarks/results_index.py"
    )


def test_a_record_without_a_stamp_is_indexed_as_before_stamping_and_by_its_command():
    record = {"machine": {"command": "python benchmarks/soak_bench.py --downloads"}}
    assert results_index.script_of(record) == "benchmarks/soak_bench.py"
    assert results_index.commit_of(record) == results_index.BEFORE_STAMPING
    stamped = {"script": "benchmarks/ramp_bench.py", "commit": "0123456789abcdef+changes", **record}
    assert results_index.script_of(stamped) == "benchmarks/ramp_bench.py"
    assert results_index.commit_of(stamped) == "0123456789ab"

"""Every record bench_record writes says where it came from: the script, the exact command, the commit
(CODECSTREAM_COMMIT over git's), the machine and the versions; and every benchmark writes through it."""

from __future__ import annotations

import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_record

BENCHMARKS = pathlib.Path(bench_record.__file__).resolve().parent


def test_a_written_record_carries_script_command_commit_machine_and_versions(tmp_path, monkeypatch):
    monkeypatch.setenv("CODECSTREAM_COMMIT", "abc1234")
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / "ramp_bench.py"), "--quiet"])
    bench_record.write_record({"rows": [1, 2]}, tmp_path / "record.json")
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["script"] == "benchmarks/ramp_bench.py"
    assert record["command"].endswith("ramp_bench.py --quiet")
    assert record["commit"] == record["machine"]["commit"] == "abc1234"
    assert {"cpu", "logical_cpus", "load_average_1m_at_start", "date"} <= set(record["machine"])
    assert {"python", "codecstream-protocol", "numpy"} <= set(record["versions"])
    assert record["rows"] == [1, 2]


def test_what_a_record_says_of_itself_is_kept_and_completed(tmp_path, monkeypatch):
    monkeypatch.setenv("CODECSTREAM_COMMIT", "abc1234")
    taken = {**bench_record.machine(), "load_average_1m_at_start": 0.25}
    bench_record.write_record({"machine": taken, "versions": {"torch": "2.13.0"}}, tmp_path / "record.json")
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["machine"]["load_average_1m_at_start"] == 0.25
    assert record["versions"]["torch"] == "2.13.0" and "codecstream-client" in record["versions"]


def test_the_commit_is_git_s_where_codecstream_commit_is_not_set(monkeypatch):
    monkeypatch.delenv("CODECSTREAM_COMMIT", raising=False)
    assert re.fullmatch(r"[0-9a-f]{40}(\+changes)?|unknown", bench_record.commit())


def test_every_benchmark_writes_its_record_through_bench_record():
    # An exported artifact's manifest.json is no record.
    direct = [
        f"{path.name}: {line.strip()}"
        for path in sorted(BENCHMARKS.glob("*.py"))
        if path.name != "bench_record.py"
        for line in path.read_text().splitlines()
        if "write_text(json.dumps(" in line and "manifest" not in line
    ]
    assert not direct, f"records written without bench_record.write_record (no stamp): {direct}"

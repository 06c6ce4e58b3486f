"""One real codecstream server per session on the lane's device, and the lane's record (tests/gpu/lane.py)."""

from __future__ import annotations

import json
import time

import pytest
from codecstream.testing.random_checkpoint import write_qwen3_tts_checkpoint

from tests.gpu.lane import NEVER_EOS_MEAN_FRAMES, SERVER_LOG, START_TIMEOUT_S, Lane, LaneReport
from tests.gpu.server_process import ServerProcess

_RECORD = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def lane() -> Lane:
    return Lane.from_environment()


@pytest.fixture(scope="session")
def lane_report(lane, request, tmp_path_factory):
    report = LaneReport(lane)
    yield report
    path = report.write(lane.log_dir or tmp_path_factory.getbasetemp())
    request.config.stash[_RECORD] = f"{path}\n{json.dumps(report.record, indent=2)}"


@pytest.fixture(scope="session")
def lane_server(lane, lane_report, tmp_path_factory):
    """`codecstream-server` on a random-weight checkpoint in the official layout, with the shipped
    deploy YAML of the lane's device, serving on a loopback port; stopped after the last test."""
    workdir = tmp_path_factory.mktemp("gpu-lane")
    began = time.monotonic()
    checkpoint = write_qwen3_tts_checkpoint(
        workdir / f"qwen3-tts-{lane.preset}", preset=lane.preset, seed=0, mean_frames=NEVER_EOS_MEAN_FRAMES
    )
    lane_report.add("checkpoint_write_s", round(time.monotonic() - began, 1))
    log_dir = lane.log_dir or workdir
    log_dir.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(checkpoint, lane.deploy_config, log_dir / SERVER_LOG)
    lane_report.add("server_command", server.command)
    lane_report.add("server_log", str(server.log_path))
    try:
        lane_report.add("start_to_serving_s", round(server.wait_until_serving(START_TIMEOUT_S), 1))
        yield server
    finally:
        lane_report.add("server_exit_status", server.stop())


def pytest_terminal_summary(terminalreporter, config) -> None:
    record = config.stash.get(_RECORD, None)
    if record:
        terminalreporter.write_sep("-", "GPU lane record")
        terminalreporter.write_line(record)

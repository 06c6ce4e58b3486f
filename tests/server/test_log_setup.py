"""codecstream's log lines in a process whose logging nobody configured (the engine's own process,
the forkserver): they reach stderr in the server's format, once, and a configured process keeps
its own setup."""

from __future__ import annotations

import os
import subprocess
import sys

LOG_A_LINE = """
import logging
from codecstream.server.log_setup import log_where_unconfigured
{before}
log_where_unconfigured()
log_where_unconfigured()  # a second plugin load, or the forkserver's child: still one handler
logging.getLogger("codecstream.server.engine.talker_model").info("the code predictor runs")
logging.getLogger("codecstream.server.engine.talker_model").debug("not at INFO")
"""


def run(before: str = "", **environment: str) -> str:
    code = LOG_A_LINE.format(before=before)
    env = {**os.environ, **environment}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_a_process_nobody_configured_logs_codecstream_lines_once_in_the_server_format():
    lines = run().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].endswith(" INFO codecstream.server.engine.talker_model: the code predictor runs")


def test_the_level_follows_vllm_s_for_that_process():
    assert "not at INFO" in run(VLLM_LOGGING_LEVEL="DEBUG")
    assert run(VLLM_LOGGING_LEVEL="WARNING") == ""
    assert "the code predictor runs" in run(VLLM_LOGGING_LEVEL="NOT-A-LEVEL")


def test_a_process_that_configured_its_logging_keeps_it():
    lines = run(before='logging.basicConfig(level=logging.INFO, format="root: %(message)s")').splitlines()
    assert lines == ["root: the code predictor runs"]

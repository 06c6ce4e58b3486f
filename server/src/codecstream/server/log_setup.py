"""The server's log line format, and codecstream's log lines from a process nothing configured.

The server and the balancer configure logging in their own processes. vLLM-Omni's engine process
(spawned, or forked from the forkserver) configures only vLLM's loggers, so what codecstream's
modules say there at INFO (which code predictor runs, the JIT warm-up switched off, the
forkserver's preload) reached no log at all. `log_where_unconfigured` gives the `codecstream`
logger a handler of its own in such a process: the server's format, at the level vLLM logs at in
that process (VLLM_LOGGING_LEVEL, INFO by default).
"""

from __future__ import annotations

import logging
import os

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_where_unconfigured() -> None:
    """A stderr handler on the `codecstream` logger, unless this process already logs somewhere
    (the server's own process, a test runner): never a second copy of a line."""
    logger = logging.getLogger("codecstream")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    level = logging.getLevelName(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())
    logger.setLevel(level if isinstance(level, int) else logging.INFO)
    logger.propagate = False

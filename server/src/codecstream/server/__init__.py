"""codecstream server: streams codec tokens of a talker-only Qwen3-TTS engine over gRPC."""

from importlib.metadata import PackageNotFoundError, version

try:  # the version lives once, in pyproject.toml
    __version__ = version("codecstream-server")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "unknown"

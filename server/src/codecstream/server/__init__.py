"""codecstream server: streams codec tokens of a talker-only Qwen3-TTS engine over gRPC."""

__version__ = "0.1.0"

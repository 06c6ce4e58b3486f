"""Test support for codecstream: complete random-weight Qwen3-TTS checkpoints, built from code.

Not installed by users: the test suite, the benchmarks and the demo use it because no model hub is
reachable where they run.
"""

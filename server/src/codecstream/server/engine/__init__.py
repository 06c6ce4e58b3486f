"""The talker-only Qwen3-TTS engine: vLLM-Omni plugins (pipeline, model, CPU platform) and the code source."""

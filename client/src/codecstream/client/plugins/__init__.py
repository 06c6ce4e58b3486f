"""Integrations with voice-agent frameworks (extras of codecstream-client): pipecat, livekit."""

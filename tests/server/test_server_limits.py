"""Settings are checked where they are made, whoever makes them: a ServerLimits or ServerOptions
built in code is refused exactly as the flags that build it are, and GetCodecInfo states the limits
in the contract's units, the resume window as the Header states it."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest
from codecstream.client import Client
from codecstream.server.app import MAX_DRAIN_DELAY_S, Keepalive, ServerOptions
from codecstream.server.limits import LIMIT_RANGES, OutOfRange, ServerLimits, milliseconds
from codecstream.server.supervisor import RestartPolicy

#: A value just outside each limit's range.
OUTSIDE = {
    "max_text_chars": 0,
    "max_instructions_chars": -1,
    "max_reference_audio_s": -0.5,
    "max_frames": 0,
    "max_concurrent_streams": 0,
    "streams_per_client_per_minute": -1,
    "max_streams_per_client": -1,
    "max_engine_requests_per_client": -1,
    "max_engine_wait_s": 0.0,
    "max_downloads_per_client": -1,
    "max_concurrent_downloads": 0,
    "resume_window_s": -1.0,
    "stalled_client_timeout_s": 0.0,
    "max_reference_transcript_chars": -1,
    "max_reference_audio_bytes": -1,
    "min_reference_audio_s": -0.5,
    "resume_retained_chunks": -1,
    "first_message_timeout_s": -1.0,
    "min_clause_chars": 0,
    "max_segment_chars": 0,
    "text_idle_s": 0.0,
    "text_input_timeout_s": 0.0,
    "max_text_input_s": -1.0,
    "start_gate_tokens": 0,
    "control_messages_per_s": 0.0,
    "control_message_burst": 0,
    "segment_base_frames": 0,
    "segment_frames_per_char": 0.0,
}


def test_every_ranged_limit_has_a_value_outside_its_range_here():
    assert set(OUTSIDE) == set(LIMIT_RANGES)


def test_every_number_a_server_holds_to_has_a_range():
    """On main 16 of the 29 limits had none: first_message_timeout_s=-1 was accepted."""
    numbers = {field.name for field in dataclasses.fields(ServerLimits) if field.name != "default_chunking"}
    assert numbers == set(LIMIT_RANGES)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"min_reference_audio_s": 40.0},
            r"^min_reference_audio_s must be at most max_reference_audio_s \(30\), got 40$",
        ),
        ({"min_clause_chars": 300}, r"^min_clause_chars must be at most max_segment_chars \(250\), got 300$"),
    ],
)
def test_a_minimum_above_its_maximum_is_refused(settings, message):
    with pytest.raises(OutOfRange, match=message):
        ServerLimits(**settings)


@pytest.mark.parametrize("name", sorted(OUTSIDE))
def test_a_server_limits_built_in_code_refuses_a_limit_out_of_its_range(name):
    with pytest.raises(OutOfRange, match=rf"^{name} must be {LIMIT_RANGES[name][0]}, got ") as refused:
        ServerLimits(**{name: OUTSIDE[name]})
    assert refused.value.name == name


def test_the_engine_share_may_be_left_to_the_engine():
    assert ServerLimits(max_engine_requests_per_client=None).max_engine_requests_per_client is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"port": 70000}, "port must be 0-65535, got 70000"),
        ({"shutdown_grace_s": -1}, "shutdown_grace_s must be >= 0, got -1"),
        ({"drain_delay_s": MAX_DRAIN_DELAY_S + 1}, f"drain_delay_s must be 0-{MAX_DRAIN_DELAY_S:g}, got 301"),
        ({"drain_delay_s": -1}, f"drain_delay_s must be 0-{MAX_DRAIN_DELAY_S:g}, got -1"),
    ],
)
def test_server_options_built_in_code_refuse_a_setting_out_of_its_range(options, message):
    with pytest.raises(OutOfRange, match=f"^{message}$"):
        ServerOptions(**options)


@pytest.mark.parametrize("given", ["tls_cert", "tls_key"])
def test_server_options_refuse_half_a_tls_pair_when_made_not_when_bound(given):
    with pytest.raises(ValueError, match="TLS needs both"):
        ServerOptions(**{given: pathlib.Path("server.pem")})


def test_keepalive_and_restart_policy_refuse_a_setting_out_of_its_range():
    with pytest.raises(OutOfRange, match=r"^time_s must be > 0, got 0$"):
        Keepalive(time_s=0)
    with pytest.raises(OutOfRange, match=r"^max_attempts must be >= 0, got -1$"):
        RestartPolicy(max_attempts=-1)


def test_durations_are_stated_in_whole_milliseconds_rounded_to_the_nearest():
    assert milliseconds(5.0) == 5000
    assert milliseconds(0.0016) == 2
    assert milliseconds(0.0014) == 1


def test_get_codec_info_and_the_header_state_the_same_resume_window(replay_server_factory):
    limits = ServerLimits(resume_window_s=2.0006)
    server = replay_server_factory(limits=limits)
    with Client(server.target) as client:
        stated = client.codec_info().resume_window_ms
        stream = client.stream_codes("Hi.", resumable=True)
        list(stream)
    assert stated == stream.header.resume_window_ms == 2001

"""`codecstream say` and `codecstream info` as a user meets them: exit codes and one-line errors."""

import asyncio
import subprocess
import sys
import threading
import wave

import pytest
from codecstream.client import Client
from codecstream.protocol import decoder_digest
from codecstream.protocol.codes_file import CodesFile
from codecstream.server.app import CodecStreamServer, ServerOptions
from codecstream.server.replay import ReplaySource
from codecstream.testing.waiting import wait_for
from codecstream.v1 import synthesis_pb2 as pb

from tests.conftest import EventLoopThread, random_codes

CLI = [sys.executable, "-m", "codecstream.client.cli"]


def say(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "say", *args], capture_output=True, text=True, timeout=300)


def test_say_writes_a_wav_and_prints_a_summary(replay_server_factory, checkpoint, tmp_path):
    server = replay_server_factory(codes=random_codes(30), decoder_digest=decoder_digest(checkpoint))
    out = tmp_path / "hi.wav"
    result = say(
        "Hello.", "--server", server.target, "--decoder", str(checkpoint), "--backend", "torch", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    with wave.open(str(out)) as wav:
        assert wav.getnframes() == 30 * 1920 and wav.getframerate() == 24000 and wav.getsampwidth() == 2
    assert "2.40 s of audio (EOS)" in result.stderr


def test_say_dash_speaks_standard_input_while_it_is_written(replay_server_factory, checkpoint, tmp_path):
    server = replay_server_factory(codes=random_codes(10), decoder_digest=decoder_digest(checkpoint))
    out = tmp_path / "piped.wav"
    command = [*CLI, "say", "-", "--server", server.target, "--decoder", str(checkpoint), "--backend", "torch",
               "--out", str(out)]  # fmt: skip
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for piece in ("Hello", " there.", " Goodbye"):  # an LLM writing its reply
        process.stdin.write(piece)
        process.stdin.flush()
    # The first sentence is spoken while the reply is still being written.
    frames_sent = "codecstream_frames_total"
    assert server.wait_until(lambda: server.server.metrics.registry.get_sample_value(frames_sent) == 10, timeout=60)
    process.stdin.write(" now.")
    process.stdin.close()
    process.wait(120)
    stderr = process.stderr.read()
    assert process.returncode == 0, stderr
    with wave.open(str(out)) as wav:  # two segments, the replay's 10 frames each
        assert wav.getnframes() == 2 * 10 * 1920
    assert "1.60 s of audio (EOS)" in stderr


def test_without_a_sound_device_play_says_so_in_one_line_and_the_wav_is_still_written(
    replay_server_factory, checkpoint, tmp_path
):
    server = replay_server_factory(codes=random_codes(10), decoder_digest=decoder_digest(checkpoint))
    out = tmp_path / "hi.wav"
    played = say("Hi.", "--server", server.target, "--decoder", str(checkpoint), "--backend", "torch", "--play")
    if played.returncode == 0:
        pytest.skip("this machine can play audio")
    assert played.returncode == 1
    assert played.stderr.strip().count("\n") == 0 and "cannot play audio" in played.stderr
    both = say(
        "Hi.",
        "--server",
        server.target,
        "--decoder",
        str(checkpoint),
        "--backend",
        "torch",
        "--play",
        "--out",
        str(out),
    )
    assert both.returncode == 0 and "cannot play audio" in both.stderr and out.exists()


def test_say_with_nowhere_to_put_audio_is_a_usage_error(checkpoint):
    result = say("Hi.", "--decoder", str(checkpoint))
    assert result.returncode == 2 and "pass --out FILE.wav and/or --play" in result.stderr


def test_unreachable_server_is_one_line_and_exit_1(checkpoint, tmp_path):
    result = say(
        "Hi.",
        "--server",
        "127.0.0.1:9",
        "--decoder",
        str(checkpoint),
        "--backend",
        "torch",
        "--out",
        str(tmp_path / "x.wav"),
    )
    assert result.returncode == 1
    assert result.stderr.strip().startswith("codecstream say: error: UNAVAILABLE")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "x.wav").exists()  # on main a 44-byte WAV header was left behind


def test_missing_decoder_is_one_line_and_exit_1(replay_server, tmp_path):
    result = say(
        "Hi.",
        "--server",
        replay_server.target,
        "--decoder",
        str(tmp_path / "nothing"),
        "--out",
        str(tmp_path / "x.wav"),
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_info_prints_codec_and_voices(replay_server):
    result = subprocess.run(
        [*CLI, "info", "--server", replay_server.target], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "qwen3-tts-tokenizer-12hz v2: 16 x 2048, 24000 Hz" in result.stdout and "vivian" in result.stdout


def test_say_without_a_decoder_asks_the_server_and_says_in_one_line_what_to_do_when_it_offers_none(
    replay_server_factory, tmp_path
):
    server = replay_server_factory(codes=random_codes(10))
    result = say("Hello.", "--server", server.target, "--out", str(tmp_path / "x.wav"))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert "offers no decoder artifact for its codes: pass decoder=PATH" in lines[-1], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("fps", "late"), [(0.0, False), (4.0, True)], ids=["as fast as it can", "slower than real time"]
)
def test_say_counts_the_underruns_a_real_time_player_would_meet_without_playing(
    replay_server_factory, checkpoint, tmp_path, fps, late
):
    """On main `say --out` printed "underruns 0" whatever came: it counted only while playing."""
    server = replay_server_factory(codes=random_codes(24), fps=fps, decoder_digest=decoder_digest(checkpoint))
    result = say(
        "Hello.", "--server", server.target, "--decoder", str(checkpoint), "--backend", "torch",
        "--out", str(tmp_path / "hi.wav"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    underruns = int(result.stderr.split("underruns ")[1].split()[0])
    # 4 frames a second is a third of real time: each chunk after the first comes after the audio
    # before it has played out.
    assert underruns >= 3 if late else underruns == 0


class HeldStart(ReplaySource):
    """A replay source whose start (an engine's load) lasts until the test lets it end."""

    released = threading.Event()

    async def start(self) -> None:
        await asyncio.to_thread(self.released.wait, 60)


def info(target: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "info", "--server", target], capture_output=True, text=True, timeout=60)


def test_info_says_whether_the_server_takes_streams_and_while_its_engine_starts_that_it_does_not_and_why():
    loop = EventLoopThread()
    server = CodecStreamServer(HeldStart(CodesFile(random_codes(10))), ServerOptions(port=0, shutdown_grace_s=0.5))
    starting = asyncio.run_coroutine_threadsafe(server.start(), loop.loop)
    try:
        wait_for(lambda: server.port, 30, "the server to listen while its engine starts")
        target = f"127.0.0.1:{server.port}"
        with Client(target) as client:
            assert client.codec_info().serving_state == pb.SERVING_STATE_NOT_SERVING
        result = info(target)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0] == (
            "state            not serving: the engine is starting (new streams are refused until it serves)"
        )
        HeldStart.released.set()
        starting.result(30)
        assert "state            serving" in info(target).stdout.splitlines()
    finally:
        HeldStart.released.set()
        loop.run(server.stop(grace_s=0.5))
        loop.close()

import numpy as np
import pytest
from codecstream.client.jitter_buffer import DECODE_HEADROOM, SAFETY_MARGIN_S, JitterBuffer
from codecstream.protocol.chunking import ChunkSchedule

RATE = 24_000


def tone(seconds: float, value: float = 0.5) -> np.ndarray:
    return np.full(int(seconds * RATE), value, dtype=np.float32)


def test_playback_waits_for_the_playout_delay_then_plays_in_order():
    buffer = JitterBuffer(RATE, playout_delay_s=0.1)
    buffer.push(tone(0.05, 0.1))
    assert not buffer.pull(480).any()  # 50 ms buffered < 100 ms delay: silence, not a stall
    buffer.push(tone(0.05, 0.2))
    out = np.concatenate([buffer.pull(480) for _ in range(5)])
    np.testing.assert_allclose(out[:1200], 0.1)
    np.testing.assert_allclose(out[1200:2400], 0.2)
    assert buffer.stats.underruns == 0 and buffer.stats.stall_s == 0


def test_running_dry_counts_one_underrun_and_the_stall_time():
    buffer = JitterBuffer(RATE, playout_delay_s=0.0)
    buffer.push(tone(0.02))
    buffer.pull(480)
    for _ in range(5):
        buffer.pull(480)
    assert buffer.stats.underruns == 1
    assert abs(buffer.stats.stall_s - 5 * 0.02) < 1e-9


def test_end_of_stream_plays_the_tail_without_waiting_and_is_not_a_stall():
    buffer = JitterBuffer(RATE, playout_delay_s=0.5)
    buffer.push(tone(0.01))
    buffer.end_of_stream()
    assert buffer.pull(480).any()
    buffer.pull(480)
    assert buffer.finished and buffer.stats.underruns == 0


def test_clear_drops_queued_audio_at_once():
    buffer = JitterBuffer(RATE, playout_delay_s=0.0)
    buffer.push(tone(1.0))
    buffer.pull(480)
    dropped = buffer.clear()
    assert abs(dropped - (1.0 - 0.02)) < 1e-6
    assert not buffer.pull(480).any() and buffer.finished


def test_automatic_delay_covers_measured_decode_time_and_lateness():
    buffer = JitterBuffer(RATE)
    buffer.push(tone(0.16), decode_s=0.03, arrived_s=10.0)
    buffer.push(tone(0.32), decode_s=0.05, arrived_s=10.20)  # due at 10.16: 40 ms late
    assert buffer.stats.playout_delay_s >= 0.05 + 0.04 + SAFETY_MARGIN_S - 1e-9


def test_a_slow_first_chunk_is_not_lateness():
    buffer = JitterBuffer(RATE, schedule=ChunkSchedule((2,)))  # chunks of one size: the need is one decode
    buffer.push(tone(0.16), decode_s=0.03, arrived_s=5.0)  # the request took 5 s: that is latency, not jitter
    buffer.push(tone(0.16), decode_s=0.03, arrived_s=5.10)  # ahead of schedule
    # The need is the next chunk's wait at this arrival pace plus its decode (0.106 s), no 5 s.
    assert buffer.stats.playout_delay_s == pytest.approx(0.1 + DECODE_HEADROOM * 0.03 - 0.03 + SAFETY_MARGIN_S)


def test_automatic_delay_grows_after_an_underrun():
    buffer = JitterBuffer(RATE, schedule=ChunkSchedule((1,)))
    buffer.push(tone(0.05), decode_s=0.01)
    before = buffer.stats.playout_delay_s
    for _ in range(5):
        buffer.pull(480)
    assert buffer.stats.underruns == 1
    assert buffer.stats.playout_delay_s > before


def test_the_delay_covers_the_larger_chunks_the_schedule_brings_next():
    # 1 frame decoded at 0.625x real time, planned at 0.75x with the headroom; the 2, 4, 8, 16 and
    # 25-frame chunks after it take as long per second, while only what came before them plays:
    # the 25-frame chunk is the tightest.
    buffer = JitterBuffer(RATE, schedule=ChunkSchedule((1, 2, 4, 8, 16, 25)))
    buffer.push(tone(0.08), decode_s=0.05 * 0.75 / (0.625 * DECODE_HEADROOM))
    tightest = 0.75 * (0.16 + 0.32 + 0.64 + 1.28 + 2.0) - (0.16 + 0.32 + 0.64 + 1.28)
    assert buffer.stats.playout_delay_s == pytest.approx(min(1.0, tightest + SAFETY_MARGIN_S))


def simulate(schedule: tuple[int, ...], decode_per_audio_s: float, frames: int) -> JitterBuffer:
    """Chunks decoded back to back at `decode_per_audio_s` seconds per second of audio (the frames
    arrive sooner than that), played by a speaker pulling 20 ms blocks in real time."""
    buffer = JitterBuffer(RATE, schedule=ChunkSchedule(schedule))
    sizes = ChunkSchedule(schedule).split(frames)
    decoded_at, now = [], 0.0
    for size in sizes:
        now += decode_per_audio_s * size * 0.08
        decoded_at.append(now)
    clock, pushed = 0.0, 0
    while not buffer.finished:
        while pushed < len(sizes) and decoded_at[pushed] <= clock + 1e-9:
            seconds = sizes[pushed] * 0.08
            buffer.push(tone(seconds), decode_s=decode_per_audio_s * seconds)
            pushed += 1
            if pushed == len(sizes):
                buffer.end_of_stream()
        buffer.pull(480)
        clock += 0.02
    return buffer


@pytest.mark.parametrize("schedule", [(1, 2, 4, 8, 16, 25), (2, 4, 8, 16, 25), (1, 3, 6, 12, 25)])
@pytest.mark.parametrize("decode_per_audio_s", [0.3, 0.6, 0.7])
def test_a_ramp_decoded_slower_than_it_grows_plays_without_an_underrun(schedule, decode_per_audio_s):
    buffer = simulate(schedule, decode_per_audio_s, frames=150)
    assert buffer.stats.underruns == 0, buffer.stats


def test_a_speaker_pulling_before_the_first_chunk_is_waiting_not_an_underrun():
    buffer = JitterBuffer(RATE)
    for _ in range(10):  # 200 ms of a speaker started before the request
        assert not buffer.pull(480).any()
    buffer.push(tone(0.16), decode_s=0.01)
    buffer.pull(480)
    assert buffer.stats.underruns == 0 and buffer.stats.stall_s == 0


def test_a_fixed_cost_per_call_is_told_from_the_cost_per_second():
    # 20 ms per call plus 0.5 s per second of audio: once two sizes were seen, the 25-frame chunks
    # to come are planned at what they will cost, not at the first chunk's higher rate per second.
    buffer = JitterBuffer(RATE, schedule=ChunkSchedule((1, 2, 4, 8, 16, 25)))
    for frames in (1, 2):
        buffer.push(tone(frames * 0.08), decode_s=0.02 + 0.5 * frames * 0.08)
    sizes = [0.32, 0.64, 1.28, 2.0, 2.0]
    planned = [DECODE_HEADROOM * (0.02 + 0.5 * size) for size in sizes]
    need = max(sum(planned[: m + 1]) - sum(sizes[:m]) for m in range(len(sizes)))
    assert buffer.stats.playout_delay_s == pytest.approx(need + SAFETY_MARGIN_S, abs=1e-6)


def test_chunks_that_arrive_slower_than_they_decode_are_waited_for():
    # A 2x-real-time server: a 16-frame chunk is sent 0.64 s after the 8-frame one; decoding is
    # quick, so the wait for the frames to be made is what the buffer must cover.
    buffer = JitterBuffer(RATE, schedule=ChunkSchedule((2, 4, 8, 16, 25)))
    buffer.push(tone(0.16), decode_s=0.01, arrived_s=0.0)
    buffer.push(tone(0.32), decode_s=0.01, arrived_s=0.16)
    quick = JitterBuffer(RATE, schedule=ChunkSchedule((2, 4, 8, 16, 25)))
    quick.push(tone(0.16), decode_s=0.01)
    quick.push(tone(0.32), decode_s=0.01)
    assert buffer.stats.playout_delay_s > quick.stats.playout_delay_s + 0.2

"""What one server accepts and holds: its limits, how GetCodecInfo announces them, and the
per-client rate limiter."""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from codecstream.protocol.chunking import ChunkSchedule

#: Contract limits (synthesis.proto) on names and ids; fixed, so clients can rely on them.
MAX_NAME_BYTES = 64
MAX_STREAM_ID_BYTES = 64
MAX_CLIENT_REQUEST_ID_BYTES = 128


class OutOfRange(ValueError):
    """A setting outside the range it may take: `name` is its field, `rule` the range."""

    def __init__(self, name: str, rule: str, value: float) -> None:
        super().__init__(f"{name} must be {rule}, got {value:g}")
        self.name, self.rule, self.value = name, rule, value


def check_ranges(settings: object, ranges: Mapping[str, tuple[str, Callable[[Any], bool]]]) -> None:
    """Raise OutOfRange for the first field of `settings` outside its range; None is no value."""
    for name, (rule, holds) in ranges.items():
        value = getattr(settings, name)
        if value is not None and not holds(value):
            raise OutOfRange(name, rule, value)


#: The range of each limit (field -> (rule, test)); a server does not start outside it: a 0 stream
#: limit would refuse every stream, a negative timeout drop every call.
LIMIT_RANGES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "max_text_chars": (">= 1", lambda value: value >= 1),
    "max_instructions_chars": (">= 0", lambda value: value >= 0),
    "max_reference_transcript_chars": (">= 0", lambda value: value >= 0),
    "max_reference_audio_bytes": (">= 0", lambda value: value >= 0),
    "min_reference_audio_s": (">= 0", lambda value: value >= 0),
    "max_reference_audio_s": (">= 0", lambda value: value >= 0),
    "max_frames": (">= 1", lambda value: value >= 1),
    "max_concurrent_streams": (">= 1", lambda value: value >= 1),
    "max_streams_per_client": (">= 0", lambda value: value >= 0),
    "max_engine_requests_per_client": (">= 0", lambda value: value >= 0),
    "max_engine_wait_s": ("> 0", lambda value: value > 0),
    "streams_per_client_per_minute": (">= 0", lambda value: value >= 0),
    "resume_window_s": (">= 0", lambda value: value >= 0),
    "resume_retained_chunks": (">= 0", lambda value: value >= 0),
    "max_downloads_per_client": (">= 0", lambda value: value >= 0),
    "max_concurrent_downloads": (">= 1", lambda value: value >= 1),
    "first_message_timeout_s": ("> 0", lambda value: value > 0),
    "stalled_client_timeout_s": ("> 0", lambda value: value > 0),
    "min_clause_chars": (">= 1", lambda value: value >= 1),
    "max_segment_chars": (">= 1", lambda value: value >= 1),
    "text_idle_s": ("> 0", lambda value: value > 0),
    "text_input_timeout_s": ("> 0", lambda value: value > 0),
    "max_text_input_s": ("> 0", lambda value: value > 0),
    "start_gate_tokens": (">= 1", lambda value: value >= 1),
    "control_messages_per_s": ("> 0", lambda value: value > 0),
    "control_message_burst": (">= 1", lambda value: value >= 1),
    "segment_base_frames": (">= 1", lambda value: value >= 1),
    "segment_frames_per_char": ("> 0", lambda value: value > 0),
}
#: Limits that bound one another (the lower's field, the higher's): a minimum above its maximum
#: would refuse everything between them.
LIMIT_ORDER = (
    ("min_reference_audio_s", "max_reference_audio_s"),
    ("min_clause_chars", "max_segment_chars"),
)


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What one server accepts and holds; checked against LIMIT_RANGES and LIMIT_ORDER when made
    (OutOfRange)."""

    #: Longest Start.text, in characters.
    max_text_chars: int = 2_000
    #: Longest Start.instructions, in characters: vLLM-Omni's own Qwen3-TTS speech API allows 500.
    max_instructions_chars: int = 500
    #: Longest reference transcript, in characters (60 s of fast speech is about 1000).
    max_reference_transcript_chars: int = 1_000
    #: Largest reference audio file: 30 s of 48 kHz stereo 16-bit WAV is 5.8 MB. The whole
    #: message is parsed on the event loop, at a cost per MB (docs/performance.md, "Measurements
    #: behind the code"), so this bounds what one request can hold up every other stream.
    max_reference_audio_bytes: int = 8 * 1024 * 1024
    #: Shortest and longest reference audio, in seconds: vLLM-Omni's own Qwen3-TTS speech API
    #: accepts 1 to 30 s. Below about 1300 samples at 24 kHz (measured: 1024 fails, 1500 works)
    #: its speaker encoder raises inside the engine and takes the engine down; above, the engine
    #: encodes the reference inside one step, stalling every stream for as long (about 1 s for
    #: 30 s of audio on this CPU, benchmarks/results/hostile_load.json).
    min_reference_audio_s: float = 1.0
    max_reference_audio_s: float = 30.0
    #: Largest Start.max_frames, and the limit when it is 0 (2048 frames = 164 s of audio, the
    #: talker's own default max_new_tokens).
    max_frames: int = 2_048
    #: Streams one process serves at once.
    max_concurrent_streams: int = 1_024
    #: Streams one client (checked token, or peer address) may hold at once; 0: unlimited. A quarter of
    #: the server by default, so no one client can take every slot (behind a proxy that hides
    #: the client's address, give clients tokens or raise it).
    max_streams_per_client: int = 256
    #: Streams one client may hold at once on an engine that runs a bounded number of requests
    #: (its max_num_seqs): every stream holds one of them from its Start to its End, a streamed
    #: text for as long as its client keeps it open. None: half of the engine's slots, so that one
    #: client cannot take every slot while its streams wait for text; 0: no such share.
    max_engine_requests_per_client: int | None = None
    #: A growing request (streamed text on the engine) whose client sends no text for this long
    #: while the engine holds it ends with End(ERROR): a request waiting for words keeps its engine
    #: slot, which speakable text every text_input_timeout_s would otherwise hold for
    #: max_text_input_s. An LLM's pause between tokens is seconds at most.
    max_engine_wait_s: float = 20.0
    #: Streams one client (checked token, or peer address) may start per minute; 0: unlimited.
    streams_per_client_per_minute: int = 0
    #: How long a resumable stream waits for its client to reattach, in seconds; 0: no resume.
    resume_window_s: float = 5.0
    #: Sent chunks a resumable stream keeps for Resume beyond the last Ack.
    resume_retained_chunks: int = 512
    #: Decoder downloads one client (checked token, or peer address) may hold at once; 0: unlimited.
    #: A client needs one file once per cache folder; each held download holds up to a part in gRPC's
    #: buffers, so unbounded downloads from one client were a memory flood (docs/performance.md,
    #: "Measurements behind the code").
    max_downloads_per_client: int = 2
    #: Decoder downloads sent at once; more wait for a slot. Each sends as fast as its client reads,
    #: so a few fill any link, and the rest would only take event-loop time from streams.
    max_concurrent_downloads: int = 4
    #: How long a call may take to send its first message (Start or Resume), in seconds.
    first_message_timeout_s: float = 10.0
    #: A call whose client reads nothing for this long is dropped as if disconnected, in seconds.
    #: Streams carry 400 B/s, so the transport's buffers (MBs) fill only if a client stops reading.
    stalled_client_timeout_s: float = 30.0
    #: Chunking when Start.chunking is unset.
    default_chunking: ChunkSchedule = dataclasses.field(default_factory=ChunkSchedule)
    #: Streaming text (TextInput): how the text is cut into segments, each one engine request.
    #: A clause mark ends a segment once it holds this many characters (shorter clauses join the
    #: next: every segment restarts the talker's prosody).
    min_clause_chars: int = 30
    #: A segment without a sentence or clause end is cut at its last space before this length.
    max_segment_chars: int = 250
    #: With nothing being generated, text that waited this long without more arriving is spoken.
    text_idle_s: float = 0.5
    #: A streamed text that brings nothing for this long with nothing left to speak, and no
    #: end_of_input, ends with End(ERROR): a client that forgot end_of_input holds no stream forever.
    text_input_timeout_s: float = 60.0
    #: A streamed text must end (end_of_input) within this long of its Start, in seconds, however
    #: its text trickles in; with the text_input_timeout_s rule, only speakable text renews it.
    max_text_input_s: float = 600.0
    #: One growing request per stream (engine sources that grow requests, engine/text_feed.py): its
    #: first step waits for this many committed text tokens, or a clause or sentence mark, a
    #: flush or the end of the input, whichever comes first. The talker reads one token per
    #: 80 ms frame; a few tokens ahead keep it from pausing at once when the LLM is slower.
    start_gate_tokens: int = 4
    #: Messages a client (checked token, or peer address) may send after its calls' first (TextInput,
    #: Ack, Cancel), over all its calls: per second on average, after a burst. A call beyond it
    #: ends (End(ERROR), INVALID_ARGUMENT). gRPC takes in a call's messages whether or not the
    #: server reads them (a flood of empty flushes costs the server CPU: docs/performance.md,
    #: "Measurements behind the code"), so slowing the reads would bound nothing, and a per-call
    #: budget is spent again by each new call. An honest client stays far below: a whole text is
    #: at most max_text_chars messages, a flush after each doubles it, and acks follow chunks (at
    #: most one per 80 ms of audio).
    control_messages_per_s: float = 200.0
    control_message_burst: int = 4_000
    #: A segment's engine request may generate at most this many frames, plus as many per
    #: character: a guard against a talker that never says EOS for one segment (speech runs at
    #: about 1 frame a character), so one segment cannot use up the stream's budget.
    segment_base_frames: int = 25
    segment_frames_per_char: float = 4.0

    def __post_init__(self) -> None:
        check_ranges(self, LIMIT_RANGES)
        for lower, higher in LIMIT_ORDER:
            if getattr(self, lower) > getattr(self, higher):
                raise OutOfRange(lower, f"at most {higher} ({getattr(self, higher):g})", getattr(self, lower))

    def segment_frame_cap(self, chars: int) -> int:
        return self.segment_base_frames + math.ceil(self.segment_frames_per_char * chars)

    def max_request_bytes(self, reference_audio: bool) -> int:
        """The largest serialized SynthesizeRequest the transport accepts: the largest Start the
        other limits allow (UTF-8 takes up to 4 bytes a character), plus room for the small
        fields; with `reference_audio` (a model that clones voices) the largest reference too.
        gRPC refuses a larger message before it is parsed, which costs the server nothing."""
        strings = 4 * (self.max_text_chars + self.max_instructions_chars + self.max_reference_transcript_chars)
        return (self.max_reference_audio_bytes if reference_audio else 0) + strings + 64 * 1024


def milliseconds(seconds: float) -> int:
    """A duration as the contract states durations: whole milliseconds, rounded to the nearest."""
    return round(seconds * 1000)


def announced_limits(limits: ServerLimits) -> dict[str, Any]:
    """The GetCodecInfoResponse fields that state `limits` as they are, in the contract's units.
    The fields that also depend on the model or the engine (max_request_bytes,
    max_streams_per_client, streamed_text_grows) are the service's to fill."""
    return {
        "max_text_chars": limits.max_text_chars,
        "max_frames": limits.max_frames,
        "default_chunking": limits.default_chunking.to_policy(),
        "resume_window_ms": milliseconds(limits.resume_window_s),
        "max_instructions_chars": limits.max_instructions_chars,
        "max_reference_transcript_chars": limits.max_reference_transcript_chars,
        "max_reference_audio_bytes": limits.max_reference_audio_bytes,
        "min_reference_audio_ms": milliseconds(limits.min_reference_audio_s),
        "max_reference_audio_ms": milliseconds(limits.max_reference_audio_s),
        "first_message_timeout_ms": milliseconds(limits.first_message_timeout_s),
        "stalled_client_timeout_ms": milliseconds(limits.stalled_client_timeout_s),
        "min_clause_chars": limits.min_clause_chars,
        "max_segment_chars": limits.max_segment_chars,
        "text_idle_ms": milliseconds(limits.text_idle_s),
        "start_gate_tokens": limits.start_gate_tokens,
        "text_input_timeout_ms": milliseconds(limits.text_input_timeout_s),
        "max_text_input_ms": milliseconds(limits.max_text_input_s),
        "control_messages_per_s": limits.control_messages_per_s,
        "control_message_burst": limits.control_message_burst,
    }


class RateLimiter:
    """Token bucket per client: `burst` tokens, refilled at `per_s`.

    A bucket left alone until it is full again is what a missing bucket means, so buckets idle
    that long are dropped: the table holds only clients seen recently. `per_s` 0: unlimited.
    A bucket that ran dry is overdrawn until it is full again (`overdrawn_s`).
    """

    def __init__(self, per_s: float, burst: int, clock=time.monotonic) -> None:
        self.per_s = per_s
        self.burst = float(burst)
        self._clock = clock
        self._refill_s = burst / per_s if per_s > 0 else 0.0
        #: client -> (tokens, last update, ran dry since last full), least recently updated first.
        self._buckets: collections.OrderedDict[str, tuple[float, float, bool]] = collections.OrderedDict()

    @classmethod
    def per_minute(cls, count: int, clock=time.monotonic) -> RateLimiter:
        """`count` a minute, all of them at once if the client has been away a minute."""
        return cls(count / 60.0, count, clock)

    def __len__(self) -> int:
        return len(self._buckets)

    def try_acquire(self, client: str) -> float:
        """Take one token for `client`; return 0.0 on success, else the seconds until one is free."""
        if self.per_s <= 0:
            return 0.0
        tokens, now, overdrawn = self._refilled(client)
        if tokens < 1.0:
            self._buckets[client] = (tokens, now, True)
            return (1.0 - tokens) / self.per_s
        self._buckets[client] = (tokens - 1.0, now, overdrawn)
        return 0.0

    def overdrawn_s(self, client: str) -> float:
        """Seconds until `client`'s bucket is full again if it ran dry since it was last full, else
        0.0: how long a client that overran its budget stays barred from what this one guards."""
        if self.per_s <= 0 or client not in self._buckets:
            return 0.0
        tokens, now, overdrawn = self._refilled(client)
        self._buckets[client] = (tokens, now, overdrawn)
        return (self.burst - tokens) / self.per_s if overdrawn else 0.0

    def _refilled(self, client: str) -> tuple[float, float, bool]:
        """Take `client`'s bucket out of the table, refilled to now: (tokens, now, overdrawn)."""
        now = self._clock()
        while self._buckets:
            oldest, (_, stamp, _) = next(iter(self._buckets.items()))
            if now - stamp < self._refill_s:
                break
            del self._buckets[oldest]
        tokens, stamp, overdrawn = self._buckets.pop(client, (self.burst, now, False))
        tokens = min(self.burst, tokens + (now - stamp) * self.per_s)
        return tokens, now, overdrawn and tokens < self.burst

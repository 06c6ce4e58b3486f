"""Can a client exhaust the server? Refused requests by the thousand, then long hostile traffic
beside normal streams (issue 22).

Part "refused", on a replay server that clones voices and on the real talker engine serving a
tiny random Base checkpoint (both parse messages up to 8.5 MB), each `codecstream-server` in its
own process: `--refused` requests of 3-8.5 MB that must be refused (garbage reference audio, a
3 MB transcript, a first-message Cancel carrying 8 MB of unknown fields), one after another from
a sender process, while this process samples the server's resident memory every second. Memory
is read after a warm-up of 50 refusals (allocator arenas and gRPC buffers reach their working
size there).

Part "cost by kind", on a replay server: the server's CPU per second while each hostile kind
runs alone, which says where the neighbours' loss below comes from.

Part "hostile", on the engine serving a CustomVoice checkpoint (streamed text is offered for
CustomVoice, not Base): `--streams` normal streams (1 frame a chunk, so the client sees
every engine step) for `--quiet-seconds` alone, then for `--minutes` beside a hostile process
that mixes what issue 22 found: refused 8 MB requests, streamed texts kept open with spaces and
zero-width characters, floods of empty flushes, streams half-closed without end_of_input, a
TextInput over the message limit after the Header. Recorded: resident memory, the server's
event-loop lag and garbage-collection pauses (its own /metrics), a health prober's latency, and
the neighbours' gap between frames, quiet against hostile. Writes
benchmarks/results/soak.json and a PNG.

    .venv/bin/python benchmarks/soak_bench.py                       # ~35 min here
    .venv/bin/python benchmarks/soak_bench.py --refused 200 --minutes 1 --quiet-seconds 20  # a look

The server (with its engine process) runs on half the cores and the clients on the other half,
as clients on other machines would, the attacker at the lowest priority: the neighbours then lose
what the hostile traffic costs the server, not what the attacker's own process costs this
machine. The engine server of part "hostile" checks bearer tokens, and every neighbour stream and
the attacker hold one each: clients of their own, as they would be from other machines (on one
address they would share every per-client limit, and one client may hold only half the engine's
request slots).

Goals: resident memory grows <= 50 MB over 2,000 refused 8 MB requests (each server); no event
loop stall or collection over 100 ms; the neighbours' gap p99 within 50 ms of quiet.

`--downloads` runs, instead, the decoder-download parts (issue 36; download_clients.py), on a replay
server (frames paced at 12.5/s) offering an artifact of `--artifact-mb` random bytes (the real
decoder's size by default) and checking tokens, each downloading client holding one of its own so
that the per-client limit does not simply refuse them. "flood": the neighbours alone, then beside
`--downloaders` clients each downloading the whole file again and again. "abandoned", on a fresh
server: `--abandoned` downloads that each read one part and are abandoned, one after another per
client (half disconnect at once, half read nothing for a second first), then as many at once, held
past the stall timeout, with a neighbour's own download timed beside them; resident memory from
the server's start. Writes benchmarks/results/soak_downloads.json and a PNG.

    .venv/bin/python benchmarks/soak_bench.py --downloads --quiet-seconds 30 --flood-seconds 60   # ~4 min

Goals (issue 36): the neighbours' gap p99 within 50 ms of quiet under the flood; resident memory
within 50 MB of its start after the abandoned downloads.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import pathlib
import tempfile
import threading
import time

import grpc
import numpy as np
from bench_record import RESULTS, cdf_ms, machine, percentiles, random_codes, versions, write_record
from bench_servers import ServerProcess, split_cores
from codecstream.protocol.decoding import FRAMES_PER_SECOND
from codecstream.server.limits import ServerLimits
from codecstream.v1 import synthesis_pb2 as pb
from download_clients import (
    REAL_ARTIFACT_BYTES,
    abandon_all_at_once,
    abandon_one_at_a_time,
    bearer,
    flood,
    random_artifact,
)
from hostile_load_bench import (
    MEAN_FRAMES,
    deploy_config,
    in_own_process,
    loop_lag,
    normal_streams_beside,
    probe_health,
    tone,
    wav,
)

#: Samples of the server's /metrics this benchmark reads.
METRICS = (
    "codecstream_event_loop_lag_seconds",
    "codecstream_event_loop_stalls",
    "codecstream_stalled_clients",
    "codecstream_gc_pause_seconds",
    "codecstream_requests_rejected",
    "codecstream_streams_ended",
    "codecstream_streams_active",
    "codecstream_decoder_artifact",
)
WARM_UP_REFUSALS = 50
#: The engine server of part "hostile" checks bearer tokens, so every neighbour stream and the
#: attacker are clients of their own, each with its own per-client limits, as clients on other
#: machines are (one client may hold only half the engine's request slots).
HOSTILE_TOKEN = "hostile"
HOSTILE_METADATA = bearer(HOSTILE_TOKEN)


def neighbour_token(index: int) -> str:
    return f"neighbour-{index}"


def neighbour_metadata(index: int) -> tuple:
    return bearer(neighbour_token(index))


#: Pause between hostile actions of one kind (the mix runs several kinds at once).
HOSTILE_PAUSE_S = 0.2


def refused_requests() -> list[tuple[str, bytes]]:
    """(kind, serialized SynthesizeRequest) of 3-8.5 MB, each refused before a Header."""
    limits = ServerLimits()
    garbage = np.random.default_rng(0).bytes(limits.max_reference_audio_bytes)
    short = wav(tone(2, 24_000), 24_000)

    def clone(audio: bytes, transcript: str) -> bytes:
        reference = pb.ReferenceAudio(audio=audio, transcript=transcript)
        start = pb.Start(text="Hi.", task_type=pb.TASK_TYPE_BASE, reference_audio=reference)
        return pb.SynthesizeRequest(start=start).SerializeToString()

    # Field 99 is unknown to the contract: a length-delimited field of 8 MB (tag 99 << 3 | 2 = 794).
    unknown = b"\x9a\x06" + _varint(len(garbage)) + garbage
    cancel = pb.SynthesizeRequest(cancel=pb.Cancel()).SerializeToString() + unknown
    return [
        ("garbage reference audio (8 MB)", clone(garbage, "A reference.")),
        ("transcript of 3 MB", clone(short, "r" * 3_000_000)),
        ("first-message Cancel with 8 MB of unknown fields", cancel),
    ]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def raw_synthesize(channel):
    return channel.stream_stream(
        "/codecstream.v1.SynthesisService/Synthesize",
        request_serializer=lambda data: data,
        response_deserializer=pb.SynthesizeResponse.FromString,
    )


def send_refused(target: str, count: int, queue) -> None:
    """`count` refused requests, one after another; puts {kind: {status: n}}."""
    requests = refused_requests()
    outcomes: dict[str, dict[str, int]] = {kind: {} for kind, _ in requests}

    async def run() -> None:
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            synthesize = raw_synthesize(channel)
            for index in range(count):
                kind, message = requests[index % len(requests)]
                try:
                    async for _ in synthesize(iter([message]), timeout=60):
                        pass
                    status = "OK"
                except grpc.aio.AioRpcError as error:
                    status = error.code().name
                outcomes[kind][status] = outcomes[kind].get(status, 0) + 1

    asyncio.run(run())
    queue.put(outcomes)


def rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class RssSampler:
    """The server process's resident memory every `period_s`, in a thread, as (seconds, MB)."""

    def __init__(self, pid: int, period_s: float = 1.0) -> None:
        self.pid, self.period_s = pid, period_s
        self.samples: list[tuple[float, float]] = []
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((round(time.monotonic() - self._started, 2), round(rss_mb(self.pid), 1)))
            self._stop.wait(self.period_s)

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        self._thread.join()
        return self.samples


def refused_part(server: ServerProcess, count: int) -> dict:
    process, queue = in_own_process(send_refused, server.target, WARM_UP_REFUSALS)
    queue.get(timeout=600)
    process.join(60)
    time.sleep(2)
    before = rss_mb(server.process.pid)
    sampler = RssSampler(server.process.pid)
    started, cpu_before = time.monotonic(), server.cpu_seconds()
    metrics_before = server.metrics(METRICS)
    process, queue = in_own_process(send_refused, server.target, count)
    outcomes = queue.get(timeout=3600)
    process.join(60)
    seconds = time.monotonic() - started
    time.sleep(2)
    after = rss_mb(server.process.pid)
    samples = sampler.stop()
    metrics_after = server.metrics(METRICS)
    return {
        "refused": count,
        "seconds": round(seconds, 1),
        "server_cpu_s": round(server.cpu_seconds() - cpu_before, 1),
        "server_counters": counted(metrics_before, metrics_after),
        "outcomes": outcomes,
        "rss_mb_after_warm_up": round(before, 1),
        "rss_mb_after": round(after, 1),
        "rss_growth_mb": round(after - before, 1),
        "rss_mb_max": max(mb for _, mb in samples),
        "rss_mb_series": samples,
        "server_loop_lag": loop_lag(metrics_before, metrics_after),
        "gc_pauses": gc_pauses(metrics_before, metrics_after),
    }


def counted(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counters that grew during a part (refusals by status, ends by reason, stalled clients)."""
    return {
        key: after[key] - before.get(key, 0) for key in after if "_total" in key and after[key] != before.get(key, 0)
    }


def gc_pauses(before: dict[str, float], after: dict[str, float]) -> dict:
    """Collections during a part, by generation: how many, and how many took over 0.1 s / 1 s."""
    found = {}
    for generation in ("0", "1", "2"):
        count_key = f'codecstream_gc_pause_seconds_count{{generation="{generation}"}}'
        count = after.get(count_key, 0) - before.get(count_key, 0)
        sum_key = f'codecstream_gc_pause_seconds_sum{{generation="{generation}"}}'
        over = {}
        for bound in ("0.1", "1.0"):
            key = f'codecstream_gc_pause_seconds_bucket{{generation="{generation}",le="{bound}"}}'
            over[f"over_{float(bound) * 1000:g}_ms"] = count - (after.get(key, 0) - before.get(key, 0))
        found[generation] = {
            "collections": count,
            "total_ms": round((after.get(sum_key, 0) - before.get(sum_key, 0)) * 1000, 1),
            **over,
        }
    return found


# -- the hostile mix -------------------------------------------------------------------------


async def hostile_mix(target: str, until: float, outcomes: dict[str, dict[str, int]], only: str | None = None) -> None:
    """Every hostile kind at once (`only`: that kind alone) until `until`; outcomes by kind and status."""
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]

    def count(kind: str, status: str) -> None:
        outcomes.setdefault(kind, {})
        outcomes[kind][status] = outcomes[kind].get(status, 0) + 1

    async def one_call(synthesize, kind: str, messages) -> None:
        try:
            status = "OK"
            async for response in synthesize(messages, timeout=180, metadata=HOSTILE_METADATA):
                if response.HasField("end"):
                    status = f"End {pb.EndReason.Name(response.end.reason)}"
        except grpc.aio.AioRpcError as error:
            status = error.code().name
        count(kind, status)

    def streaming_start() -> bytes:
        return pb.SynthesizeRequest(
            start=pb.Start(text="Hello.", voice="ryan", streaming_text=True)
        ).SerializeToString()

    def text_input(text: str = "", flush: bool = False, end: bool = False) -> bytes:
        return pb.SynthesizeRequest(text=pb.TextInput(text=text, flush=flush, end_of_input=end)).SerializeToString()

    async def renewals(pieces: list[str], every_s: float):
        yield streaming_start()
        while time.monotonic() < until:
            for piece in pieces:
                await asyncio.sleep(every_s)
                yield text_input(piece)

    async def flood():
        yield streaming_start()
        message = text_input(flush=True)
        while time.monotonic() < until:
            for _ in range(100):
                yield message
            await asyncio.sleep(0)
        yield text_input(end=True)

    async def half_close():
        yield streaming_start()

    async def oversize_after_header():
        yield streaming_start()
        await asyncio.sleep(0.5)
        yield text_input("x" * 9_000_000)

    async def loop(kind: str, make_messages, pause_s: float = HOSTILE_PAUSE_S) -> None:
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            synthesize = raw_synthesize(channel)
            while time.monotonic() < until:
                await one_call(synthesize, kind, make_messages())
                await asyncio.sleep(pause_s)

    refused = itertools.cycle(message for _, message in refused_requests())
    # kind -> (messages of one call, pause between calls, calls at once)
    mix = {
        "refused 3-8.5 MB request": (lambda: iter([next(refused)]), HOSTILE_PAUSE_S, 1),
        "kept open with spaces": (lambda: renewals([" "], 5.0), HOSTILE_PAUSE_S, 4),
        "kept open with zero-width spaces": (lambda: renewals(["\u200b"], 5.0), HOSTILE_PAUSE_S, 4),
        "flood of empty flushes": (flood, HOSTILE_PAUSE_S, 1),
        "half-closed without end_of_input": (half_close, 1.0, 1),
        "TextInput over the message limit after the Header": (oversize_after_header, 1.0, 1),
    }
    await asyncio.gather(
        *(
            loop(kind, make, pause_s)
            for kind, (make, pause_s, copies) in mix.items()
            if only is None or kind == only
            for _ in range(copies)
        )
    )


def send_hostile_mix(target: str, seconds: float, queue, only: str | None = None) -> None:
    # The attacker shares the clients' core with the neighbours' own process: at the lowest
    # priority its sending (a flood keeps a core busy) does not delay when they read their frames.
    os.nice(19)
    outcomes: dict[str, dict[str, int]] = {}
    asyncio.run(hostile_mix(target, time.monotonic() + seconds, outcomes, only))
    queue.put(outcomes)


def send_hostile_kind(target: str, seconds: float, only: str, queue) -> None:
    send_hostile_mix(target, seconds, queue, only)


HOSTILE_KINDS = (
    "refused 3-8.5 MB request",
    "kept open with spaces",
    "kept open with zero-width spaces",
    "flood of empty flushes",
    "half-closed without end_of_input",
    "TextInput over the message limit after the Header",
)


def cost_part(server: ServerProcess, seconds: float) -> dict:
    """What each hostile kind alone costs the server process: its CPU, per second of the attack."""
    costs = {}
    idle_before = server.cpu_seconds()
    time.sleep(seconds / 2)
    costs["nothing (idle)"] = {"server_cpu_per_s": round((server.cpu_seconds() - idle_before) / (seconds / 2), 4)}
    for kind in HOSTILE_KINDS:
        before = server.cpu_seconds()
        process, queue = in_own_process(send_hostile_kind, server.target, seconds, kind)
        outcomes = queue.get(timeout=seconds + 600)
        process.join(120)
        costs[kind] = {
            "server_cpu_per_s": round((server.cpu_seconds() - before) / seconds, 4),
            "outcomes": outcomes.get(kind, {}),
        }
        # The per-client message budget the flood spent refills before the next kind.
        time.sleep(ServerLimits().control_message_burst / ServerLimits().control_messages_per_s)
    return costs


def hostile_part(server: ServerProcess, args, seconds: float, attacker: tuple | None) -> dict:
    """The neighbours and a health prober for `seconds`, beside `attacker` (a function and its
    arguments, run in_own_process; None: quiet)."""
    metrics_before, cpu_before = server.metrics(METRICS), server.cpu_seconds()
    sampler = RssSampler(server.process.pid, period_s=5.0)
    helpers = [in_own_process(probe_health, server.target, seconds)]
    if attacker:
        helpers.append(in_own_process(*attacker))
    gaps, streams, (health, *rest) = normal_streams_beside(
        server.target, "custom_voice", args, seconds, helpers, neighbour_metadata
    )
    samples = sampler.stop()
    metrics_after = server.metrics(METRICS)
    return {
        "seconds": seconds,
        "server_cpu_s": round(server.cpu_seconds() - cpu_before, 1),
        "server_counters": counted(metrics_before, metrics_after),
        "streams_run": int(sum(streams)),
        "frame_gap_ms": {k: v * 1000 for k, v in percentiles(gaps).items()},
        "health_latency_ms": {k: v * 1000 for k, v in percentiles(health).items()},
        "hostile_outcomes": rest[0] if rest else {},
        "rss_mb_start": samples[0][1],
        "rss_mb_end": samples[-1][1],
        "rss_mb_max": max(mb for _, mb in samples),
        "rss_mb_series": samples,
        "server_loop_lag": loop_lag(metrics_before, metrics_after),
        "gc_pauses": gc_pauses(metrics_before, metrics_after),
        "frame_gap_ms_cdf": cdf_ms(gaps),
    }


def plot(report: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(23, 4.8))
    for name, part in report["refused"].items():
        t, mb = zip(*part["rss_mb_series"], strict=True)
        axes[0].plot(t, mb, label=f"{name}: {part['rss_growth_mb']:+.0f} MB over {part['refused']}")
    axes[0].set_title("resident memory while refusing 3-8.5 MB requests")
    axes[0].set_xlabel("s")
    axes[0].set_ylabel("MB")
    hostile = report.get("hostile")
    if hostile:
        t, mb = zip(*hostile["hostile"]["rss_mb_series"], strict=True)
        axes[1].plot(np.asarray(t) / 60, mb)
        axes[1].set_title(f"engine resident memory, {hostile['hostile']['seconds'] / 60:g} min of hostile traffic")
        axes[1].set_xlabel("min")
        axes[1].set_ylabel("MB")
        for phase in ("quiet", "hostile"):
            values = hostile[phase]["frame_gap_ms_cdf"]
            if values:
                axes[2].plot(values, np.linspace(0, 1, len(values)), label=phase)
        axes[2].set_xscale("log")
        axes[2].set_title(f"{report['settings']['streams']} neighbours: gap between frames")
        axes[2].set_xlabel("ms")
        axes[2].set_ylabel("fraction")
        axes[2].legend()
    costs = report.get("cost_by_kind", {})
    if costs:
        names = list(costs)
        axes[3].barh(names, [costs[name]["server_cpu_per_s"] * 100 for name in names])
        axes[3].set_title("server CPU while each kind runs alone (replay)")
        axes[3].set_xlabel("% of a core")
        axes[3].tick_params(axis="y", labelsize=7)
    for axis in axes:
        axis.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"soak: refused requests and hostile traffic ({report['machine']['cpu']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- decoder downloads (issue 36) ------------------------------------------------------------

#: The neighbour whose own download is timed while the abandoned ones are held.
DOWNLOAD_NEIGHBOUR_TOKEN = "download-neighbour"


def downloader_tokens(count: int) -> list[str]:
    return [f"downloader-{index:03d}" for index in range(count)]


def log_lines(log: pathlib.Path) -> dict:
    """What a server's log says went wrong: ERROR lines, tracebacks, and the stall watchdog's lines."""
    lines = log.read_text().splitlines()
    return {
        "errors": [line[:300] for line in lines if " ERROR " in line][:20],
        "tracebacks": sum(1 for line in lines if line.startswith("Traceback")),
        "loop_stalls": [line[:600] for line in lines if " stalled " in line and "codecstream.server.app" in line][:20],
    }


def download_flood_part(server: ServerProcess, args, sha256: str) -> dict:
    """The neighbours alone, then beside `args.downloaders` clients each downloading the artifact
    again and again (issue 36: 100 readers of the real-size file)."""
    print(f"downloads: neighbours quiet for {args.quiet_seconds:g} s", flush=True)
    quiet = hostile_part(server, args, args.quiet_seconds, attacker=None)
    print(f"downloads: {args.downloaders} downloading clients for {args.flood_seconds:g} s", flush=True)
    attacker = (flood, server.target, sha256, downloader_tokens(args.downloaders), args.flood_seconds)
    flooded = hostile_part(server, args, args.flood_seconds, attacker=attacker)
    downloads = flooded.pop("hostile_outcomes")
    waiting, receiving = zip(*downloads.pop("waiting_receiving_each_0_5_s"), strict=True)
    flooded["downloads"] = {
        **downloads,
        "first_part_wait_s": percentiles(downloads["first_part_wait_s"]),
        "received_mb_per_s": round(downloads.pop("bytes") / 1e6 / args.flood_seconds, 1),
        "waiting_for_a_slot": {"mean": round(float(np.mean(waiting)), 1), "max": max(waiting)},
        "receiving": {"mean": round(float(np.mean(receiving)), 1), "max": max(receiving)},
    }
    return {"quiet": quiet, "flood": flooded}


def abandoned_part(server: ServerProcess, args, sha256: str) -> dict:
    """Downloads started, read for one part and abandoned: `args.abandoned` one after another per
    client (half disconnecting at once, half reading nothing for a second first), then as many at
    once, held past the stall timeout. The server's resident memory from its start to after all."""
    tokens = downloader_tokens(args.downloaders)
    per_client = max(1, args.abandoned // len(tokens))
    time.sleep(3)
    cold = rss_mb(server.process.pid)
    sampler = RssSampler(server.process.pid)
    # As for refusals: the server's working set (the threads that read parts, gRPC's buffers)
    # grows over its first downloads; growth is read from there, and from cold.
    process, queue = in_own_process(abandon_one_at_a_time, server.target, sha256, tokens[:10], 2, 1.0)
    warm_up = queue.get(timeout=600)
    process.join(60)
    time.sleep(2)
    start = rss_mb(server.process.pid)
    metrics_before = server.metrics(METRICS)
    print(f"downloads: {per_client * len(tokens)} abandoned one after another per client", flush=True)
    process, queue = in_own_process(abandon_one_at_a_time, server.target, sha256, tokens, per_client, 1.0)
    one_at_a_time = queue.get(timeout=3600)
    process.join(60)
    one_at_a_time["rss_mb_after"] = round(rss_mb(server.process.pid), 1)
    hold_s = ServerLimits().stalled_client_timeout_s + 10
    print(f"downloads: {per_client * len(tokens)} at once, held {hold_s:g} s", flush=True)
    process, queue = in_own_process(
        abandon_all_at_once, server.target, sha256, tokens, per_client, hold_s, DOWNLOAD_NEIGHBOUR_TOKEN
    )
    all_at_once = queue.get(timeout=hold_s + 600)
    process.join(60)
    all_at_once["rss_mb_at_its_end"] = round(rss_mb(server.process.pid), 1)
    running = "codecstream_decoder_artifact_downloads_running"
    deadline = time.monotonic() + 60
    while server.metrics(METRICS).get(running, 0) and time.monotonic() < deadline:
        time.sleep(1)
    time.sleep(5)  # what a dropped call frees, gRPC frees on its next turns
    end = rss_mb(server.process.pid)
    samples = sampler.stop()
    metrics_after = server.metrics(METRICS)
    return {
        "downloads_per_client": per_client,
        "one_at_a_time": one_at_a_time,
        "all_at_once": all_at_once,
        "downloads_running_after": metrics_after.get(running, 0),
        "server_counters": counted(metrics_before, metrics_after),
        "warm_up": warm_up,
        "rss_mb_cold": round(cold, 1),
        "rss_mb_after_warm_up": round(start, 1),
        "rss_mb_end": round(end, 1),
        "rss_growth_mb": round(end - start, 1),
        "rss_growth_mb_from_cold": round(end - cold, 1),
        "rss_mb_max": max(mb for _, mb in samples),
        "rss_mb_series": samples,
        "server_loop_lag": loop_lag(metrics_before, metrics_after),
    }


def downloads(args, folder: pathlib.Path, plain: pathlib.Path, server_cpus: set[int]) -> dict:
    """Part "downloads": a replay server (its frames paced at 12.5/s) offering an artifact of
    `args.artifact_mb` random bytes, checking tokens: the flood, then on a fresh server the
    abandoned downloads."""
    from codecstream.server.replay import UNKNOWN_DECODER_DIGEST  # what replay without a checkpoint announces

    directory, sha256 = random_artifact(folder, int(args.artifact_mb * 1e6), UNKNOWN_DECODER_DIGEST)
    tokens = folder / "download-tokens"
    names = [neighbour_token(i) for i in range(args.streams)] + downloader_tokens(args.downloaders)
    tokens.write_text("".join(f"{name}\n" for name in [*names, DOWNLOAD_NEIGHBOUR_TOKEN]))
    flags = ["--replay", str(plain), "--replay-fps", str(FRAMES_PER_SECOND), "--decoder-artifact", str(directory)]
    flags += ["--auth-token-file", str(tokens)]
    report = {"artifact_bytes": int(args.artifact_mb * 1e6), "limits": download_limits()}
    for name, part in (("flood", download_flood_part), ("abandoned", abandoned_part)):
        log = folder / f"downloads-{name}.log"
        server = ServerProcess(flags, log=log, cpus=server_cpus)
        try:
            report[name] = part(server, args, sha256)
        finally:
            server.close()
            report[name]["server_log"] = log_lines(log)
    return report


def download_limits() -> dict:
    limits = ServerLimits()
    names = ("max_downloads_per_client", "max_concurrent_downloads", "stalled_client_timeout_s")
    return {name: getattr(limits, name) for name in names}


def plot_downloads(report: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    part = report["downloads"]
    fig, (gaps, memory) = plt.subplots(1, 2, figsize=(13, 4.8))
    for phase in ("quiet", "flood"):
        values = part["flood"][phase]["frame_gap_ms_cdf"]
        if values:
            gaps.plot(values, np.linspace(0, 1, len(values)), label=phase)
    gaps.set_xscale("log")
    gaps.set_xlabel("ms")
    gaps.set_ylabel("fraction")
    gaps.set_title(
        f"{report['settings']['streams']} neighbours' gap between frames, "
        f"quiet vs {report['settings']['downloaders']} clients downloading"
    )
    gaps.legend()
    abandoned = part["abandoned"]
    t, mb = zip(*abandoned["rss_mb_series"], strict=True)
    memory.plot(t, mb)
    memory.axhline(abandoned["rss_mb_after_warm_up"] + 50, color="gray", linestyle="--", label="after warm-up + 50 MB")
    count = abandoned["downloads_per_client"] * report["settings"]["downloaders"]
    warm, cold = abandoned["rss_growth_mb"], abandoned["rss_growth_mb_from_cold"]
    memory.set_title(
        f"server memory: {count} downloads abandoned in turn, {count} at once\n"
        f"({warm:+.0f} MB from after the warm-up, {cold:+.0f} MB from cold)",
        fontsize=10,
    )
    memory.set_xlabel("s")
    memory.set_ylabel("MB")
    memory.legend()
    for axis in (gaps, memory):
        axis.grid(True, alpha=0.3)
    size_mb = part["artifact_bytes"] / 1e6
    fig.suptitle(f"decoder downloads of a {size_mb:.0f} MB artifact, replay server ({report['machine']['cpu']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--refused", type=int, default=2000, help="refused requests per server")
    parser.add_argument("--minutes", type=float, default=20.0, help="length of the hostile traffic")
    parser.add_argument("--quiet-seconds", type=float, default=60.0, help="normal streams alone, before it")
    parser.add_argument("--streams", type=int, default=10, help="normal streams running at once")
    parser.add_argument("--kind-seconds", type=float, default=30.0, help="each hostile kind alone, on replay")
    parser.add_argument("--max-frames", type=int, default=200, help="frames per normal stream")
    parser.add_argument(
        "--downloads",
        action="store_true",
        help="instead: the decoder-download parts alone (a flood of readers, abandoned downloads)",
    )
    parser.add_argument("--artifact-mb", type=float, default=REAL_ARTIFACT_BYTES / 1e6, help="artifact size")
    parser.add_argument("--downloaders", type=int, default=100, help="downloading clients, one token each")
    parser.add_argument("--flood-seconds", type=float, default=60.0, help="length of the download flood")
    parser.add_argument("--abandoned", type=int, default=500, help="abandoned downloads, in each of two ways")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    args.out = args.out or RESULTS / ("soak_downloads.json" if args.downloads else "soak.json")
    server_cpus, client_cpus = split_cores()
    # The clients (normal, prober, hostile) run on cores of their own, as they would on other
    # machines: what the neighbours lose is then what the hostile traffic costs the server.
    os.sched_setaffinity(0, client_cpus)
    report = {
        "machine": machine(),
        "cores": {"server": sorted(server_cpus), "clients": sorted(client_cpus)},
        "versions": versions("grpcio", "vllm-omni", "protobuf"),
        "settings": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()},
        "refused": {},
    }
    with tempfile.TemporaryDirectory() as name:
        folder = pathlib.Path(name)
        from codecstream.protocol.codes_file import save_codes_file
        from codecstream.testing.random_checkpoint import write_qwen3_tts_checkpoint

        codes = random_codes(200, 0)
        save_codes_file(folder / "clone.npz", codes, reference_codes=codes[:4])
        plain = folder / "plain.npy"
        save_codes_file(plain, codes)
        if args.downloads:
            report["downloads"] = downloads(args, folder, plain, server_cpus)
            return finish_downloads(report, args)
        print("replay: the cost of each hostile kind", flush=True)
        replay = ServerProcess(["--replay", str(plain), "--replay-fps", str(FRAMES_PER_SECOND)], cpus=server_cpus)
        try:
            report["cost_by_kind"] = cost_part(replay, args.kind_seconds)
        finally:
            replay.close()
        if args.refused:
            print("replay: refusing", flush=True)
            replay = ServerProcess(["--replay", str(folder / "clone.npz")], log=folder / "replay.log", cpus=server_cpus)
            try:
                report["refused"]["replay"] = refused_part(replay, args.refused)
            finally:
                replay.close()
            print(f"  {report['refused']['replay']['rss_growth_mb']:+.1f} MB", flush=True)

        deploy = deploy_config(folder, args.streams + 4)
        tokens = folder / "tokens"
        tokens.write_text("".join(f"{neighbour_token(i)}\n" for i in range(args.streams)) + f"{HOSTILE_TOKEN}\n")
        for variant in ("base", "custom_voice") if args.refused else ("custom_voice",):
            checkpoint = write_qwen3_tts_checkpoint(
                folder / variant, preset="tiny", variant=variant, mean_frames=MEAN_FRAMES
            )
            print(f"engine ({variant}): starting", flush=True)
            log = folder / f"engine-{variant}.log"
            identities = ["--auth-token-file", str(tokens)] if variant == "custom_voice" else []
            engine = ServerProcess(
                ["--model", str(checkpoint), "--deploy-config", str(deploy), *identities], log=log, cpus=server_cpus
            )
            try:
                if variant == "base":
                    print("engine (base): refusing", flush=True)
                    report["refused"]["engine"] = part = refused_part(engine, args.refused)
                    print(f"  {part['rss_growth_mb']:+.1f} MB", flush=True)
                    continue
                print("engine (custom_voice): quiet", flush=True)
                quiet = hostile_part(engine, args, args.quiet_seconds, attacker=None)
                print(f"engine (custom_voice): hostile for {args.minutes:g} min", flush=True)
                mix = (send_hostile_mix, engine.target, args.minutes * 60)
                hostile = hostile_part(engine, args, args.minutes * 60, attacker=mix)
                report["hostile"] = {"quiet": quiet, "hostile": hostile}
            finally:
                engine.close()
                lines = log.read_text().splitlines()
                errors = [line[:300] for line in lines if " ERROR " in line]
                report.setdefault("engine_log_errors", {})[variant] = errors[:20]
                # The server's stall watchdog says, for each loop stall over 0.1 s, why and where.
                stalls = [line[:600] for line in lines if " stalled " in line and "codecstream.server.app" in line]
                report.setdefault("engine_loop_stalls", {})[variant] = stalls[:20]
    hostile = report["hostile"]
    rise = hostile["hostile"]["frame_gap_ms"]["p99"] - hostile["quiet"]["frame_gap_ms"]["p99"]
    stalls = hostile["hostile"]["server_loop_lag"].get("over_100_ms", 0)
    slow_collections = sum(g["over_100_ms"] for g in hostile["hostile"]["gc_pauses"].values())
    report["goals"] = {
        "rss_growth_mb_max": 50,
        "rss_growth_mb": {name: part["rss_growth_mb"] for name, part in report["refused"].items()},
        "freeze_ms_max": 100,
        "loop_stalls_over_100_ms": stalls,
        "collections_over_100_ms": slow_collections,
        "neighbour_gap_p99_rise_ms": round(rise, 1),
        "met": all(part["rss_growth_mb"] <= 50 for part in report["refused"].values())
        and stalls == 0
        and slow_collections == 0
        and rise <= 50,
    }
    write_record(report, args.out, plot)
    print(json.dumps(report["goals"], indent=1))
    print(f"wrote {args.out}")
    return 0


def finish_downloads(report: dict, args) -> int:
    part = report["downloads"]
    flood, abandoned = part["flood"], part["abandoned"]
    rise = flood["flood"]["frame_gap_ms"]["p99"] - flood["quiet"]["frame_gap_ms"]["p99"]
    report["goals"] = {
        "neighbour_gap_p99_rise_ms_max": 50,
        "neighbour_gap_p99_rise_ms": round(rise, 1),
        "rss_growth_mb_max": 50,
        "rss_growth_mb_after_abandoned_downloads": abandoned["rss_growth_mb"],
        "rss_growth_mb_from_cold": abandoned["rss_growth_mb_from_cold"],
        "met": rise <= 50 and abandoned["rss_growth_mb"] <= 50,
    }
    write_record(report, args.out, plot_downloads)
    print(json.dumps(report["goals"], indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())

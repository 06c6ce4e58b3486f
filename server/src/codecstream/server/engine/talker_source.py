"""Codes from the real Qwen3-TTS talker: a `CodeSource` over vLLM-Omni's AsyncOmni.

This module is the engine's lifecycle: it creates the engine (in a thread: the event loop keeps
serving every other stream meanwhile), warms it up, checks its health and shuts it down. The
requests themselves are engine/talker_requests.py's, their prompts engine/talker_prompts.py's,
and a streamed text's growing request engine/growing_generation.py's. Requests arrive checked and
canonical (request_parsing.py): the voice and language are passed to the talker as they are.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import importlib.util
import logging
import os
import time
from pathlib import Path
from typing import Any

from codecstream.server.checkpoint_info import read_checkpoint_info, resolve_model_dir
from codecstream.server.engine import engine_process
from codecstream.server.engine.engine_cache import use_engine_cache
from codecstream.server.engine.engine_start import create_engine
from codecstream.server.engine.growing_generation import GrowingTalkerGeneration
from codecstream.server.engine.talker_prompts import TalkerPrompts
from codecstream.server.engine.talker_requests import ENGINE_DEAD, NOT_RUNNING, TalkerRequests
from codecstream.server.errors import SourceUnavailable
from codecstream.server.limits import ServerLimits
from codecstream.server.reference_audio import decode_reference_audio, silent_wav
from codecstream.server.request import SynthesisRequest, TaskType
from codecstream.server.source import CodeSource, Generation
from codecstream.server.text_input import StreamedText

log = logging.getLogger(__name__)

_WARM_UP_TEXT = "Warm up."


class VllmTalkerSource(CodeSource):
    """Serves requests with the Qwen3-TTS talker of one checkpoint, through vLLM-Omni.

    Constructing it checks the checkpoint and that the engine is installed (milliseconds: a busy
    port or a bad flag is reported before anything heavy is imported); `start()` loads the text
    tokenizer, creates the engine (tens of seconds) and warms it up under `limits`, the limits
    the server serves with; `close()` shuts it down; `start()` after `close()` restarts it."""

    def __init__(
        self,
        model: str,
        deploy_config: str | Path | None = None,
        grow_streamed_text: bool = True,
        engine_cache: Path | None = None,
        limits: ServerLimits | None = None,
        **engine_kwargs: Any,
    ) -> None:
        self.model_name = model
        #: Where the engine keeps what it compiles (engine_cache.py); None: the libraries' own places.
        self._engine_cache = engine_cache
        #: Seconds of each phase of the last start: "engine" (tokenizers and the engine, compile,
        #: graphs and warm-ups of vLLM's own), then each of codecstream's warm-up requests.
        self.start_timeline: dict[str, float] = {}
        # Streamed text as one growing request where the engine can hold one (start() asks it);
        # False keeps the segments (one request per sentence), for comparison.
        self._grow_streamed_text = grow_streamed_text
        self._limits = limits if limits is not None else ServerLimits()
        self._model_dir = resolve_model_dir(model)
        self.checkpoint = read_checkpoint_info(self._model_dir)
        if importlib.util.find_spec("vllm_omni") is None:  # looked up, not imported (that takes seconds)
            raise ImportError("No module named 'vllm_omni'")
        self.codec = self.checkpoint.codec
        self.offering = self.checkpoint.offering()
        self._deploy_config = deploy_config
        self._engine_kwargs = engine_kwargs
        #: Prompt builders for the prompt thread and the event loop (loaded by start()).
        self._prompts: tuple[TalkerPrompts, TalkerPrompts] | None = None
        # Whole-text prompts are built off the event loop, one at a time.
        self._prompt_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="prompt")
        self._engine: Any | None = None
        self._requests: TalkerRequests | None = None

    async def start(self) -> None:
        """Create the engine (in a thread; the loop keeps serving) and run short requests, so the
        first client does not pay the engine's first-request costs (seconds on a CPU)."""
        if self._engine is not None:
            return
        began = time.monotonic()
        engine = await create_engine(self._create_engine, lambda started: started.shutdown())
        self.start_timeline = {"engine": time.monotonic() - began}
        self._engine = engine
        thread_prompts, loop_prompts = self._prompts
        self._requests = TalkerRequests(engine, self._prompt_thread, thread_prompts, loop_prompts)
        self.engine_slots = self._requests.slots
        can_grow = await self._requests.workers.can_feed_text() and self.checkpoint.task_type is not TaskType.BASE
        if self._grow_streamed_text and not can_grow:
            log.warning(
                "the engine cannot hold a growing request (its worker is not in its scheduler's process); "
                "streamed text is spoken in segments"
            )
        self.grows_streamed_text = self._grow_streamed_text and can_grow
        try:
            for phase, request in self._warm_ups():
                began = time.monotonic()
                stream_id = f"codecstream-{phase.replace('_', '-')}"
                if request.streamed_text is not None:
                    generation = await self.open_streamed(request, stream_id, self._limits)
                else:
                    generation = await self.open(request, stream_id)
                async for _ in generation:
                    pass
                self.start_timeline[phase] = time.monotonic() - began
        except BaseException:
            await self.close()
            raise
        log.info(
            "engine started in %.1f s (%s)",
            sum(self.start_timeline.values()),
            ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds in self.start_timeline.items()),
        )

    def _create_engine(self) -> Any:
        # The engine's environment first: a forkserver (engine_process.py) begins its imports
        # with it, beside this process's own imports below.
        set_engine_environment()
        if self._engine_cache is not None:
            use_engine_cache(self._engine_cache)
        engine_process.start_forkserver()
        # vLLM-Omni loads general plugins in its worker processes, but in the calling process only
        # after it has resolved the deploy YAML's `pipeline:`; load them first so that the
        # talker-only pipeline is registered by then.
        from codecstream.server.engine.deploy_config import default_deploy_config
        from transformers import AutoTokenizer
        from vllm_omni import AsyncOmni
        from vllm_omni.plugins import load_omni_general_plugins

        if self._prompts is None:
            # One tokenizer for the prompt thread, one for the event loop (growing requests).
            thread_tokenizer = AutoTokenizer.from_pretrained(str(self._model_dir))
            loop_tokenizer = AutoTokenizer.from_pretrained(str(self._model_dir))
            self._prompts = (
                TalkerPrompts(thread_tokenizer, self.checkpoint),
                TalkerPrompts(loop_tokenizer, self.checkpoint),
            )
        load_omni_general_plugins()
        engine_process.use_forkserver_for_engines()
        deploy = Path(self._deploy_config) if self._deploy_config is not None else default_deploy_config()
        return AsyncOmni(model=str(self._model_dir), deploy_config=str(deploy), **self._engine_kwargs)

    async def check_health(self) -> None:
        if self._engine is None:
            raise SourceUnavailable(NOT_RUNNING)
        try:
            await self._engine.check_health()
        except Exception as error:
            raise SourceUnavailable(ENGINE_DEAD) from error

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        requests, self._requests = self._requests, None
        if requests is not None:
            requests.close()
        if engine is not None:
            await asyncio.to_thread(engine.shutdown)

    async def live_requests(self) -> int:
        """Requests the engine still holds: the larger of the front end's own request table and the
        requests whose state the engine's model runner holds (asked of the worker processes)."""
        if self._engine is None:
            return 0
        return max(len(self._engine.request_states), await self._running().workers.runner_requests())

    def _warm_ups(self) -> list[tuple[str, SynthesisRequest]]:
        """One short request down each path a first request may take, so that none pays a
        first-use cost (a kernel compiled on first use stalls every stream's step): a seeded and
        an unseeded whole text (vLLM samples them with different kernels on CUDA) and a streamed
        text on a growing request; each as the configured limits allow it."""
        request = self._warm_up_request()
        warm_ups = [("warm_up_seeded", request)]
        if self.checkpoint.task_type is TaskType.BASE:
            return warm_ups  # each warm-up encodes a reference audio; seeded is what Base serves alike
        warm_ups.append(("warm_up_unseeded", dataclasses.replace(request, seed=None)))
        if self.grows_streamed_text:
            text = StreamedText("", self._limits)
            text.push(_WARM_UP_TEXT, flush=False, end_of_input=True)
            warm_ups.append(("warm_up_streamed", dataclasses.replace(request, text="", streamed_text=text)))
        return warm_ups

    def _warm_up_request(self) -> SynthesisRequest:
        task = self.checkpoint.task_type
        if task is TaskType.CUSTOM_VOICE:
            return SynthesisRequest(text=_WARM_UP_TEXT, voice=self.offering.default_voice, seed=0, max_frames=2)
        if task is TaskType.VOICE_DESIGN:
            return SynthesisRequest(
                text=_WARM_UP_TEXT, task_type=task, instructions="A calm voice.", seed=0, max_frames=2
            )
        # The shortest reference the limits accept: the warm-up is a request they must admit.
        audio = silent_wav(seconds=self._limits.min_reference_audio_s)
        return SynthesisRequest(
            text=_WARM_UP_TEXT,
            task_type=task,
            reference=decode_reference_audio(audio, self._limits),
            reference_text=_WARM_UP_TEXT,
            seed=0,
            max_frames=2,
        )

    # -- requests ----------------------------------------------------------------------------

    async def open(self, request: SynthesisRequest, stream_id: str) -> Generation:
        return await self._running().open(request, stream_id)

    async def open_streamed(self, request: SynthesisRequest, stream_id: str, limits: ServerLimits) -> Generation:
        requests = self._running()
        return GrowingTalkerGeneration(requests, request, stream_id, limits, requests.max_frames_growing(request))

    async def growing_requests_opened(self) -> int:
        """Growing requests the engine opened since it started (counted by the engine)."""
        return await self._running().workers.growing_requests_opened()

    async def decode_only_steps(self) -> int:
        """Steps the engine prepared on codecstream's decode-only path since it started (decode_step.py)."""
        return await self._running().workers.decode_only_steps()

    async def profile_steps(self, seconds: float, trace_path: Path) -> None:
        """Record the talker worker's CPU ops and GPU kernels for `seconds` of whatever it is running
        and write them as a Chrome trace to `trace_path` (the worker runs on this host)."""
        workers = self._running().workers
        await workers.start_profile()
        try:
            await asyncio.sleep(seconds)
        finally:
            await workers.stop_profile(str(trace_path))

    def _running(self) -> TalkerRequests:
        if self._requests is None:
            raise SourceUnavailable(NOT_RUNNING)
        return self._requests


def set_engine_environment() -> None:
    """The vLLM settings the engine needs, each left as it is where the operator set it."""
    # vLLM's CPU platform replaces the uniproc executor the deploy YAML asks for by the
    # multiproc one unless this is 0 (it wants OpenMP set up before torch starts threads,
    # which the stage's own fresh process does anyway). vLLM reads it only in its own
    # LLMEngine, which AsyncOmni does not use. Growing requests need the uniproc executor.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM samples top-k with FlashInfer's kernel, which FlashInfer compiles with nvcc at an
    # engine's first start: most of a cold start's profiling run (docs/server.md, "Start
    # timeline"). PyTorch's top-k over the talker's 3,072 codes is a few
    # small kernels a step (the 1.7B serving runs used it), and seeded requests use it anyway:
    # FlashInfer's sampler takes no per-request generators.
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")

"""Codes from the real Qwen3-TTS talker: a `CodeSource` over vLLM-Omni's AsyncOmni.

One request is one `AsyncOmni.generate` call on the talker-only pipeline. The engine yields one
output per decode step. Its `codes.audio` is the whole history so far: first a tensor with one
all-zero row per prompt position, then a list of per-step tensors that grows by one row of 16 codes
per step, and at the end the concatenation. A generation converts only the rows it has not seen
(per step work stays O(1), not O(frames so far)). The step that samples codec EOS
(CODEC_EOS_TOKEN_ID) adds no frame and ends the request.

Requests arrive checked and canonical (request_parsing.py): the voice and language are passed to
the talker as they are. Everything slow in a request (the prompt dict with the reference samples,
tokenizing the text to size the prompt) is built in a worker thread, and the engine itself is
created in one: the event loop keeps serving every other stream meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import dataclasses
import importlib.util
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
from codecstream.protocol.codes import validate_codes
from codecstream.protocol.decoding import NUM_CODEBOOKS, SAMPLE_RATE_HZ
from codecstream.protocol.errors import CodesError
from codecstream.server.checkpoint_info import read_checkpoint_info, resolve_model_dir
from codecstream.server.engine.engine_cache import use_engine_cache
from codecstream.server.engine.engine_start import create_engine
from codecstream.server.engine.growing_generation import GrowingTalkerGeneration
from codecstream.server.errors import GenerationFailed, Refusal, SourceUnavailable, invalid
from codecstream.server.limits import ServerLimits
from codecstream.server.reference_audio import silent_wav
from codecstream.server.request import SynthesisRequest, TaskType
from codecstream.server.source import (
    NO_CODES,
    CodeSource,
    Event,
    Finished,
    FinishReason,
    Frames,
    Generation,
)
from codecstream.server.text_input import StreamedText

log = logging.getLogger(__name__)

_TALKER_STAGE = 0
#: vLLM-Omni's prompt builder takes a request's assistant-turn ids under this key instead of its text.
PRECOMPUTED_TEXT_IDS = "_qwen3_tts_text_ids"
#: How long an abort may take before the generation stops waiting for the engine's acknowledgement.
_ABORT_TIMEOUT_S = 2.0
_ENGINE_DEAD = "the talker engine stopped (its worker failed or was killed); the server is restarting it"
#: vLLM's finish reasons, as the generation reports them.
_FINISH_REASONS = {"stop": FinishReason.EOS, "length": FinishReason.LENGTH, "abort": FinishReason.ABORTED}


class FrameCursor:
    """Where one request is in the engine's growing `codes.audio` history: each output's value
    gives only the frames not taken before, converting only those rows (a list value's older
    parts are never touched), and never the prompt's placeholder rows."""

    def __init__(self, prompt_rows: int) -> None:
        self._prompt_rows = prompt_rows
        #: Rows taken so far (prompt rows included), and how many list parts they fill (None
        #: after a concatenated tensor, until the next list is lined up with them).
        self._rows_seen = 0
        self._parts_seen: int | None = 0

    def advance(self, audio: Any) -> np.ndarray:
        rows_before = self._rows_seen
        rows = self._new_rows(audio)
        return rows[max(0, self._prompt_rows - rows_before) :]

    def _new_rows(self, audio: Any) -> np.ndarray:
        if audio is None:
            return NO_CODES
        if isinstance(audio, (list, tuple)):
            if self._parts_seen is None:
                self._parts_seen, covered = 0, 0
                while self._parts_seen < len(audio) and covered < self._rows_seen:
                    covered += _row_count(audio[self._parts_seen])
                    self._parts_seen += 1
            new_parts = audio[self._parts_seen :]
            self._parts_seen = len(audio)
            rows = np.concatenate([_as_frames(part) for part in new_parts]) if new_parts else NO_CODES
        else:
            rows = _as_frames(audio.reshape(-1, NUM_CODEBOOKS)[self._rows_seen :])
            self._parts_seen = None
        self._rows_seen += len(rows)
        return rows


class VllmTalkerGeneration(Generation):
    """The frames of one engine request, in order, as the engine steps."""

    def __init__(
        self,
        engine: Any,
        request_id: str,
        outputs: AsyncIterator[Any],
        first_output: Any,
        prompt_rows: int,
        max_frames: int,
        text_chars: int,
    ) -> None:
        reference = _codes_of(first_output).get("ref")
        has_reference = reference is not None and len(reference)
        super().__init__(max_frames, _as_frames(reference) if has_reference else NO_CODES)
        self._engine = engine
        self._request_id = request_id
        self._outputs = outputs
        self._first_output: Any | None = first_output
        self._cursor = FrameCursor(prompt_rows)
        self._text_chars = text_chars
        self._aborted = False
        self._finished = False

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        try:
            # Not kept once read: the first output holds the prompt's placeholder rows.
            output, self._first_output = self._first_output, None
            while output is not None:
                frames = self._cursor.advance(_codes_of(output).get("audio"))
                if output.finished:
                    self._finished = True
                    if len(frames) and not frames[-1].any():
                        # An EOS step that carries a placeholder row (codebook 0 mapped to 0) is not a frame.
                        frames = frames[:-1]
                if len(frames):
                    yield Frames(frames, 0, self._text_chars)
                if output.finished:
                    yield Finished(self._finish_reason(output.outputs[0].finish_reason))
                    return
                output = await anext(self._outputs, None)
            if not self._aborted:
                raise GenerationFailed("the engine ended the request without finishing it")
            yield Finished(FinishReason.ABORTED)
        except GenerationFailed:
            raise
        except Exception as error:
            raise _failure(error) from None
        finally:
            if not self._finished:
                await self.abort()
            try:
                await self._outputs.aclose()
            except Exception as error:  # another task may still be inside the generator
                log.debug("request %s: closing its output stream failed: %s", self._request_id, _one_line(error))

    def _finish_reason(self, engine_reason: str) -> FinishReason:
        if self._aborted:
            return FinishReason.ABORTED
        if engine_reason not in _FINISH_REASONS:
            raise GenerationFailed(f"the engine finished the request with reason {engine_reason!r}")
        return _FINISH_REASONS[engine_reason]

    async def abort(self) -> None:
        # The output generator may be suspended inside another task's `async for`; that task keeps
        # reading until the engine ends the request, passing on what the engine still generated.
        if self._aborted or self._finished:
            return
        self._aborted = True
        await _abort_request(self._engine, self._request_id, self._outputs)


async def _abort_request(engine: Any, request_id: str, outputs: Any) -> None:
    try:
        await asyncio.wait_for(engine.abort(request_id), _ABORT_TIMEOUT_S)
    except Exception as error:  # a dead engine has nothing left to abort
        log.info("request %s: abort failed: %s", request_id, error)
    if not outputs.ag_running:
        # Nobody is iterating: closing the generator lets AsyncOmni drop its request state now.
        try:
            await outputs.aclose()
        except Exception as error:
            log.debug("request %s: closing its output stream failed: %s", request_id, _one_line(error))


class VllmTalkerSource(CodeSource):
    """Serves requests with the Qwen3-TTS talker of one checkpoint, through vLLM-Omni.

    Constructing it checks the checkpoint and that the engine is installed (milliseconds: a busy
    port or a bad flag is reported before anything heavy is imported); `start()` loads the text
    tokenizer, creates the engine (tens of seconds) and warms it up; `close()` shuts it down;
    `start()` after `close()` restarts it."""

    def __init__(
        self,
        model: str,
        deploy_config: str | Path | None = None,
        grow_streamed_text: bool = True,
        engine_cache: Path | None = None,
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
        self._model_dir = resolve_model_dir(model)
        self.checkpoint = read_checkpoint_info(self._model_dir)
        if importlib.util.find_spec("vllm_omni") is None:  # looked up, not imported (that takes seconds)
            raise ImportError("No module named 'vllm_omni'")
        self.codec = self.checkpoint.codec
        self.offering = self.checkpoint.offering()
        self._deploy_config = deploy_config
        self._engine_kwargs = engine_kwargs
        # The same tokenizer the talker uses, to size the prompt placeholder exactly (loaded by start()).
        self._tokenizer: Any | None = None
        self._streaming_tokenizer: Any | None = None
        self._turn_head: list[int] = []
        self._turn_tail: list[int] = []
        # Prompts are built off the event loop, one at a time: a fast tokenizer used from two
        # threads at once can fail ("Already borrowed").
        self._prompt_builder = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="prompt")
        self._engine: Any | None = None
        self._max_model_len = 0
        self._default_sampling: Any | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the engine (in a thread; the loop keeps serving) and run one short request, so the
        first client does not pay the engine's first-request costs (seconds on a CPU)."""
        if self._engine is not None:
            return
        began = time.monotonic()
        engine = await create_engine(self._create_engine, lambda started: started.shutdown())
        self.start_timeline = {"engine": time.monotonic() - began}
        self._engine = engine
        stage = engine.engine.stage_configs[_TALKER_STAGE]
        self._max_model_len = stage.scheduler_config.max_model_len
        self.engine_slots = stage.scheduler_config.max_num_seqs
        self._default_sampling = engine.default_sampling_params_list[_TALKER_STAGE]
        feeding = await engine.collective_rpc("codecstream_text_feeding", stage_ids=[_TALKER_STAGE])
        can_grow = all(_flatten(feeding)) and self.checkpoint.task_type is not TaskType.BASE
        if self._grow_streamed_text and not can_grow:
            log.warning(
                "the engine cannot hold a growing request (its worker is not in its scheduler's process); "
                "streamed text is spoken in segments"
            )
        self.grows_streamed_text = self._grow_streamed_text and can_grow
        try:
            for phase, opening in self._warm_ups():
                began = time.monotonic()
                async for _ in await opening():
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
        # vLLM-Omni loads general plugins in its worker processes, but in the calling process only
        # after it has resolved the deploy YAML's `pipeline:`; load them first so that the
        # talker-only pipeline is registered by then.
        from codecstream.server.engine.deploy_config import default_deploy_config
        from transformers import AutoTokenizer
        from vllm_omni import AsyncOmni
        from vllm_omni.plugins import load_omni_general_plugins

        if self._tokenizer is None:
            self._tokenizer = AutoTokenizer.from_pretrained(str(self._model_dir))
            # The ids around a text in the talker's assistant turn: 3 before it, 5 after (the
            # prompt builder slices [3:-5]).
            turn = self._tokenizer("<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n", padding=False)
            self._turn_head, self._turn_tail = turn["input_ids"][:3], turn["input_ids"][3:]
            # A second instance for growing requests, used on the event loop only: a fast tokenizer
            # used from two threads at once fails ("Already borrowed"), and prompts are built in
            # the prompt thread.
            self._streaming_tokenizer = AutoTokenizer.from_pretrained(str(self._model_dir))
        load_omni_general_plugins()
        # vLLM's CPU platform replaces the uniproc executor the deploy YAML asks for by the
        # multiproc one unless this is 0 (it wants OpenMP set up before torch starts threads,
        # which the stage's own fresh process does anyway). vLLM reads it only in its own
        # LLMEngine, which AsyncOmni does not use. Growing requests need the uniproc executor.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if self._engine_cache is not None:
            use_engine_cache(self._engine_cache)
        deploy = Path(self._deploy_config) if self._deploy_config is not None else default_deploy_config()
        return AsyncOmni(model=str(self._model_dir), deploy_config=str(deploy), **self._engine_kwargs)

    async def check_health(self) -> None:
        if self._engine is None:
            raise SourceUnavailable("the talker engine is not running")
        try:
            await self._engine.check_health()
        except Exception as error:
            raise SourceUnavailable(_ENGINE_DEAD) from error

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.to_thread(engine.shutdown)

    async def live_requests(self) -> int:
        """Requests the engine still holds: the larger of the front end's own request table and the
        requests whose state the engine's model runner holds (asked of the worker processes)."""
        if self._engine is None:
            return 0
        front_end = len(self._engine.request_states)
        counts = await self._engine.collective_rpc("codecstream_runner_request_count", stage_ids=[_TALKER_STAGE])
        return max(front_end, sum(_flatten_ints(counts)))

    def _warm_ups(self) -> list[tuple[str, Any]]:
        """One short request down each path a first request may take, so that none pays a
        first-use cost (a kernel compiled on first use stalls every stream's step): a seeded and
        an unseeded whole text (vLLM samples them with different kernels on CUDA) and a streamed
        text on a growing request."""
        request = self._warm_up_request()
        warm_ups = [("warm_up_seeded", lambda: self.open(request, "codecstream-warm-up"))]
        if self.checkpoint.task_type is TaskType.BASE:
            return warm_ups  # each warm-up encodes a reference audio; seeded is what Base serves alike
        unseeded = dataclasses.replace(request, seed=None)
        warm_ups.append(("warm_up_unseeded", lambda: self.open(unseeded, "codecstream-warm-up-unseeded")))
        if self.grows_streamed_text:
            limits = ServerLimits()
            text = StreamedText("", limits)
            text.push("Warm up.", flush=False, end_of_input=True)
            streamed = dataclasses.replace(request, text="", streamed_text=text)
            warm_ups.append(
                ("warm_up_streamed", lambda: self.open_streamed(streamed, "codecstream-warm-up-streamed", limits))
            )
        return warm_ups

    def _warm_up_request(self) -> SynthesisRequest:
        task = self.checkpoint.task_type
        if task is TaskType.CUSTOM_VOICE:
            return SynthesisRequest(text="Warm up.", voice=self.offering.default_voice, seed=0, max_frames=2)
        if task is TaskType.VOICE_DESIGN:
            return SynthesisRequest(text="Warm up.", task_type=task, instructions="A calm voice.", seed=0, max_frames=2)
        from codecstream.server.reference_audio import decode_reference_audio

        reference = decode_reference_audio(silent_wav(seconds=1.0), ServerLimits())
        return SynthesisRequest(
            text="Warm up.", task_type=task, reference=reference, reference_text="Warm up.", seed=0, max_frames=2
        )

    # -- requests ----------------------------------------------------------------------------

    async def open(self, request: SynthesisRequest, stream_id: str) -> Generation:
        engine = self._running_engine()
        loop = asyncio.get_running_loop()
        information, prompt_rows = await loop.run_in_executor(self._prompt_builder, self._prompt, request)
        max_frames = self._frames_room(request, prompt_rows)
        prompt = {"prompt_token_ids": [1] * prompt_rows, "additional_information": information}
        return await self._start(engine, request, prompt, stream_id, prompt_rows, max_frames)

    async def open_streamed(self, request: SynthesisRequest, stream_id: str, limits: ServerLimits) -> Generation:
        self._running_engine()
        # The streaming-text prompt holds the first text token only: its length does not depend on the text.
        _, prompt_rows = self._growing_prompt(request, [])
        return GrowingTalkerGeneration(self, request, stream_id, limits, self._frames_room(request, prompt_rows))

    async def open_growing(
        self, request: SynthesisRequest, stream_id: str, text_ids: list[int], final: bool
    ) -> Generation:
        """The engine request of a growing generation, with the text ids committed so far (at least one)."""
        engine = self._running_engine()
        information, prompt_rows = self._growing_prompt(request, text_ids)
        max_frames = self._frames_room(request, prompt_rows)
        prompt = {"prompt_token_ids": [1] * prompt_rows, "additional_information": information}
        await self._worker_rpc("codecstream_text_open", stream_id, len(text_ids), final)
        try:
            return await self._start(engine, request, prompt, stream_id, prompt_rows, max_frames)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.close_growing(stream_id)
            raise

    async def feed_growing(self, stream_id: str, text_ids: list[int], final: bool) -> None:
        """More text ids for a growing request (and whether the input is complete)."""
        await self._worker_rpc("codecstream_text_feed", stream_id, text_ids, final)

    async def close_growing(self, stream_id: str) -> dict[str, int] | None:
        """Forget a growing request's text; the engine's counts for it (steps taken, schedules held)."""
        if self._engine is None:
            return None
        try:
            counts = [item for item in _flatten(await self._worker_rpc("codecstream_text_close", stream_id)) if item]
            return counts[0] if counts else None
        except Exception as error:  # the stream is over either way; the engine may keep its text
            log.warning("stream %s: the engine did not forget its growing text: %s", stream_id, _one_line(error))
        return None

    async def growing_requests_opened(self) -> int:
        """Growing requests the engine opened since it started (counted by the engine)."""
        return sum(_flatten_ints(await self._worker_rpc("codecstream_text_requests_opened")))

    async def profile_steps(self, seconds: float, trace_path: Path) -> None:
        """Record the talker worker's CPU ops and GPU kernels for `seconds` of whatever it is running
        and write them as a Chrome trace to `trace_path` (the worker runs on this host)."""
        await self._worker_rpc("codecstream_profile_start")
        try:
            await asyncio.sleep(seconds)
        finally:
            await self._worker_rpc("codecstream_profile_stop", str(trace_path))

    async def _worker_rpc(self, method: str, *args: Any) -> Any:
        """Call an `EngineIntrospection` method in the talker stage's worker processes."""
        engine = self._running_engine()
        return await engine.collective_rpc(method, args=args, stage_ids=[_TALKER_STAGE])

    @property
    def text_tokenizer(self) -> Any:
        """The text tokenizer for growing requests (event loop only)."""
        return self._streaming_tokenizer

    def _running_engine(self) -> Any:
        if self._engine is None:
            raise SourceUnavailable("the talker engine is not running")
        return self._engine

    def _frames_room(self, request: SynthesisRequest, prompt_rows: int) -> int:
        # vLLM refuses a prompt longer than its context, and stops generating at the context's end:
        # N frames need N + 1 sampled tokens after the prompt.
        room = self._max_model_len - prompt_rows - 1
        if room < 1:
            raise invalid(
                f"the prompt (text, instructions and reference) takes {prompt_rows} tokens; the engine's context "
                f"holds {self._max_model_len}, which leaves no room for audio"
            )
        return min(request.max_frames, room)

    async def _start(
        self, engine: Any, request: SynthesisRequest, prompt: dict, stream_id: str, prompt_rows: int, max_frames: int
    ) -> Generation:
        sampling = self._sampling_params(request, max_frames)
        outputs = engine.generate(prompt, request_id=stream_id, sampling_params_list=[sampling])
        try:
            # The first output: the request was accepted and prefilled; it carries the reference
            # codes the talker encoded (voice clone).
            first = await anext(outputs)
        except StopAsyncIteration:
            raise Refusal("UNAVAILABLE", "the engine ended the request before its first step") from None
        except BaseException as error:
            await _abort_request(engine, stream_id, outputs)
            if isinstance(error, Exception):
                raise _refusal(error) from None
            raise
        return VllmTalkerGeneration(engine, stream_id, outputs, first, prompt_rows, max_frames, len(request.text))

    def _growing_prompt(self, request: SynthesisRequest, text_ids: list[int]) -> tuple[dict[str, list], int]:
        """The prompt dict of a growing request: the streaming-text mode, its text given as ids
        (the assistant turn's, as the talker slices them: role line, text, end of turn)."""
        information: dict[str, list] = {
            "task_type": [request.task_type.value],
            "text": [request.text_so_far],
            "language": [request.language],
            "instruct": [request.instructions],
            "max_new_tokens": [request.max_frames],
            "non_streaming_mode": [False],
            PRECOMPUTED_TEXT_IDS: [[*self._turn_head, *text_ids, *self._turn_tail]],
        }
        if request.task_type is TaskType.CUSTOM_VOICE:
            information["speaker"] = [request.voice]
        sized = {**information, "text": ["x"]}  # the length needs only a non-empty text in this mode
        return information, self._prompt_length(sized, request.task_type, self._streaming_tokenizer)

    def _prompt(self, request: SynthesisRequest) -> tuple[dict[str, list], int]:
        """The prompt dict vLLM-Omni's Qwen3-TTS talker reads (as its OpenAI speech adapter builds
        it) and the number of positions it takes; runs in a worker thread."""
        information: dict[str, list] = {
            "task_type": [request.task_type.value],
            "text": [request.text],
            "language": [request.language],
            "instruct": [request.instructions],
            "max_new_tokens": [request.max_frames],
        }
        if request.task_type is TaskType.CUSTOM_VOICE:
            information["speaker"] = [request.voice]
        elif request.task_type is TaskType.BASE:
            information.update(_voice_clone(request))
        return information, self._prompt_length(information, request.task_type)

    def _prompt_length(self, information: dict[str, list], task_type: TaskType, tokenizer: Any = None) -> int:
        from vllm_omni.model_executor.models.qwen3_tts.prompt_embeds_builder import Qwen3TTSPromptEmbedsBuilder

        return Qwen3TTSPromptEmbedsBuilder.estimate_prompt_len_from_additional_information(
            additional_information=information,
            task_type=task_type.value,
            tokenize_prompt=lambda text: (tokenizer or self._tokenizer)(text, padding=False)["input_ids"],
            codec_language_id=self.checkpoint.languages,
            spk_is_dialect=self.checkpoint.voice_dialects,
        )

    def _sampling_params(self, request: SynthesisRequest, max_frames: int) -> Any:
        from vllm.sampling_params import RequestOutputKind

        params = copy.deepcopy(self._default_sampling)
        # The step that samples frame N+1 (or EOS) is the one that delivers frame N, so N frames
        # need N+1 sampled tokens; a length stop then means exactly max_frames frames.
        params.max_tokens = max_frames + 1
        params.min_tokens = min(params.min_tokens, params.max_tokens)
        params.output_kind = RequestOutputKind.DELTA
        overrides = request.sampling
        for name in ("temperature", "top_p", "top_k", "repetition_penalty"):
            value = getattr(overrides, name)
            if value is not None:
                setattr(params, name, value)
        if request.seed is not None:
            params.seed = request.seed
            # The code predictor (codebooks 1-15) samples with its own generator.
            params.extra_args = {**(params.extra_args or {}), "tts_local_seed": request.seed}
        return params


def _voice_clone(request: SynthesisRequest) -> dict[str, list]:
    reference = request.reference
    # With a transcript the talker clones in context (ICL): the reference codes become the
    # decoder's left context. Without one it clones from the speaker embedding only.
    in_context = bool(request.reference_text.strip())
    information: dict[str, list] = {
        "ref_audio": [[_inlined_array(reference.samples), SAMPLE_RATE_HZ]],
        "x_vector_only_mode": [not in_context],
        "ref_code_length": [reference.num_frames],
    }
    if in_context:
        information["ref_text"] = [request.reference_text]
    return information


def _refusal(error: Exception) -> Exception:
    """What the client is told when the engine refuses a request before its first step."""
    if _is_engine_dead(error):
        return SourceUnavailable(_ENGINE_DEAD)
    return invalid(f"the engine refused the request: {_one_line(error)}")


def _failure(error: Exception) -> GenerationFailed:
    if _is_engine_dead(error):
        return GenerationFailed(_ENGINE_DEAD)
    return GenerationFailed(f"the engine failed the request: {_one_line(error)}")


def _is_engine_dead(error: Exception) -> bool:
    return "EngineDead" in type(error).__name__


def _one_line(error: Exception, limit: int = 200) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text if len(text) <= limit else text[:limit] + "…"


def _inlined_array(samples: np.ndarray) -> dict:
    """Samples in the inlined-array form vLLM-Omni's Qwen3-TTS prompt builder reads: one bytes
    buffer on the way to the engine. A list of floats (what vLLM-Omni's speech API sends) is
    serialized float by float on the event loop (tens of ms for 30 s of audio); a bare ndarray
    does not survive the trip and takes the engine down."""
    return {"__ndarray__": True, "data": samples.astype("<f4").tobytes(), "dtype": "<f4", "shape": [samples.size]}


def _codes_of(output: Any) -> dict:
    multimodal = output.outputs[0].multimodal_output or {}
    return multimodal.get("codes") or {}


def _row_count(part: Any) -> int:
    size = part.numel() if hasattr(part, "numel") else np.asarray(part).size
    return int(size) // NUM_CODEBOOKS


def _as_frames(tensor: Any) -> np.ndarray:
    array = tensor.detach().cpu().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
    array = array.reshape(-1, NUM_CODEBOOKS)
    try:
        validate_codes(array)
    except CodesError as error:
        raise GenerationFailed(f"talker produced bad codes: {error}") from None
    return array.astype(np.int16)


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [item for part in value for item in _flatten(part)]
    return [value]


def _flatten_ints(value: Any) -> list[int]:
    if isinstance(value, (list, tuple)):
        return [item for part in value for item in _flatten_ints(part)]
    if isinstance(value, int):
        return [value]
    raise RuntimeError(f"engine returned {value!r} for its live request count")

"""Requests on one running talker engine: how each starts, the frames it yields, how it stops.

One request is one `AsyncOmni.generate` call on the talker-only pipeline, with the request's prompt
(engine/talker_prompts.py) and sampling; its outputs become frames (engine/talker_frames.py). The
step that samples codec EOS (CODEC_EOS_TOKEN_ID) adds no frame and ends the request. A growing
request (engine/growing_generation.py) is one whose text is fed to the engine's workers as it
arrives (engine/worker_rpc.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import logging
from collections.abc import AsyncIterator
from typing import Any

from codecstream.server.engine import repetition_penalty
from codecstream.server.engine.talker_frames import FrameCursor, as_frames, codes_of
from codecstream.server.engine.talker_prompts import TalkerPrompt, TalkerPrompts
from codecstream.server.engine.worker_rpc import TALKER_STAGE, TalkerWorkers
from codecstream.server.errors import GenerationFailed, Refusal, SourceUnavailable, invalid, one_line
from codecstream.server.request import SynthesisRequest
from codecstream.server.source import NO_CODES, Event, Finished, FinishReason, Frames, Generation

log = logging.getLogger(__name__)

#: How long an abort may take before the generation stops waiting for the engine's acknowledgement.
_ABORT_TIMEOUT_S = 2.0
NOT_RUNNING = "the talker engine is not running"
ENGINE_DEAD = "the talker engine stopped (its worker failed or was killed); the server is restarting it"
#: vLLM's finish reasons, as the generation reports them.
_FINISH_REASONS = {"stop": FinishReason.EOS, "length": FinishReason.LENGTH, "abort": FinishReason.ABORTED}
#: The sampling settings a request may override (SamplingOverrides), by their vLLM names.
OVERRIDABLE_SAMPLING = ("temperature", "top_p", "top_k", "repetition_penalty")


class TalkerRequests:
    """Opens requests on one running engine, whole texts and growing ones.

    The source makes one for each engine it starts and closes it with the engine: from then on
    every call is refused with SourceUnavailable, so a stream that outlived its engine is never
    sent to the next one. Whole-text prompts are built on `prompt_thread` (the tokenizer and a
    reference's samples take milliseconds), growing ones on the event loop, each with its own
    tokenizer (`TalkerPrompts`)."""

    def __init__(
        self,
        engine: Any,
        prompt_thread: concurrent.futures.Executor,
        thread_prompts: TalkerPrompts,
        loop_prompts: TalkerPrompts,
    ) -> None:
        self._engine = engine
        self.workers = TalkerWorkers(engine)
        self._prompt_thread = prompt_thread
        self._thread_prompts = thread_prompts
        self._loop_prompts = loop_prompts
        stage = engine.engine.stage_configs[TALKER_STAGE]
        #: Positions of the engine's context: prompt and frames together.
        self._max_model_len = stage.scheduler_config.max_model_len
        #: Requests the engine generates at once (vLLM's max_num_seqs).
        self.slots: int = stage.scheduler_config.max_num_seqs
        self._default_sampling = engine.default_sampling_params_list[TALKER_STAGE]
        self._closed = False

    def close(self) -> None:
        self._closed = True

    @property
    def text_tokenizer(self) -> Any:
        """The text tokenizer for growing requests (event loop only)."""
        return self._loop_prompts.tokenizer

    async def open(self, request: SynthesisRequest, stream_id: str) -> Generation:
        """A whole text's request, accepted and prefilled."""
        self._check_running()
        loop = asyncio.get_running_loop()
        prompt = await loop.run_in_executor(self._prompt_thread, self._thread_prompts.prompt, request)
        return await self._start(request, prompt, stream_id, self._frames_room(request, prompt.rows))

    def max_frames_growing(self, request: SynthesisRequest) -> int:
        """The frames a growing request can yield, known before its text (its Header's max_frames)."""
        self._check_running()
        # The streaming-text prompt holds the first text token only: its length does not depend on the text.
        return self._frames_room(request, self._loop_prompts.prompt(request, []).rows)

    async def open_growing(
        self, request: SynthesisRequest, stream_id: str, text_ids: list[int], final: bool
    ) -> Generation:
        """A growing request, with the text ids committed so far (at least one)."""
        self._check_running()
        prompt = self._loop_prompts.prompt(request, text_ids)
        max_frames = self._frames_room(request, prompt.rows)
        await self.workers.open_text(stream_id, len(text_ids), final)
        try:
            return await self._start(request, prompt, stream_id, max_frames)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.close_growing(stream_id)
            raise

    async def feed_growing(self, stream_id: str, text_ids: list[int], final: bool) -> None:
        """More text ids for a growing request (and whether the input is complete)."""
        self._check_running()
        await self.workers.feed_text(stream_id, text_ids, final)

    async def close_growing(self, stream_id: str) -> dict[str, int] | None:
        """Forget a growing request's text; the engine's counts for it (steps taken, schedules held)."""
        if self._closed:
            return None
        try:
            return await self.workers.close_text(stream_id)
        except Exception as error:  # the stream is over either way; the engine may keep its text
            log.warning("stream %s: the engine did not forget its growing text: %s", stream_id, one_line(error))
        return None

    def _check_running(self) -> None:
        if self._closed:
            raise SourceUnavailable(NOT_RUNNING)

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
        self, request: SynthesisRequest, prompt: TalkerPrompt, stream_id: str, max_frames: int
    ) -> Generation:
        sampling = self._sampling_params(request, max_frames)
        engine = self._engine
        outputs = engine.generate(prompt.engine_input(), request_id=stream_id, sampling_params_list=[sampling])
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
        return VllmTalkerGeneration(engine, stream_id, outputs, first, prompt.rows, max_frames, len(request.text))

    def _sampling_params(self, request: SynthesisRequest, max_frames: int) -> Any:
        from vllm.sampling_params import RequestOutputKind

        params = copy.deepcopy(self._default_sampling)
        # The step that samples frame N+1 (or EOS) is the one that delivers frame N, so N frames
        # need N+1 sampled tokens; a length stop then means exactly max_frames frames.
        params.max_tokens = max_frames + 1
        params.min_tokens = min(params.min_tokens, params.max_tokens)
        params.output_kind = RequestOutputKind.DELTA
        for name in OVERRIDABLE_SAMPLING:
            value = getattr(request.sampling, name)
            if value is not None:
                setattr(params, name, value)
        if request.seed is not None:
            params.seed = request.seed
            # The code predictor (codebooks 1-15) samples with its own generator.
            params.extra_args = {**(params.extra_args or {}), "tts_local_seed": request.seed}
        repetition_penalty.take_from_vllm(params)
        return params


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
        reference = codes_of(first_output).get("ref")
        has_reference = reference is not None and len(reference)
        super().__init__(max_frames, as_frames(reference) if has_reference else NO_CODES)
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
                frames = self._cursor.advance(codes_of(output).get("audio"))
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
                log.debug("request %s: closing its output stream failed: %s", self._request_id, one_line(error))

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
            log.debug("request %s: closing its output stream failed: %s", request_id, one_line(error))


def _refusal(error: Exception) -> Exception:
    """What the client is told when the engine refuses a request before its first step."""
    if _is_engine_dead(error):
        return SourceUnavailable(ENGINE_DEAD)
    return invalid(f"the engine refused the request: {one_line(error)}")


def _failure(error: Exception) -> GenerationFailed:
    if _is_engine_dead(error):
        return GenerationFailed(ENGINE_DEAD)
    return GenerationFailed(f"the engine failed the request: {one_line(error)}")


def _is_engine_dead(error: Exception) -> bool:
    return "EngineDead" in type(error).__name__

"""Codes from the real Qwen3-TTS talker: a `CodeSource` over vLLM-Omni's AsyncOmni.

One request is one `AsyncOmni.generate` call on the talker-only pipeline. The engine yields one
output per decode step; its `codes.audio` grows by one row of 16 codes per step (after a first
output that carries one all-zero row per prompt position), so a stream yields exactly the rows it
has not yielded before. The step that samples codec EOS (2150) adds no frame and ends the stream.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
from codecstream.server.engine.checkpoint_info import (
    AUTO_LANGUAGE,
    CheckpointInfo,
    read_checkpoint_info,
    resolve_model_dir,
)
from codecstream.server.engine.deploy_config import default_deploy_config
from codecstream.server.engine.reference_audio import ReferenceAudioError, decode_reference_audio, silent_wav
from codecstream.server.source import (
    CodeSource,
    CodeStream,
    RequestRejected,
    StopReason,
    SynthesisRequest,
    TaskType,
    VoiceInfo,
)

NUM_CODEBOOKS = 16
CODEBOOK_SIZE = 2048
#: Frames a request may generate when it does not say (about 2 min 44 s of audio).
DEFAULT_MAX_FRAMES = 2048
_TALKER_STAGE = 0


class VllmTalkerStream(CodeStream):
    """The frames of one engine request, in order, as the engine steps."""

    def __init__(self, engine: Any, request_id: str, prompt: dict, sampling_params: Any, prompt_rows: int) -> None:
        self._engine = engine
        self._request_id = request_id
        self._prompt_rows = prompt_rows
        self._outputs = engine.generate(prompt, request_id=request_id, sampling_params_list=[sampling_params])
        self._first_output: Any | None = None
        self._rows_seen = 0
        self._aborted = False

    async def read_reference_codes(self) -> None:
        """Wait for the prefill step and take the reference codes the talker encoded (voice clone)."""
        self._first_output = await self._outputs.__anext__()
        codes = _codes_of(self._first_output)
        reference = codes.get("ref")
        if reference is not None and len(reference):
            self.reference_codes = _as_frames(reference)

    def __aiter__(self) -> AsyncIterator[np.ndarray]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[np.ndarray]:
        try:
            if self._first_output is not None:
                first, self._first_output = self._first_output, None
                async for frames in self._new_frames(first):
                    yield frames
            async for output in self._outputs:
                if self._aborted:
                    break
                async for frames in self._new_frames(output):
                    yield frames
        finally:
            if self.stop_reason is None:
                await self.abort()
            await self._outputs.aclose()

    async def _new_frames(self, output: Any) -> AsyncIterator[np.ndarray]:
        rows = _rows_of(_codes_of(output).get("audio"))
        start = max(self._rows_seen, self._prompt_rows)
        self._rows_seen = max(self._rows_seen, len(rows))
        if len(rows) > start:
            frames = rows[start:]
            if output.finished and not frames[-1].any():
                # An EOS step that carries a placeholder row (codebook 0 mapped to 0) is not a frame.
                frames = frames[:-1]
            if len(frames):
                yield frames
        if output.finished:
            completion = output.outputs[0]
            self.stop_reason = StopReason.MAX_FRAMES if completion.finish_reason == "length" else StopReason.EOS

    async def abort(self) -> None:
        # The output generator may be suspended inside another task's `async for`; that task sees
        # `_aborted` (or the engine ending the request) and closes it.
        if self._aborted or self.stop_reason is not None:
            return
        self._aborted = True
        await self._engine.abort(self._request_id)
        if not self._outputs.ag_running:
            # Nobody is iterating: closing the generator lets AsyncOmni drop its request state now.
            await self._outputs.aclose()


class VllmTalkerSource(CodeSource):
    """Serves requests with the Qwen3-TTS talker of one checkpoint, through vLLM-Omni."""

    def __init__(self, engine: Any, checkpoint: CheckpointInfo, model_name: str) -> None:
        from transformers import AutoTokenizer

        self._engine = engine
        self.checkpoint = checkpoint
        self.codec = checkpoint.codec
        self.model_name = model_name
        self._default_sampling = engine.default_sampling_params_list[_TALKER_STAGE]
        # The same tokenizer the talker uses, to size the prompt placeholder exactly.
        self._tokenizer = AutoTokenizer.from_pretrained(str(checkpoint.path))

    @classmethod
    def create(cls, model: str, deploy_config: str | Path | None = None, **engine_kwargs: Any) -> VllmTalkerSource:
        """Start the engine for `model` (a checkpoint directory or hub id). Blocks while it loads."""
        # vLLM-Omni loads general plugins in its worker processes, but in the calling process only
        # after it has resolved the deploy YAML's `pipeline:`; load them first so that the
        # talker-only pipeline is registered by then.
        from vllm_omni import AsyncOmni
        from vllm_omni.plugins import load_omni_general_plugins

        load_omni_general_plugins()
        model_dir = resolve_model_dir(model)
        checkpoint = read_checkpoint_info(model_dir)
        deploy = Path(deploy_config) if deploy_config is not None else default_deploy_config()
        engine = AsyncOmni(model=str(model_dir), deploy_config=str(deploy), **engine_kwargs)
        return cls(engine, checkpoint, model_name=model)

    def voices(self) -> list[VoiceInfo]:
        languages = tuple(self.checkpoint.language_names())
        return [VoiceInfo(name, languages=languages) for name in sorted(self.checkpoint.voices)]

    def languages(self) -> list[str]:
        return self.checkpoint.language_names()

    def supported_task_types(self) -> list[TaskType]:
        return [self.checkpoint.task_type]

    async def open(self, request: SynthesisRequest, stream_id: str) -> CodeStream:
        information = self._additional_information(request)
        prompt_rows = self._prompt_length(information, request.task_type)
        prompt = {"prompt_token_ids": [1] * prompt_rows, "additional_information": information}
        stream = VllmTalkerStream(self._engine, stream_id, prompt, self._sampling_params(request), prompt_rows)
        if request.task_type is TaskType.BASE and request.reference_text:
            # The client needs the reference codes in the stream header, before any frame.
            try:
                await stream.read_reference_codes()
            except BaseException:
                await stream.abort()
                raise
        return stream

    async def start(self) -> None:
        """Run one short request, so the first client does not pay the engine's first-request costs
        (the worker loads the text tokenizer and runs its first kernels then: seconds on a CPU)."""
        stream = await self.open(self._warm_up_request(), "codecstream-warm-up")
        async for _ in stream:
            pass

    def _warm_up_request(self) -> SynthesisRequest:
        task = self.checkpoint.task_type
        if task is TaskType.CUSTOM_VOICE:
            return SynthesisRequest(text="Warm up.", voice=sorted(self.checkpoint.voices)[0], seed=0, max_frames=2)
        if task is TaskType.VOICE_DESIGN:
            return SynthesisRequest(text="Warm up.", task_type=task, instructions="A calm voice.", seed=0, max_frames=2)
        return SynthesisRequest(
            text="Warm up.",
            task_type=task,
            reference_audio=silent_wav(seconds=0.5),
            reference_text="Warm up.",
            seed=0,
            max_frames=2,
        )

    async def live_requests(self) -> int:
        """Requests the engine still holds: the larger of the front end's own request table and the
        requests whose state the engine's model runner holds (asked of the worker processes)."""
        front_end = len(self._engine.request_states)
        counts = await self._engine.collective_rpc("codecstream_runner_request_count", stage_ids=[_TALKER_STAGE])
        return max(front_end, sum(_flatten_ints(counts)))

    async def close(self) -> None:
        await asyncio.to_thread(self._engine.shutdown)

    # -- request -> engine prompt ------------------------------------------------------------

    def _additional_information(self, request: SynthesisRequest) -> dict[str, list]:
        """The prompt dict vLLM-Omni's Qwen3-TTS talker reads (as its OpenAI speech adapter builds it)."""
        checkpoint = self.checkpoint
        if request.task_type is not checkpoint.task_type:
            raise RequestRejected(
                "INVALID_ARGUMENT",
                f"task type {request.task_type.value} is not served by this model: {self.model_name} is a "
                f"{checkpoint.task_type.value} checkpoint",
            )
        if not request.text.strip():
            raise RequestRejected("INVALID_ARGUMENT", "text is empty")
        language = self._language(request.language)
        information: dict[str, list] = {
            "task_type": [request.task_type.value],
            "text": [request.text],
            "language": [language],
            "instruct": [request.instructions],
            "max_new_tokens": [self._max_frames(request)],
        }
        if request.task_type is TaskType.CUSTOM_VOICE:
            information["speaker"] = [self._voice(request.voice)]
        elif request.task_type is TaskType.VOICE_DESIGN:
            if not request.instructions.strip():
                raise RequestRejected("INVALID_ARGUMENT", "VoiceDesign needs instructions that describe the voice")
        else:
            information.update(self._voice_clone(request))
        return information

    def _language(self, language: str) -> str:
        name = (language or AUTO_LANGUAGE).strip()
        if name.lower() == AUTO_LANGUAGE.lower():
            return AUTO_LANGUAGE
        if name.lower() not in self.checkpoint.languages:
            raise RequestRejected(
                "INVALID_ARGUMENT",
                f"unknown language {language!r}: this model speaks {', '.join(self.checkpoint.language_names())}",
            )
        return name.title()

    def _voice(self, voice: str) -> str:
        name = voice.strip().lower()
        known = sorted(self.checkpoint.voices)
        if not name:
            raise RequestRejected("INVALID_ARGUMENT", f"CustomVoice needs a voice, one of {', '.join(known)}")
        if name not in self.checkpoint.voices:
            raise RequestRejected("INVALID_ARGUMENT", f"unknown voice {voice!r}: this model has {', '.join(known)}")
        return name

    def _voice_clone(self, request: SynthesisRequest) -> dict[str, list]:
        if not request.reference_audio:
            raise RequestRejected("INVALID_ARGUMENT", "Base (voice clone) needs reference_audio")
        try:
            reference = decode_reference_audio(request.reference_audio)
        except ReferenceAudioError as error:
            raise RequestRejected("INVALID_ARGUMENT", str(error)) from None
        from codecstream.server.engine.reference_audio import ENCODER_SAMPLE_RATE_HZ

        # With a transcript the talker clones in context (ICL): the reference codes become the
        # decoder's left context. Without one it clones from the speaker embedding only.
        in_context = bool(request.reference_text.strip())
        information: dict[str, list] = {
            "ref_audio": [[reference.samples.tolist(), ENCODER_SAMPLE_RATE_HZ]],
            "x_vector_only_mode": [not in_context],
            "ref_code_length": [reference.num_frames],
        }
        if in_context:
            information["ref_text"] = [request.reference_text]
        return information

    def _max_frames(self, request: SynthesisRequest) -> int:
        return request.max_frames if request.max_frames > 0 else DEFAULT_MAX_FRAMES

    def _prompt_length(self, information: dict[str, list], task_type: TaskType) -> int:
        from vllm_omni.model_executor.models.qwen3_tts.prompt_embeds_builder import Qwen3TTSPromptEmbedsBuilder

        return Qwen3TTSPromptEmbedsBuilder.estimate_prompt_len_from_additional_information(
            additional_information=information,
            task_type=task_type.value,
            tokenize_prompt=lambda text: self._tokenizer(text, padding=False)["input_ids"],
            codec_language_id=self.checkpoint.languages,
            spk_is_dialect=self.checkpoint.voice_dialects,
        )

    def _sampling_params(self, request: SynthesisRequest) -> Any:
        from vllm.sampling_params import RequestOutputKind

        params = copy.deepcopy(self._default_sampling)
        # The step that samples frame N+1 (or EOS) is the one that delivers frame N, so N frames
        # need N+1 sampled tokens; a length stop then means exactly max_frames frames.
        params.max_tokens = self._max_frames(request) + 1
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


def _codes_of(output: Any) -> dict:
    multimodal = output.outputs[0].multimodal_output or {}
    return multimodal.get("codes") or {}


def _rows_of(audio: Any) -> np.ndarray:
    """All rows so far: the engine hands either the concatenation or the list of per-step rows."""
    if audio is None:
        return np.zeros((0, NUM_CODEBOOKS), dtype=np.int16)
    if isinstance(audio, (list, tuple)):
        if not audio:
            return np.zeros((0, NUM_CODEBOOKS), dtype=np.int16)
        return np.concatenate([_as_frames(part) for part in audio])
    return _as_frames(audio)


def _as_frames(tensor: Any) -> np.ndarray:
    array = tensor.detach().cpu().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
    array = array.reshape(-1, NUM_CODEBOOKS)
    if array.size and (array.min() < 0 or array.max() >= CODEBOOK_SIZE):
        bad = np.argwhere((array < 0) | (array >= CODEBOOK_SIZE))[0]
        raise RuntimeError(
            f"talker produced an out-of-range code: row {bad[0]} codebook {bad[1]} has "
            f"{array[bad[0], bad[1]]}, codebook size is {CODEBOOK_SIZE}"
        )
    return array.astype(np.int16)


def _flatten_ints(value: Any) -> list[int]:
    if isinstance(value, (list, tuple)):
        return [item for part in value for item in _flatten_ints(part)]
    if isinstance(value, int):
        return [value]
    raise RuntimeError(f"engine returned {value!r} for its live request count")

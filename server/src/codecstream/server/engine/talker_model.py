"""vLLM-Omni's Qwen3-TTS talker, with its codec frames declared as client output and requests
that grow as their text arrives.

In upstream's pipeline the talker's `codes.audio` rows travel to the code2wav stage over the
inter-stage channel and never reach the client. As the final stage, the model must name them in
`omni_client_multimodal_output_keys` for the AR runner to put them on the client channel. An
upstream talker-only pipeline (or this attribute on the upstream class) would make that part of
this subclass unnecessary.

A growing request (one with a feed in text_feed.py) runs in the talker's streaming-text mode
without its end: the first prefill drops the `tts_eos` row the prompt builder puts last in
`trailing_text`; each decode step first appends the rows fed since the last one (and `tts_eos`
once the input is final) to that same per-request buffer, which the runner keeps between steps;
and codec EOS cannot be sampled before the talker has read `tts_eos`, so a request never ends
before its text does. A whole-text request (no feed) runs exactly as upstream's.

Each step's outputs are kept in batch operations (step_outputs.py, on unless switched off): the
talker's last hidden row for every request in one gather, and only the codes the client channel
carries, where upstream spends a device copy per request three times a step, one of them
synchronous, for metadata only its code2wav stage reads.

Codebooks 1-15 come from codecstream's own code predictor (code_predictor/, on unless
CODECSTREAM_CODE_PREDICTOR=vllm-omni): the same weights and arithmetic, one new position per pass.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import torch
from codecstream.server.engine import code_predictor_noise, repetition_penalty, step_outputs
from codecstream.server.engine.code_predictor.runner import CodePredictorRunner
from codecstream.server.engine.code_predictor_noise import CodePredictorNoise
from codecstream.server.engine.repetition_penalty import DEVICE_PENALTIES
from codecstream.server.engine.text_feed import TEXT_FEEDS, TextFeed
from vllm_omni.model_executor.models.output_templates import OmniOutput
from vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_talker import (
    # Upstream's threshold for dropping the read part of a trailing text: the same frames on both paths.
    _TRAILING_TEXT_COMPACT_MIN_FRAMES,
    Qwen3TTSTalkerForConditionalGeneration,
)

log = logging.getLogger(__name__)

#: "codecstream" (the default): codebooks 1-15 from code_predictor/; "vllm-omni": from vLLM-Omni's
#: own predictor, to measure the difference.
CODE_PREDICTOR_VARIABLE = "CODECSTREAM_CODE_PREDICTOR"
#: "1": let vLLM's JIT kernel warm-up run at start. It compiles every kernel vLLM registers (the
#: longest phase of a cold start, docs/server.md "Start timeline") where a talker uses a handful,
#: and those compile anyway when the start runs them (profiling, graph capture, the warm-ups).
#: vLLM-Omni's deploy schema has no key for vLLM's kernel_config, hence a setting of the talker's.
JIT_WARMUP_VARIABLE = "CODECSTREAM_ENGINE_JIT_WARMUP"


class CodecStreamingQwen3TTSTalker(Qwen3TTSTalkerForConditionalGeneration):
    # codes.audio: one row of 16 codes per decode step; codes.ref: the voice-clone reference codes.
    omni_client_multimodal_output_keys = ("codes.audio", "codes.ref")

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:  # vLLM reads these names
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        scheduler, compilation = vllm_config.scheduler_config, vllm_config.compilation_config
        #: The most frames one code-predictor call takes (a decode batch, or a captured graph's size).
        self._max_rows = max(scheduler.max_num_seqs, compilation.max_cudagraph_capture_size or 0)
        #: The code predictor's seeded noise (code_predictor_noise.py), where switched on.
        self._noise: CodePredictorNoise | None = None
        if code_predictor_noise.enabled():
            device = self.text_embedding.weight.device
            self._noise = CodePredictorNoise(self._max_rows, self.mtp_sample_steps, self.mtp_sample_vocab_size, device)
            log.info(
                "the code predictor's noise is drawn per request and frame, outside graphs (%d rows)", self._max_rows
            )
        if repetition_penalty.enabled():
            vocabulary = int(self.talker_config.vocab_size)
            DEVICE_PENALTIES.attach(vocabulary, scheduler.max_num_seqs, self.text_embedding.weight.device)
        choice = os.environ.get(CODE_PREDICTOR_VARIABLE, "codecstream")
        if choice not in ("codecstream", "vllm-omni"):
            raise ValueError(f"{CODE_PREDICTOR_VARIABLE} is {choice!r}, expected codecstream or vllm-omni")
        #: codecstream's code predictor, made at its first call (the weights are loaded by then).
        self._own_predictor = choice == "codecstream"
        self._predictor: CodePredictorRunner | None = None
        kernels = getattr(vllm_config, "kernel_config", None)
        if os.environ.get(JIT_WARMUP_VARIABLE) != "1" and getattr(kernels, "enable_jit_warmup", False):
            # The worker reads it after loading this model, before its warm-up (the same config object).
            kernels.enable_jit_warmup = False
            log.info("vLLM's JIT kernel warm-up is off: the kernels the talker runs compile as the start runs them")
        #: Whether this step's outputs are kept in batch operations (step_outputs.py).
        self._batched_outputs = step_outputs.enabled()
        #: Whether the step's codes reach the host without the step waiting for them: only where
        #: vLLM's asynchronous step output waits for the step's copies before its outputs are read.
        self._codes_to_host_async = bool(scheduler.async_scheduling) and step_outputs.async_copy_enabled()
        if self._batched_outputs:
            # make_omni_output keeps every request's last hidden row; the runner's per-request
            # postprocess pass (a copy each) has nothing left to do.
            self.has_postprocess = False

    def preprocess_batch(self, **kwargs: Any) -> None:
        if self._noise is not None:
            self._noise.start_step()
        super().preprocess_batch(**kwargs)

    def talker_mtp(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any):
        if self._noise is not None and kwargs.get("sample_uniforms") is None:
            # The rows this step's preprocess filled (under a CUDA graph: the buffer it captured).
            kwargs.update(sample_uniforms=self._noise.rows(int(input_ids.shape[0])), generator=None, generators=None)
        if not self._own_predictor:
            return super().talker_mtp(input_ids, *args, **kwargs)
        return self._predict(input_ids, *args, **kwargs)

    def _predict(
        self,
        input_ids: torch.Tensor,
        input_embeds: torch.Tensor,
        last_talker_hidden: torch.Tensor,
        text_step: torch.Tensor,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        sample_uniforms: torch.Tensor | None = None,
        **_: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """talker_mtp on codecstream's code predictor: (the next talker input [B, H], codes [B, 16]).
        Per-row generators are not taken: seeds hold through the seeded noise (on by default)."""
        params = self._subtalker_sampling_params
        do_sample = bool(params.get("do_sample", True)) if do_sample is None else do_sample
        temperature = float(params.get("temperature", 0.9)) if temperature is None else temperature
        top_k = int(params.get("top_k", 50)) if top_k is None else top_k
        top_p = float(params.get("top_p", 1.0)) if top_p is None else top_p
        if do_sample and top_p != 1.0:
            raise NotImplementedError("the code predictor samples with top_p 1.0 only (subtalker_sampling_params)")
        if self._predictor is None:
            self._predictor = self._make_predictor()
        frame, codes = self._predictor.predict(
            input_ids.reshape(-1).to(torch.long),
            input_embeds,
            last_talker_hidden,
            text_step,
            uniforms=sample_uniforms,
            inv_temperature=1.0 / temperature if do_sample and temperature > 0 else 0.0,
            top_k=top_k,
        )
        return frame, codes

    def _make_predictor(self) -> CodePredictorRunner:
        if self._stacked_codec_embed is None:
            self._build_stacked_codec_embed()
        device = self._stacked_codec_embed.device
        if device.type == "cuda":
            from codecstream.server.engine.code_predictor import triton_ops as ops
        else:
            from codecstream.server.engine.code_predictor import torch_ops as ops
        predictor = CodePredictorRunner(self.code_predictor, self._stacked_codec_embed, self._max_rows, ops)
        log.info(
            "codecstream's code predictor: %s kernels, batches up to %d",
            ops.__name__.rsplit(".", 1)[-1],
            self._max_rows,
        )
        return predictor

    def preprocess(self, input_ids: torch.Tensor, input_embeds: torch.Tensor | None, **info_dict: Any):
        feed = TEXT_FEEDS.get(info_dict.get("request_id", ""))
        first_prefill = feed is not None and not isinstance(info_dict.get("embed", {}).get("prefill"), torch.Tensor)
        decode = feed is not None and int(input_ids.shape[0]) == 1 and not info_dict.get("_omni_is_prefill", False)
        if decode:
            self._grow(info_dict, feed)
        # The prompt's ids (a prefill chunk) or the last sampled one (a decode row).
        DEVICE_PENALTIES.mark([info_dict.get("request_id", "")], input_ids)
        input_ids_out, embeds, update = super().preprocess(input_ids=input_ids, input_embeds=input_embeds, **info_dict)
        if first_prefill and "trailing_text" in update.get("hidden_states", {}):
            # The builder ends the text with tts_eos; a growing text gets it when its input ends.
            tail = update["hidden_states"]["trailing_text"]
            update["hidden_states"]["trailing_text"] = tail[:-1]
        if self._batched_outputs:
            step_outputs.drop_code2wav_meta(update)
        return input_ids_out, embeds, update

    def preprocess_decode_batch(self, *, input_ids: torch.Tensor, req_infos: list[dict[str, Any]], **kwargs: Any):
        self._start_decode_rows(input_ids, [info.get("request_id", "") for info in req_infos], req_infos)
        if self._noise is not None:
            self._noise.fill(req_infos)
        batch = super().preprocess_decode_batch(input_ids=input_ids, req_infos=req_infos, **kwargs)
        if self._batched_outputs:
            for update in batch[-1]:
                step_outputs.drop_code2wav_meta(update)
        return batch

    def decode_step_inputs(
        self,
        input_ids: torch.Tensor,
        request_ids: Sequence[str],
        infos: Sequence[dict[str, Any]],
        seeds: Sequence[int | None],
        frames: Sequence[int],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """A decode-only step's inputs in batch operations (decode_step.py): (the codebook-0
        embeddings, the talker's last hidden rows, the text rows), each [B, H], for `input_ids` [B]
        (each request's last codebook-0 id), its requests' runner buffers, seeds and frame indices.

        The same as preprocess_decode_batch (ours, then upstream's) row for row, and it leaves each
        request's buffer as that would (its text offset, its trailing text compacted at the same
        frames), so a later step may take either path; it only builds no per-request tensors or
        update dicts. None where a buffer is laid out otherwise (its state nested in
        `additional_information`): the caller then takes the general path."""
        rows = int(input_ids.shape[0])
        if not self._batched_outputs or any("additional_information" in info for info in infos):
            return None
        self._start_decode_rows(input_ids, request_ids, infos)
        if self._noise is not None:
            self._noise.fill_rows(seeds, frames)
        device, dtype = input_ids.device, self._embedding_dtype
        pad = self._tts_pad_embed.to(device=device, dtype=dtype).reshape(-1)
        text_rows: list[torch.Tensor] = []
        last_rows: list[torch.Tensor] = []
        for info in infos:
            text_rows.append(_next_text_row(info, pad))
            last = info.get("hidden_states", {}).get("last")
            if not isinstance(last, torch.Tensor):
                # As upstream: a step can run before the request's last hidden row is kept.
                last = torch.zeros_like(pad)
            last_rows.append(last.reshape(-1))
        embeds = self.embed_input_ids(input_ids.reshape(-1, 1).to(torch.long)).to(dtype).reshape(rows, -1)
        last_hidden = torch.stack(last_rows).to(device=device, dtype=dtype)
        return embeds, last_hidden, torch.stack(text_rows).to(dtype)

    def _start_decode_rows(
        self, input_ids: torch.Tensor, request_ids: Sequence[str], infos: Sequence[dict[str, Any]]
    ) -> None:
        """What a decode step does first on either path: each growing request's newly fed text
        appended before the step reads it, and each row's input (the codebook-0 id its request
        sampled last step) marked seen for the repetition penalty."""
        if len(TEXT_FEEDS):
            for request_id, info in zip(request_ids, infos, strict=True):
                if (feed := TEXT_FEEDS.get(request_id)) is not None:
                    self._grow(info, feed)
        if DEVICE_PENALTIES:  # no per-row work while nothing running is penalized
            DEVICE_PENALTIES.mark(request_ids, input_ids)

    def make_omni_output(self, model_outputs: Any, **kwargs: Any) -> OmniOutput:
        if not self._batched_outputs or isinstance(model_outputs, OmniOutput):
            return super().make_omni_output(model_outputs, **kwargs)
        infos = kwargs.get("model_intermediate_buffer") or []
        step_outputs.keep_last_hidden(model_outputs, infos, kwargs.get("request_token_spans"))
        codes = step_outputs.client_codes(infos, to_host_async=self._codes_to_host_async)
        return OmniOutput(text_hidden_states=model_outputs, multimodal_outputs=codes)

    def _grow(self, info: dict[str, Any], feed: TextFeed) -> None:
        """Append the request's newly fed rows to its trailing text, before this step reads it;
        count the step (it consumes row `decode_steps - 1`)."""
        feed.decode_steps += 1
        if not feed.pending and not feed.eos_pending:
            return
        config = self.config
        ids = [*feed.pending, *([config.tts_eos_token_id] if feed.eos_pending else [])]
        feed.pending, feed.eos_pending = [], False
        hidden = info.setdefault("hidden_states", {})
        tail = hidden.get("trailing_text")
        # As the prompt builder makes text rows: the text embedding, projected into the talker's width.
        # Not a device constructor: that waits for every step queued before it (see compute_logits).
        ids_tensor = torch.tensor([ids], dtype=torch.long).to(self.text_embedding.weight.device, non_blocking=True)
        rows = self.text_projection(self.text_embedding(ids_tensor)).reshape(len(ids), -1)
        if isinstance(tail, torch.Tensor) and tail.ndim == 2:
            hidden["trailing_text"] = torch.cat([tail, rows.to(device=tail.device, dtype=tail.dtype)]).detach()
        else:
            hidden["trailing_text"] = rows.detach()

    def compute_logits(self, hidden_states: Any, sampling_metadata: Any = None) -> torch.Tensor | None:
        logits = super().compute_logits(hidden_states, sampling_metadata)
        request_ids = self._batch_req_ids
        if logits is None or len(request_ids) != logits.shape[0]:
            # A dummy batch (profiling, graph capture) names no requests.
            return logits
        logits = DEVICE_PENALTIES.apply(logits, request_ids)
        if not len(TEXT_FEEDS):
            return logits
        early = [
            row
            for row, request_id in enumerate(request_ids)
            if (feed := TEXT_FEEDS.get(request_id)) is not None and not feed.eos_fed()
        ]
        if early:
            # A device tensor made from host data waits for the GPU to finish all the work queued
            # before it, which under asynchronous scheduling is the step before: an enqueued copy
            # keeps the host preparing ahead on every step that runs a growing request.
            rows = torch.tensor(early, dtype=torch.long).to(logits.device, non_blocking=True)
            logits[rows, int(self.talker_config.codec_eos_token_id)] = float("-inf")
        return logits


def _next_text_row(info: dict[str, Any], pad: torch.Tensor) -> torch.Tensor:
    """This decode step's text row for one request, its buffer advanced as upstream's batched
    decode preprocess advances it: the next row of its trailing text, or the pad row once that is
    read; the text offset kept in `meta`, the read part of the text dropped (compacted) where
    upstream drops it."""
    hidden = info.setdefault("hidden_states", {})
    meta = info.setdefault("meta", {})
    if not isinstance(meta.get("codec_streaming"), bool):
        streaming = meta.get("codec_streaming")
        streaming = streaming[0] if isinstance(streaming, list) and streaming else streaming
        task_type = (info.get("task_type") or ["CustomVoice"])[0]
        meta["codec_streaming"] = streaming if isinstance(streaming, bool) else task_type == "Base"
    tail = hidden.get("trailing_text")
    offset = max(0, int(meta.get("talker_text_offset", 0) or 0))
    if not isinstance(tail, torch.Tensor) or tail.ndim != 2:
        meta["talker_text_offset"] = offset
        return pad
    length = int(tail.shape[0])
    if offset >= length:
        meta["talker_text_offset"] = 0
        if length:
            hidden["trailing_text"] = tail.new_empty((0, tail.shape[1]))
        return pad
    row = tail[offset]
    following = offset + 1
    if following >= length or (following >= _TRAILING_TEXT_COMPACT_MIN_FRAMES and following * 2 >= length):
        # A copy, as upstream's buffer update makes: the read rows' memory goes.
        hidden["trailing_text"] = tail[following:].clone() if following < length else tail.new_empty((0, tail.shape[1]))
        following = 0
    meta["talker_text_offset"] = following
    return row

"""A decode-only engine step prepared in batch operations: the model runner's half of the talker's
per-step host work.

vLLM-Omni's v1 AR runner prepares a step request by request. For each it fills a dict of the
request's state, slices out its input id, hands all of them to the talker's batched decode hook
(upstream's walks the requests again, slicing each one's text row and hidden row and returning an
update dict per request), then merges each update back into the request's buffer. That is tens of
small host operations per request and step, and a step's host time grows with its batch past the
GPU's own work, so the GPU waits for the host (docs/performance.md, "The decode step").

Nearly every step of a TTS server decodes only: each request scheduled for exactly one token, past
its prompt. For such a step this runner (in front of vLLM-Omni's, in the CUDA and the CPU workers)
prepares the step itself: the decode rows are the first B rows of the runner's input buffers, the
talker's `decode_step_inputs` gives their embeddings, last hidden rows and text rows in batch
operations and advances each request's buffer in place, and the rows reach the code predictor's
buffers in one copy each. Any other step (a prefill chunk, speculative tokens, a talker that
declines) takes upstream's path, which reads and leaves the buffers the same way, so a request may
pass between the two from step to step. On unless CODECSTREAM_DECODE_STEP=0.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

#: On by default. 0 prepares every step on vLLM-Omni's path, to measure the difference
#: (benchmarks/gpu_step_profile.py) or to rule this out.
ENABLE_VARIABLE = "CODECSTREAM_DECODE_STEP"


def enabled() -> bool:
    return os.environ.get(ENABLE_VARIABLE, "1") != "0"


class DecodeStepRunner:
    """Goes in front of vLLM-Omni's GPUARModelRunner (or a runner built on it) in a class's bases."""

    def _preprocess(self, scheduler_output: Any, num_input_tokens: int, intermediate_tensors: Any = None):
        prepared = self._decode_only_preprocess(scheduler_output, num_input_tokens, intermediate_tensors)
        if prepared is not None:
            return prepared
        return super()._preprocess(scheduler_output, num_input_tokens, intermediate_tensors)

    def _decode_only_preprocess(self, scheduler_output: Any, num_input_tokens: int, intermediate_tensors: Any):
        """Upstream's `_preprocess` for a decode-only step of the talker, or None for any other step."""
        decode_step_inputs = getattr(self.model, "decode_step_inputs", None)
        req_ids = self.input_batch.req_ids
        count = len(req_ids)
        if (
            decode_step_inputs is None
            or not self._decode_step_on()
            or count == 0
            # Every scheduled request has at least one token: the total equals the count only
            # where each has exactly one.
            or scheduler_output.total_num_scheduled_tokens != count
            or scheduler_output.scheduled_spec_decode_tokens
            or scheduler_output.scheduled_encoder_inputs
            or intermediate_tensors is not None
        ):
            return None
        states = [self.requests.get(req_id) for req_id in req_ids]
        if any(state is None for state in states):
            return None
        prompt_lengths = np.fromiter((len(state.prompt_token_ids or ()) for state in states), np.int64, count)
        frames = self.input_batch.num_computed_tokens_cpu[:count] - prompt_lengths
        if (frames < 0).any():  # a request still in its prompt
            return None

        # Upstream's prologue for a talker (a model with its own preprocess, its embeddings as input).
        input_ids = self.input_ids.gpu[:num_input_tokens]
        inputs_embeds = self.inputs_embeds.gpu[:num_input_tokens]
        model_kwargs = self._init_model_kwargs()
        if self.uses_mrope:
            positions = self.mrope_positions.gpu[:, :num_input_tokens]
        else:
            positions = self.positions[:num_input_tokens]
            if num_input_tokens > count:
                self.positions[count:num_input_tokens].zero_()
        self._omni_num_scheduled_tokens_np = np.ones(count, dtype=np.int32)
        # No prompt rows to overlay. The buffer updates the scheduler sent, as upstream applies them
        # (both are idempotent: if the talker declines below, upstream's path applies them again).
        self._update_additional_information(scheduler_output)
        if not self.vllm_config.model_config.async_chunk:
            self._sync_local_stage_payloads()
        self._maybe_run_batch_preprocess(req_ids, input_ids.device)

        buffers = self.model_intermediate_buffer
        infos = [buffers.setdefault(req_id, {}) for req_id in req_ids]
        seeds = [getattr(getattr(state, "sampling_params", None), "seed", None) for state in states]
        ids = input_ids[:count]
        prepared = decode_step_inputs(ids, req_ids, infos, seeds, frames.tolist())
        if prepared is None:
            return None
        for state, info in zip(states, infos, strict=True):
            # Upstream's buffer update keeps this mirror of the buffer on the request's state.
            if getattr(state, "additional_information_cpu", None) is not info:
                state.additional_information_cpu = info
        embeds, last_hidden, text_rows = prepared
        inputs_embeds[:count].copy_(embeds)
        self.talker_mtp_input_ids.gpu[:count].copy_(ids)
        self.talker_mtp_inputs_embeds.gpu[:count].copy_(embeds)
        self.last_talker_hidden.gpu[:count].copy_(last_hidden)
        self.text_step.gpu[:count].copy_(text_rows)
        # The code predictor for every row: each row's next input embedding and its frame's codes.
        self._talker_mtp_forward(list(req_ids), inputs_embeds, list(range(count)))
        self.decode_only_steps = getattr(self, "decode_only_steps", 0) + 1
        return input_ids, inputs_embeds, positions, None, model_kwargs, None

    def _decode_step_on(self) -> bool:
        on = getattr(self, "_decode_step_enabled", None)
        if on is None:
            # Upstream's prologue above is the talker's: no multimodal encoder inputs, no prompt
            # embeddings in place of ids, one pipeline stage, a talker that runs the code predictor.
            on = (
                enabled()
                and self.has_talker_mtp
                and getattr(self.model, "has_preprocess", False)
                and not self.supports_mm_inputs
                and not self.enable_prompt_embeds
                and not self.model_config.is_encoder_decoder
                and self.parallel_config.pipeline_parallel_size == 1
            )
            self._decode_step_enabled = on
        return on

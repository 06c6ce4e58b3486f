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
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from codecstream.server.engine import code_predictor_noise, step_outputs
from codecstream.server.engine.code_predictor_noise import CodePredictorNoise
from codecstream.server.engine.text_feed import TEXT_FEEDS, TextFeed
from vllm_omni.model_executor.models.output_templates import OmniOutput
from vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_talker import Qwen3TTSTalkerForConditionalGeneration

log = logging.getLogger(__name__)


class CodecStreamingQwen3TTSTalker(Qwen3TTSTalkerForConditionalGeneration):
    # codes.audio: one row of 16 codes per decode step; codes.ref: the voice-clone reference codes.
    omni_client_multimodal_output_keys = ("codes.audio", "codes.ref")

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:  # vLLM reads these names
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        #: The code predictor's seeded noise (code_predictor_noise.py), where switched on.
        self._noise: CodePredictorNoise | None = None
        if code_predictor_noise.enabled():
            scheduler, compilation = vllm_config.scheduler_config, vllm_config.compilation_config
            rows = max(scheduler.max_num_seqs, compilation.max_cudagraph_capture_size or 0)
            device = self.text_embedding.weight.device
            self._noise = CodePredictorNoise(rows, self.mtp_sample_steps, self.mtp_sample_vocab_size, device)
            log.info("the code predictor's noise is drawn per request and frame, outside graphs (%d rows)", rows)
        #: Whether this step's outputs are kept in batch operations (step_outputs.py).
        self._batched_outputs = step_outputs.enabled()
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
        return super().talker_mtp(input_ids, *args, **kwargs)

    def preprocess(self, input_ids: torch.Tensor, input_embeds: torch.Tensor | None, **info_dict: Any):
        feed = TEXT_FEEDS.get(info_dict.get("request_id", ""))
        first_prefill = feed is not None and not isinstance(info_dict.get("embed", {}).get("prefill"), torch.Tensor)
        decode = feed is not None and int(input_ids.shape[0]) == 1 and not info_dict.get("_omni_is_prefill", False)
        if decode:
            self._grow(info_dict, feed)
        input_ids_out, embeds, update = super().preprocess(input_ids=input_ids, input_embeds=input_embeds, **info_dict)
        if first_prefill and "trailing_text" in update.get("hidden_states", {}):
            # The builder ends the text with tts_eos; a growing text gets it when its input ends.
            tail = update["hidden_states"]["trailing_text"]
            update["hidden_states"]["trailing_text"] = tail[:-1]
        if self._batched_outputs:
            step_outputs.drop_code2wav_meta(update)
        return input_ids_out, embeds, update

    def preprocess_decode_batch(self, *, input_ids: torch.Tensor, req_infos: list[dict[str, Any]], **kwargs: Any):
        for info in req_infos:
            feed = TEXT_FEEDS.get(info.get("request_id", ""))
            if feed is not None:
                self._grow(info, feed)
        if self._noise is not None:
            self._noise.fill(req_infos)
        batch = super().preprocess_decode_batch(input_ids=input_ids, req_infos=req_infos, **kwargs)
        if self._batched_outputs:
            for update in batch[-1]:
                step_outputs.drop_code2wav_meta(update)
        return batch

    def make_omni_output(self, model_outputs: Any, **kwargs: Any) -> OmniOutput:
        if not self._batched_outputs or isinstance(model_outputs, OmniOutput):
            return super().make_omni_output(model_outputs, **kwargs)
        infos = kwargs.get("model_intermediate_buffer") or []
        step_outputs.keep_last_hidden(model_outputs, infos, kwargs.get("request_token_spans"))
        return OmniOutput(text_hidden_states=model_outputs, multimodal_outputs=step_outputs.client_codes(infos))

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
        ids_tensor = torch.tensor([ids], dtype=torch.long, device=self.text_embedding.weight.device)
        rows = self.text_projection(self.text_embedding(ids_tensor)).reshape(len(ids), -1)
        if isinstance(tail, torch.Tensor) and tail.ndim == 2:
            hidden["trailing_text"] = torch.cat([tail, rows.to(device=tail.device, dtype=tail.dtype)]).detach()
        else:
            hidden["trailing_text"] = rows.detach()

    def compute_logits(self, hidden_states: Any, sampling_metadata: Any = None) -> torch.Tensor | None:
        logits = super().compute_logits(hidden_states, sampling_metadata)
        if logits is None or not len(TEXT_FEEDS):
            return logits
        request_ids = self._batch_req_ids
        if len(request_ids) != logits.shape[0]:
            return logits
        early = [not feed.eos_fed() if (feed := TEXT_FEEDS.get(rid)) is not None else False for rid in request_ids]
        if any(early):
            rows = torch.tensor(early, device=logits.device, dtype=torch.bool)
            logits[rows, int(self.talker_config.codec_eos_token_id)] = float("-inf")
        return logits

"""vLLM-Omni's Qwen3-TTS talker, with its codec frames declared as client output.

In upstream's pipeline the talker's `codes.audio` rows travel to the code2wav stage over the
inter-stage channel and never reach the client. As the final stage, the model must name them in
`omni_client_multimodal_output_keys` for the AR runner to put them on the client channel. An
upstream talker-only pipeline (or this attribute on the upstream class) would make this subclass
unnecessary.
"""

from __future__ import annotations

from vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_talker import Qwen3TTSTalkerForConditionalGeneration


class CodecStreamingQwen3TTSTalker(Qwen3TTSTalkerForConditionalGeneration):
    # codes.audio: one row of 16 codes per decode step; codes.ref: the voice-clone reference codes.
    omni_client_multimodal_output_keys = ("codes.audio", "codes.ref")

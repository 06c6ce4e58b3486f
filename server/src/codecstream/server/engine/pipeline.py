"""The talker-only Qwen3-TTS pipeline: stage 0 of vLLM-Omni's two-stage pipeline, made final.

Upstream's pipeline is talker -> code2wav; here the codec frames themselves are the product, so the
talker is the only stage and its per-step codec rows go to the client. A deploy YAML selects it with
`pipeline: qwen3_tts_talker_only` (see codecstream/server/deploy/).
"""

from __future__ import annotations

# Importing upstream's pipeline module also registers how `codes.audio` accumulates over steps
# (one row per step, concatenated along dim 0) and that `codes.ref` is replaced, not appended.
from codecstream.protocol.release import CODEC_EOS_TOKEN_ID
from vllm_omni.config.stage_config import PipelineConfig, StageExecutionType, StagePipelineConfig
from vllm_omni.model_executor.models.qwen3_tts import pipeline as _upstream_qwen3_tts_pipeline  # noqa: F401

PIPELINE_NAME = "qwen3_tts_talker_only"
# The talker class that exposes its codec frames to the client (talker_model.py), registered with
# vLLM-Omni's model registry by name so that loading this module does not import model code.
TALKER_ARCH = "CodecstreamQwen3TTSTalker"
TALKER_CLASS_PATH = "codecstream.server.engine.talker_model:CodecStreamingQwen3TTSTalker"
#: Holds growing requests whose next text row has not arrived (text_feed.py); synchronous or
#: asynchronous as the stage's `async_scheduling` says (scheduler.py).
SCHEDULER_CLASS_PATH = "codecstream.server.engine.scheduler.scheduler_for"

TALKER_ONLY_PIPELINE = PipelineConfig(
    model_type=PIPELINE_NAME,
    model_arch=TALKER_ARCH,
    stages=(
        StagePipelineConfig(
            stage_id=0,
            model_stage="qwen3_tts",
            execution_type=StageExecutionType.LLM_AR,
            input_sources=(),
            final_output=True,
            # "audio" routes the stage's multimodal output to the client and accumulates
            # codes.audio per the strategies registered above.
            final_output_type="audio",
            owns_tokenizer=True,
            engine_output_type="latent",
            scheduler_cls=SCHEDULER_CLASS_PATH,
            sampling_constraints={"detokenize": False, "stop_token_ids": [CODEC_EOS_TOKEN_ID]},
        ),
    ),
)

"""The prompt the Qwen3-TTS talker reads for one request, and the positions it takes in the engine.

vLLM-Omni's talker builds its prompt embeddings itself from `additional_information` (the dict its
OpenAI speech adapter sends); the engine's token ids are placeholders that only reserve as many
positions, and vLLM-Omni's own estimate says how many. A growing request
(engine/growing_generation.py) is the same prompt in the talker's streaming-text mode, its text
given as the ids committed so far.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from codecstream.protocol.decoding import SAMPLE_RATE_HZ
from codecstream.server.checkpoint_info import CheckpointInfo
from codecstream.server.request import SynthesisRequest, TaskType

#: vLLM-Omni's prompt builder takes a request's assistant-turn ids under this key instead of its text.
PRECOMPUTED_TEXT_IDS = "_qwen3_tts_text_ids"
#: The ids of an empty assistant turn: the talker slices a text's ids out of its turn as [3:-5].
_EMPTY_TURN = "<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n"
_TURN_HEAD_IDS = 3


@dataclasses.dataclass(frozen=True)
class TalkerPrompt:
    #: The talker's prompt, as vLLM-Omni's speech adapter builds it.
    information: dict[str, list]
    #: Positions it takes in the engine's context.
    rows: int

    def engine_input(self) -> dict[str, Any]:
        """What `AsyncOmni.generate` takes: placeholder ids for the positions, and the prompt."""
        return {"prompt_token_ids": [1] * self.rows, "additional_information": self.information}


class TalkerPrompts:
    """Builds prompts with one text tokenizer (the talker's own, to size them exactly).

    A fast tokenizer used from two threads at once fails ("Already borrowed"): each thread that
    builds prompts has a TalkerPrompts of its own."""

    def __init__(self, tokenizer: Any, checkpoint: CheckpointInfo) -> None:
        #: The text tokenizer, for the thread this builder belongs to only.
        self.tokenizer = tokenizer
        self._checkpoint = checkpoint
        turn = tokenizer(_EMPTY_TURN, padding=False)["input_ids"]
        self._turn_head, self._turn_tail = turn[:_TURN_HEAD_IDS], turn[_TURN_HEAD_IDS:]

    def prompt(self, request: SynthesisRequest, text_ids: list[int] | None = None) -> TalkerPrompt:
        """The prompt of `request`: its whole text, or, given `text_ids`, a growing request with
        the text ids committed so far (the streaming-text mode)."""
        information: dict[str, list] = {
            "task_type": [request.task_type.value],
            "text": [request.text_so_far],
            "language": [request.language],
            "instruct": [request.instructions],
            "max_new_tokens": [request.max_frames],
        }
        if request.task_type is TaskType.CUSTOM_VOICE:
            information["speaker"] = [request.voice]
        elif request.task_type is TaskType.BASE:
            information.update(_voice_clone(request))
        if text_ids is None:
            return TalkerPrompt(information, self._length(information, request.task_type))
        information["non_streaming_mode"] = [False]
        information[PRECOMPUTED_TEXT_IDS] = [[*self._turn_head, *text_ids, *self._turn_tail]]
        # In the streaming-text mode the length needs only a non-empty text, whatever has arrived.
        return TalkerPrompt(information, self._length({**information, "text": ["x"]}, request.task_type))

    def _length(self, information: dict[str, list], task_type: TaskType) -> int:
        from vllm_omni.model_executor.models.qwen3_tts.prompt_embeds_builder import Qwen3TTSPromptEmbedsBuilder

        return Qwen3TTSPromptEmbedsBuilder.estimate_prompt_len_from_additional_information(
            additional_information=information,
            task_type=task_type.value,
            tokenize_prompt=lambda text: self.tokenizer(text, padding=False)["input_ids"],
            codec_language_id=self._checkpoint.languages,
            spk_is_dialect=self._checkpoint.voice_dialects,
        )


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


def _inlined_array(samples: np.ndarray) -> dict:
    """Samples in the inlined-array form vLLM-Omni's Qwen3-TTS prompt builder reads: one bytes
    buffer on the way to the engine. A list of floats (what vLLM-Omni's speech API sends) is
    serialized float by float on the event loop (tens of ms for 30 s of audio); a bare ndarray
    does not survive the trip and takes the engine down."""
    return {"__ndarray__": True, "data": samples.astype("<f4").tobytes(), "dtype": "<f4", "shape": [samples.size]}

"""A decode step's outputs kept in batch operations, not one device copy per request.

vLLM-Omni's v1 AR runner hands the talker its per-request buffers (`model_intermediate_buffer`,
the runner's own dicts, in batch order) and moves what the talker returns request by request.
For the Qwen3-TTS talker that cost three device copies per request every step (H100, 1.7B shape,
192 streams: 603 copies and 196 synchronizations a step, benchmarks/results/gpu_step_profile.json):

- preprocess marks each frame valid or not as a device scalar, and the runner stores it on the
  host: a synchronous copy per request. Only the code2wav stage reads that mark;
- the model's output copies each mark back to the device to hand it on, with the codec stream
  flags and reference lengths, which also only code2wav reads;
- the runner's postprocess pass keeps each request's last hidden row (the next step's code
  predictor input) with a copy per request;
- the output builder copies the step's codes to the host and waits for the GPU to finish the
  step (a synchronous copy): the host could not prepare step N+1 while step N ran.

A talker-only pipeline needs none of the code2wav metadata: its client channel carries
`codes.audio` and `codes.ref` alone. Here the marks are dropped where preprocess makes them, the
output carries only the codes, and every request's last hidden row comes from one gather per step,
written into the runner's buffers as views of that one owned tensor, as the runner's postprocess
pass would have written a copy. Under asynchronous scheduling the codes go to pinned host memory
in a copy the GPU makes in stream order: vLLM's asynchronous step output waits for an event
recorded after it (the sampled tokens' copy) before the engine core reads any of the step's
outputs, so nothing reads the codes before they land, and the builder finds them on the host.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

#: On by default. 0 gives upstream's per-request path back, to measure the difference
#: (benchmarks/gpu_step_profile.py) or to rule this out.
ENABLE_VARIABLE = "CODECSTREAM_BATCHED_STEP_OUTPUTS"


#: On by default where the scheduler is asynchronous. 0 copies the step's codes to the host
#: synchronously, as before, to measure the difference.
ASYNC_COPY_VARIABLE = "CODECSTREAM_CODES_TO_HOST_ASYNC"


def enabled() -> bool:
    return os.environ.get(ENABLE_VARIABLE, "1") != "0"


def async_copy_enabled() -> bool:
    return os.environ.get(ASYNC_COPY_VARIABLE, "1") != "0"


def drop_code2wav_meta(update: dict[str, Any]) -> None:
    """Remove from a preprocess update the frame-valid mark only code2wav reads (a device scalar
    the runner would copy to the host, synchronously, for every request)."""
    meta = update.get("meta")
    if isinstance(meta, dict):
        meta.pop("codec_frame_valid", None)


def keep_last_hidden(
    hidden: torch.Tensor, infos: Sequence[dict[str, Any]], spans: Sequence[tuple[int, int]] | None
) -> None:
    """Store each request's last hidden row of this step as `hidden_states.last` in its buffer.

    `infos` and `spans` are the runner's per-request buffers and (start, end) rows of the step, in
    batch order. One gather makes a fresh tensor: under a CUDA graph `hidden` is the graph's
    output buffer, which the next replay overwrites.
    """
    if spans is None or len(spans) != len(infos):
        # The runner computes the spans for every step; without them no row can be assigned.
        raise RuntimeError(
            f"the runner gave {0 if spans is None else len(spans)} request token spans for "
            f"{len(infos)} requests: cannot keep the talker's last hidden rows"
        )
    kept = [(info, end - 1) for info, (start, end) in zip(infos, spans, strict=True) if end > start]
    if not kept:
        return
    rows = torch.tensor([row for _, row in kept], dtype=torch.long).to(hidden.device, non_blocking=True)
    last_rows = hidden.index_select(0, rows).detach()
    for (info, _), last in zip(kept, last_rows.unbind(0), strict=True):
        info.setdefault("hidden_states", {})["last"] = last


def client_codes(infos: Sequence[dict[str, Any]], to_host_async: bool = False) -> dict[str, Any]:
    """The step's multimodal output as the client channel reads it: every request's `codes.audio`
    rows in batch order, and `codes.ref` (one entry per request, empty where it has none) when any
    request carries reference codes. Empty when no request has codes yet.

    `to_host_async`: the rows are copied to pinned host memory without waiting for them; only for
    a runner whose step output waits for the step's copies before anything reads it (vLLM's
    asynchronous scheduling)."""
    audio: list[torch.Tensor] = []
    references: list[torch.Tensor] = []
    for info in infos:
        codes = info.get("codes", {}) if isinstance(info, dict) else {}
        if isinstance(codes.get("audio"), torch.Tensor):
            audio.append(codes["audio"])
        reference = codes.get("ref")
        references.append(reference if isinstance(reference, torch.Tensor) else torch.empty(0, dtype=torch.long))
    if not audio:
        return {}
    rows = torch.cat(audio, dim=0)
    if to_host_async and rows.is_cuda:
        host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
        rows = host.copy_(rows, non_blocking=True)
    output: dict[str, Any] = {"codes": {"audio": rows}}
    if any(reference.numel() > 0 for reference in references):
        # One entry per request: the runner indexes this list by the request's batch position.
        output["codes"]["ref"] = references
    return output

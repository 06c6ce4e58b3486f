"""The talker's repetition penalty kept on the device, at a per-step host cost that grows with
neither the streams' lengths nor their histories.

vLLM's sampler applies a request's repetition penalty from its token lists: every step it
rebuilds a [batch, longest output] tensor from Python lists on the host and copies it over
(its share of a GPU step: docs/performance.md), and a talker stream runs for thousands of steps,
so that work grows with every frame spoken. Here each running request owns a row of "seen" flags over the codec
vocabulary on the device: its prompt's ids are marked when its prefill runs, and each sampled
codebook-0 id when the next step reads it as its input. The talker's compute_logits applies the
penalty with vLLM's own function, on float32 logits as vLLM's sampler does, before anything else
touches them, so the logits equal those vLLM's sampler would make (the penalty only scales, and
the -inf of min_tokens or of codec EOS held back stays -inf in either order).

vLLM sees a penalty of 1.0 (its sampler then does no penalty work at all); the request's own
value travels in its `extra_args` (talker_requests.py moves it there), the scheduler registers it
when the request arrives and forgets it when the request is freed (scheduler.py), and the model
marks and applies (talker_model.py). All of them run in the talker stage's engine-core process,
like the text feeds (text_feed.py), on the thread that steps.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch

#: On by default. 0 leaves the penalty to vLLM's sampler, to measure the difference
#: (benchmarks/gpu_step_profile.py) or to rule this out.
ENABLE_VARIABLE = "CODECSTREAM_DEVICE_REPETITION_PENALTY"
#: Where a request's penalty travels in its SamplingParams.extra_args.
EXTRA_ARGS_KEY = "codecstream_repetition_penalty"


def enabled() -> bool:
    return os.environ.get(ENABLE_VARIABLE, "1") != "0"


def take_from_vllm(params: Any) -> None:
    """Move a request's repetition penalty from vLLM's sampler to this module (when enabled)."""
    penalty = float(params.repetition_penalty)
    if not enabled() or penalty == 1.0:
        return
    params.extra_args = {**(params.extra_args or {}), EXTRA_ARGS_KEY: penalty}
    params.repetition_penalty = 1.0


class DevicePenalties:
    """Every penalized request of this engine: its penalty (by vLLM request id) and, once it has
    run, its row of seen flags in one device table, [rows, vocabulary + 1] bool (the last column
    takes ids outside the vocabulary)."""

    def __init__(self) -> None:
        self._penalty: dict[str, float] = {}
        self._row: dict[str, int] = {}
        self._free_rows: list[int] = []
        self._seen: torch.Tensor | None = None
        self._vocabulary = 0
        #: The last batch's request ids and their device rows and penalties, reused while the
        #: batch stays the same (most steps).
        self._batch: tuple[list[str], torch.Tensor, torch.Tensor] | None = None
        #: The last decode batch's request ids and where `mark` writes for them, reused likewise.
        self._marked: tuple[list[str], _Located | None] | None = None

    def attach(self, vocabulary: int, rows: int, device: torch.device | str) -> None:
        """Made by the model, which knows the vocabulary, the batch and the device."""
        self._vocabulary = vocabulary
        self._seen = torch.zeros((max(1, rows), vocabulary + 1), dtype=torch.bool, device=device)
        self._free_rows = list(range(len(self._seen)))
        self._row.clear()
        self._batch = None
        self._marked = None

    def admit(self, request_id: str, sampling_params: Any) -> None:
        """A request arrives (the scheduler): keep its penalty, if it carries one. Where no talker
        attached in this process (an executor that runs the worker elsewhere), the penalty goes
        back to vLLM's sampler, which still has it to apply: the request is not sent yet."""
        extra = getattr(sampling_params, "extra_args", None)
        if not isinstance(extra, Mapping) or EXTRA_ARGS_KEY not in extra:
            return
        if self._seen is None:
            sampling_params.repetition_penalty = float(extra[EXTRA_ARGS_KEY])
            return
        self._penalty[request_id] = float(extra[EXTRA_ARGS_KEY])
        self._marked = None

    def release(self, request_id: str) -> None:
        """A request is freed (the scheduler): its row goes back. The device work already queued
        for it reads the row before anything queued later rewrites it (one stream)."""
        self._penalty.pop(request_id, None)
        row = self._row.pop(request_id, None)
        if row is not None:
            self._free_rows.append(row)
            self._batch = None
            self._marked = None

    def __len__(self) -> int:
        return len(self._penalty)

    def mark(self, request_ids: Sequence[str], token_ids: torch.Tensor) -> None:
        """Flag token ids as seen. One id per request (a decode batch, `token_ids` [len(request_ids)]),
        or, for one request, all of its span (a prefill chunk)."""
        if self._seen is None or not self._penalty:
            return
        ids = token_ids.reshape(-1).to(torch.long)
        if len(request_ids) == 1:
            located = self._locate([self._row_of(request_ids[0])] * int(ids.numel()), ids.device)
        else:
            located = self._located_batch(list(request_ids), ids.device)
        if located is None:
            return
        if located.keep is not None:
            ids = ids[located.keep]
        outside = (ids < 0) | (ids >= self._vocabulary)
        ids = ids.masked_fill(outside, self._vocabulary)
        self._seen[located.rows, ids] = True

    def _located_batch(self, request_ids: list[str], device: torch.device) -> _Located | None:
        """Where a decode batch's ids go: the same as last step's while the batch is unchanged
        (most steps), so a step builds and copies nothing per request."""
        if self._marked is not None and self._marked[0] == request_ids:
            return self._marked[1]
        located = self._locate([self._row_of(request_id) for request_id in request_ids], device)
        self._marked = (request_ids, located)
        return located

    def _locate(self, rows: list[int | None], ids_device: torch.device) -> _Located | None:
        keep = [index for index, row in enumerate(rows) if row is not None]
        if not keep:
            return None
        keep_rows = None
        if len(keep) != len(rows):
            keep_rows = torch.tensor(keep, dtype=torch.long).to(ids_device, non_blocking=True)
            rows = [rows[index] for index in keep]
        assert self._seen is not None
        return _Located(keep_rows, torch.tensor(rows, dtype=torch.long).to(self._seen.device, non_blocking=True))

    def apply(self, logits: torch.Tensor, request_ids: Sequence[str]) -> torch.Tensor:
        """The batch's logits (rows in `request_ids` order) penalized as vLLM's sampler would, in
        float32; unchanged when no request in it is penalized."""
        if self._seen is None or not self._penalty:
            return logits
        if logits.shape[1] > self._vocabulary:
            raise RuntimeError(f"logits over {logits.shape[1]} ids, penalties kept over {self._vocabulary}")
        rows, penalties = self._batch_tensors(list(request_ids))
        if rows is None:
            return logits
        from vllm._custom_ops import apply_repetition_penalties

        logits = logits.to(torch.float32)
        seen = self._seen[:, : logits.shape[1]].index_select(0, rows)
        apply_repetition_penalties(logits, seen, seen, penalties)
        return logits

    def _batch_tensors(self, request_ids: list[str]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self._batch is not None and self._batch[0] == request_ids:
            return self._batch[1], self._batch[2]
        assert self._seen is not None
        rows, penalties = [], []
        for request_id in request_ids:
            row, penalty = self._row.get(request_id), self._penalty.get(request_id, 1.0)
            # A request not yet marked (or already freed) has nothing to penalize: 1.0 is exact.
            rows.append(0 if row is None else row)
            penalties.append(1.0 if row is None else penalty)
        if all(penalty == 1.0 for penalty in penalties):
            self._batch = None
            return None, None
        device = self._seen.device
        batch = (
            request_ids,
            torch.tensor(rows, dtype=torch.long).to(device, non_blocking=True),
            torch.tensor(penalties, dtype=torch.float32).to(device, non_blocking=True),
        )
        self._batch = batch
        return batch[1], batch[2]

    def _row_of(self, request_id: str) -> int | None:
        """The request's row, taken (and cleared) when it first runs; None if it is not penalized."""
        if request_id not in self._penalty:
            return None
        row = self._row.get(request_id)
        if row is not None:
            return row
        assert self._seen is not None
        if not self._free_rows:
            # More penalized requests alive than rows (parked ones keep theirs): grow the table.
            grown = torch.zeros_like(self._seen)
            self._free_rows = list(range(len(self._seen), 2 * len(self._seen)))
            self._seen = torch.cat([self._seen, grown])
        row = self._free_rows.pop()
        self._seen[row] = False
        self._row[request_id] = row
        self._batch = None
        return row


class _Located(NamedTuple):
    """Where `mark` writes: which of the given ids are penalized (None: all), and their rows."""

    keep: torch.Tensor | None
    rows: torch.Tensor


#: This engine process's table (the model attaches its device tensors).
DEVICE_PENALTIES = DevicePenalties()

"""Token ids of a text that grows, equal to the ids of the whole text tokenized at once.

The talker reads the text of a request as the ids of its assistant turn,
`<|im_start|>assistant\n{text}<|im_end|>...`, from the third id on (vLLM-Omni's prompt builder
slices `[3:-5]`). A streamed text arrives in pieces, and tokenizing each piece on its own gives
other ids ("Hel" + "lo" is not "Hello"). Qwen's tokenizer normalizes (NFC), cuts the text into
pre-tokens with one regex, and runs byte-level BPE inside each pre-token, never across two. So
every pre-token but the last of the text received so far is final: more text can only extend the
last one. `IncrementalTokenizer` keeps the unfinished tail, commits every pre-token before its
last, and commits the last one too at a flush or the end of the input.
"""

from __future__ import annotations

#: The role line before the text in the assistant turn: pre-tokenized together with the text
#: (no special token separates them), so the text's first pre-token is cut as the talker cuts it.
_ROLE_LINE = "assistant\n"
_ROLE_IDS = 2


class IncrementalTokenizer:
    """Feed `push` the text as it arrives; each call returns the ids it made final."""

    def __init__(self, tokenizer) -> None:
        #: A fast tokenizer's `tokenizers.Tokenizer` (transformers' `backend_tokenizer`), or that itself.
        self._backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if self._backend.pre_tokenizer is None:
            raise ValueError("an incremental tokenizer needs a tokenizer with a pre-tokenizer")
        self._tail = _ROLE_LINE  # normalized text not yet committed
        self._role_ids_left = _ROLE_IDS
        self._ended = False
        #: Every id committed so far, in order.
        self.ids: list[int] = []
        #: Where each committed id's text ends, in characters of the normalized text.
        self.ends: list[int] = []
        self._committed_chars = -len(_ROLE_LINE)

    def push(self, text: str) -> list[int]:
        """Append `text`; return the ids that no later text can change."""
        if self._ended:
            raise ValueError("text pushed after the end of the input")
        self._tail = self.normalize(self._tail + text)
        pieces = self._backend.pre_tokenizer.pre_tokenize_str(self._tail)
        if len(pieces) < 2:
            return []
        return self._commit(pieces[-1][1][0])

    def flush(self) -> list[int]:
        """Commit the unfinished last pre-token too (speak what has arrived, even mid-word)."""
        return self._commit(len(self._tail))

    def end(self) -> list[int]:
        """No more text: the rest, as the whole text's tokenization ends."""
        ids = self.flush()
        self._ended = True
        return ids

    def normalize(self, text: str) -> str:
        """`text` as the tokenizer sees it (its normalizer; Qwen's is NFC): `ends` count these characters."""
        normalizer = self._backend.normalizer
        return normalizer.normalize_str(text) if normalizer is not None else text

    def _commit(self, end: int) -> list[int]:
        """The ids of the tail's first `end` characters, which start and end on pre-token bounds:
        tokenized alone they are cut exactly as within the whole text."""
        if end <= 0:
            return []
        encoding = self._backend.encode(self._tail[:end], add_special_tokens=False)
        ids = encoding.ids
        ends = [self._committed_chars + offset_end for _, offset_end in encoding.offsets]
        self._tail = self._tail[end:]
        self._committed_chars += end
        dropped = min(self._role_ids_left, len(ids))
        self._role_ids_left -= dropped
        ids, ends = ids[dropped:], ends[dropped:]
        self.ids += ids
        # Byte-level BPE can split one character over several ids; ends never go back.
        for index, value in enumerate(ends):
            ends[index] = max(value, self.ends[-1] if self.ends else 0, ends[index - 1] if index else 0)
        self.ends += ends
        return ids


def whole_text_ids(tokenizer, text: str) -> list[int]:
    """The talker's own ids for `text`: its assistant turn tokenized at once, sliced as vLLM-Omni's
    prompt builder slices it. What IncrementalTokenizer must reproduce."""
    turn = f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return list(tokenizer(turn, padding=False)["input_ids"][3:-5])

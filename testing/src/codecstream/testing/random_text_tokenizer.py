"""A stand-in Qwen text tokenizer for random-weight Qwen3-TTS checkpoints (no hub download).

vLLM-Omni's talker builds its prompt from the real special-token ids (`<|im_start|>` 151644,
`<tts_pad>` 151671, ...) found in config.json, and counts prompt positions with the text
tokenizer, so the stand-in must put every special token on its real id and must turn the
chat-template words ("assistant", "user", "system") into one token each, on Qwen's ids (the
release's config.json names "assistant" by its id, 77091). Everything else is a plain byte-level
BPE: the 256 byte symbols in Qwen's (GPT-2's) id order, so "\n" is 198 as in the real vocabulary,
the merges that spell those words, then filler entries on every other id below 151643 that no
merge can ever produce.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

#: Qwen2/Qwen3 special tokens 151643-151668 plus the five Qwen3-TTS adds; ids are the real ones.
SPECIAL_TOKENS: dict[int, str] = {
    151643: "<|endoftext|>",
    151644: "<|im_start|>",
    151645: "<|im_end|>",
    151646: "<|object_ref_start|>",
    151647: "<|object_ref_end|>",
    151648: "<|box_start|>",
    151649: "<|box_end|>",
    151650: "<|quad_start|>",
    151651: "<|quad_end|>",
    151652: "<|vision_start|>",
    151653: "<|vision_end|>",
    151654: "<|vision_pad|>",
    151655: "<|image_pad|>",
    151656: "<|video_pad|>",
    151657: "<tool_call>",
    151658: "</tool_call>",
    151659: "<|fim_prefix|>",
    151660: "<|fim_middle|>",
    151661: "<|fim_suffix|>",
    151662: "<|fim_pad|>",
    151663: "<|repo_name|>",
    151664: "<|file_sep|>",
    151665: "<tool_response>",
    151666: "</tool_response>",
    151667: "<think>",
    151668: "</think>",
    151669: "<|audio_start|>",
    151670: "<|audio_end|>",
    151671: "<tts_pad>",
    151672: "<tts_text_bos>",
    151673: "<tts_text_eod>",
    151674: "<tts_text_bos_single>",
}
FIRST_SPECIAL_ID = min(SPECIAL_TOKENS)
#: Words the chat template needs as single tokens, on their ids in Qwen's vocabulary.
WHOLE_WORDS: dict[str, int] = {"system": 8948, "user": 872, "assistant": 77091}
#: Qwen2's pre-tokenizer split (digits one by one, words with a leading space, punctuation runs).
_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, in its (and Qwen's) vocabulary order:
    the printable bytes as themselves, then the others remapped to U+0100 onwards, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    others = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + n) for n in range(len(others))]


def build_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    vocab: dict[str, int] = {symbol: i for i, symbol in enumerate(_byte_symbols())}
    merges: list[tuple[str, str]] = []
    # The prefixes a word's merges pass through take the first ids after the bytes.
    free_ids = (i for i in itertools.count(len(vocab)) if i not in WHOLE_WORDS.values())
    for word, word_id in WHOLE_WORDS.items():
        for end in range(2, len(word) + 1):
            if word[:end] not in vocab:
                merges.append((word[: end - 1], word[end - 1]))
                vocab[word[:end]] = word_id if end == len(word) else next(free_ids)
    # Fillers keep the words and the special tokens on their real ids; no merge produces them.
    taken = set(vocab.values())
    for filler, token_id in enumerate(i for i in range(FIRST_SPECIAL_ID) if i not in taken):
        vocab[f"<|filler_{filler}|>"] = token_id
    return dict(sorted(vocab.items(), key=lambda entry: entry[1])), merges


def build_tokenizer() -> Tokenizer:
    vocab, merges = build_vocab_and_merges()
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    for word, word_id in WHOLE_WORDS.items():
        if tokenizer.encode(word).ids != [word_id]:
            raise AssertionError(f"{word!r} is not the single token {word_id}")
    for token_id in sorted(SPECIAL_TOKENS):
        added = tokenizer.add_special_tokens([SPECIAL_TOKENS[token_id]])
        if added != 1 or tokenizer.token_to_id(SPECIAL_TOKENS[token_id]) != token_id:
            raise AssertionError(f"special token {SPECIAL_TOKENS[token_id]} did not land on id {token_id}")
    return tokenizer


def _tokenizer_config() -> dict:
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(token_id): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for token_id, content in sorted(SPECIAL_TOKENS.items())
        },
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_text_tokenizer(out_dir: Path) -> None:
    """Write vocab.json, merges.txt and tokenizer_config.json (the official files) plus tokenizer.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab, merges = build_vocab_and_merges()
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(), indent=2) + "\n")
    build_tokenizer().save(str(out_dir / "tokenizer.json"))

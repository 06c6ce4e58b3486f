"""Token ids of streamed text equal the ids of the whole text, wherever the text was cut: the stand-in
tokenizer of the test checkpoints and a trained byte-level BPE with Qwen's normalizer and
pre-tokenizer (merges across many characters), for many texts and split points."""

from __future__ import annotations

import pytest
from codecstream.server.text_tokens import IncrementalTokenizer, whole_text_ids
from codecstream.testing.random_text_tokenizer import _QWEN_SPLIT, write_text_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

CORPUS = [
    "Sure, I can help with that. The next train to the airport leaves at nine, from platform four.",
    "It's 3.5 euros; don't worry — we'll see, they've said I'm fine.\n\nNew paragraph:\ttabbed text.",
    "你好，今天天气很好。我们出去走走吧！Crème brûlée, naïve café, Ångström, São Paulo.",
    "Numbers 12345 and 67.89%, e-mail me@example.com, emoji 🙂🚆 and ellipsis… done",
]
#: Letters, digits, white space, punctuation, contractions, CJK, precomposed and combining accents, emoji.
ALPHABET = st.sampled_from(
    [*list("abcdeHTLnostrw 0123456789  \n\t.,;:!?'\"-—…()"), "'s", "'ll", "é", "é", "ü", "你", "好", "。", "，", "🙂"]
)


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """The text tokenizer every random test checkpoint carries, as the server loads it."""
    directory = tmp_path_factory.mktemp("tokenizer")
    write_text_tokenizer(directory)
    return AutoTokenizer.from_pretrained(str(directory))


def trained_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on CORPUS, built as Qwen2's tokenizer.json is: NFC, Qwen's split regex,
    byte-level, the chat special tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # Every turn starts with the role line: as in Qwen's vocabulary, "assistant" becomes one token.
    tokenizer.train_from_iterator([f"assistant\n{text}" for text in CORPUS] * 20, trainer=trainer)
    assert len(tokenizer.encode("assistant\n", add_special_tokens=False).ids) == 2
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


TRAINED = trained_tokenizer()


def streamed_ids(tokenizer, text: str, cuts: list[int]) -> list[int]:
    incremental = IncrementalTokenizer(tokenizer)
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    returned = []
    for piece in pieces:
        returned += incremental.push(piece)
    returned += incremental.end()
    assert returned == incremental.ids
    return returned


@st.composite
def text_and_cuts(draw):
    text = "".join(draw(st.lists(ALPHABET, min_size=0, max_size=60)))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=20)))
    return text, cuts


@pytest.mark.parametrize("text", CORPUS)
def test_a_reply_cut_after_every_character_has_the_ids_of_the_whole_reply(stand_in, text):
    for tokenizer in (stand_in, TRAINED):
        assert streamed_ids(tokenizer, text, list(range(1, len(text)))) == whole_text_ids(tokenizer, text)


@settings(max_examples=300, deadline=None)
@given(text_and_cuts())
def test_any_text_cut_anywhere_has_the_ids_of_the_whole_text(stand_in, case):
    text, cuts = case
    for tokenizer in (stand_in, TRAINED):
        assert streamed_ids(tokenizer, text, cuts) == whole_text_ids(tokenizer, text)


def test_only_the_unfinished_last_word_waits_and_a_flush_commits_it(stand_in):
    incremental = IncrementalTokenizer(TRAINED)
    assert incremental.push("The next train") == TRAINED("The next", add_special_tokens=False)["input_ids"]
    assert incremental.flush() == TRAINED(" train", add_special_tokens=False)["input_ids"]
    incremental.end()
    with pytest.raises(ValueError, match="after the end of the input"):
        incremental.push("more")


def test_tokenizing_each_piece_alone_would_give_other_ids():
    # Why the incremental tokenizer exists: "Hel" + "lo" is not "Hello" to a BPE.
    pieces = ["The tr", "ain leav", "es at ni", "ne."]
    alone = [i for piece in pieces for i in TRAINED(piece, add_special_tokens=False)["input_ids"]]
    assert alone != whole_text_ids(TRAINED, "".join(pieces))
    assert streamed_ids(TRAINED, "".join(pieces), [6, 14, 22]) == whole_text_ids(TRAINED, "".join(pieces))

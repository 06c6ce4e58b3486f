"""A turn's text as written and as spoken (codecstream.client.plugins.spoken_text): transforms see
whole words; the words the stream times are handed out as written, timed where their spoken form is
heard; a rewrite counts as heard only once all of it was; text a transform failed on is dropped."""

from __future__ import annotations

import re

import pytest
from codecstream.client.plugins.spoken_text import SpokenText
from codecstream.protocol.text_timing import WordTiming


def timed(spoken: str) -> list[WordTiming]:
    """The spoken text's words as a stream times them, here 0.1 s a character."""
    return [
        WordTiming(m.group(), m.start(), m.end(), m.start() / 10, m.end() / 10) for m in re.finditer(r"\S+", spoken)
    ]


def say_it_right(text: str) -> str:
    return re.sub(r"\bMetformin\b", "met for min", text)


async def pushed(text: SpokenText, tokens: list[str]) -> list[str]:
    sent = [await text.push(token) for token in tokens]
    return [*sent, await text.flush()]


@pytest.mark.asyncio
async def test_without_transforms_text_goes_out_as_it_comes_and_words_are_the_streams():
    text = SpokenText()
    assert await pushed(text, ["Take", " Met", "formin"]) == ["Take", " Met", "formin", ""]
    words = timed("Take Metformin")
    assert text.written_words(words) == words
    assert text.written_offset(7) == 7


@pytest.mark.asyncio
async def test_a_transform_sees_whole_words_an_unfinished_one_waits_for_white_space_or_a_flush():
    seen = []

    def noting(piece: str) -> str:
        seen.append(piece)
        return say_it_right(piece)

    text = SpokenText([noting])
    sent = await pushed(text, ["Take", " Met", "formin", " twice", " a", " day."])
    assert sent == ["", "Take ", "", "met for min ", "twice ", "a ", "day."]
    assert seen == ["Take ", "Metformin ", "twice ", "a ", "day."]
    assert (text.written, text.spoken) == ("Take Metformin twice a day.", "Take met for min twice a day.")


@pytest.mark.asyncio
async def test_a_rewritten_word_is_handed_out_once_its_whole_spoken_form_is_timed_from_its_first_word():
    text = SpokenText([say_it_right])
    await text.push("Take Metformin twice.", complete=True)
    spoken = timed(text.spoken)  # Take, met, for, min, twice.
    assert text.written_words(spoken[:1]) == [WordTiming("Take", 0, 4, 0.0, 0.4)]
    assert text.written_words(spoken[1:3]) == []  # "met for": not all of it yet
    assert text.written_words(spoken[3:4]) == [WordTiming("Metformin", 5, 14, 0.5, 1.6)]
    assert text.written_words(spoken[4:]) == [WordTiming("twice.", 15, 21, 1.7, 2.3)]


@pytest.mark.asyncio
async def test_a_listener_cut_off_inside_a_rewrite_has_not_heard_the_word_it_stands_for():
    text = SpokenText([say_it_right])
    await text.push("Take Metformin twice.", complete=True)
    heard = text.written[: text.written_offset(text.spoken.index("for") + 3)]
    assert heard == "Take "
    assert text.written[: text.written_offset(text.spoken.index("min") + 3)] == "Take Metformin"


@pytest.mark.asyncio
async def test_a_word_a_transform_left_nothing_to_say_for_is_handed_out_with_the_next_or_at_the_end():
    text = SpokenText([lambda piece: piece.replace("\N{GRINNING FACE}", "")])
    await text.push("Fine \N{GRINNING FACE} thanks \N{GRINNING FACE}", complete=True)
    spoken = timed(text.spoken)  # Fine, thanks
    assert [w.word for w in text.written_words(spoken[:1])] == ["Fine"]
    with_next = text.written_words(spoken[1:])
    assert [w.word for w in with_next] == ["\N{GRINNING FACE}", "thanks"]
    assert with_next[0].start_s < with_next[1].start_s and with_next[1].end_s == spoken[1].end_s
    # The stream's end says all of the spoken text was heard: the last one goes out then.
    assert [w.word for w in text.written_words([], heard_to=len(text.spoken))] == ["\N{GRINNING FACE}"]


@pytest.mark.asyncio
async def test_text_a_transform_failed_on_is_neither_spoken_nor_written():
    def refuse_secrets(piece: str) -> str:
        if "secret" in piece:
            raise ValueError("no secrets")
        return piece

    text = SpokenText([refuse_secrets])
    await text.push("The ")
    with pytest.raises(ValueError, match="no secrets"):
        await text.push("secret is", complete=True)
    assert await text.push(" out.", complete=True) == " out."
    assert (text.written, text.spoken) == ("The  out.", "The  out.")


@pytest.mark.asyncio
async def test_async_transforms_are_awaited_in_order():
    async def shout(piece: str) -> str:
        return piece.upper()

    text = SpokenText([say_it_right, shout])
    assert await text.push("Metformin now", complete=True) == "MET FOR MIN NOW"
    assert [w.word for w in text.written_words(timed(text.spoken))] == ["Metformin", "now"]

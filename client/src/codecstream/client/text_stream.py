"""Speech for text that arrives in pieces, as an LLM writes its reply.

    async with client.stream_text(decoder=decoder, voice="ryan") as stream:
        stream.push_text("Hello")          # as the tokens come
        stream.push_text(" there.")
        stream.end_input()
        async for chunk in stream:          # PcmChunk with the text span it speaks
            play(chunk.samples)

The server speaks the text in segments (sentences and long clauses, synthesis.proto TextInput);
`flush()` speaks what has arrived now. After `cancel(played_frames)`, `text_offset_played` says how
far the listener heard, and `word_timestamps()` times every word relative to the stream's audio.
"""

from __future__ import annotations

from codecstream.client.synthesis import AsyncAudioStream, PcmChunk
from codecstream.protocol.text_timing import WordTiming, merge_spans, word_timings


class CompletedWords:
    """Word timings released as a stream's segments complete: feed every chunk in order, get the
    words of the segments whose audio just became complete (a word's time is known only once its
    segment's frame count is). What a framework's transcript wants, as the audio plays."""

    def __init__(self) -> None:
        self._chunks: list[tuple[int, int, int, int]] = []
        self._released = 0  # spans whose words were returned

    def add(self, chunk: PcmChunk, text: str) -> list[WordTiming]:
        self._chunks.append((chunk.first_frame, chunk.num_frames, chunk.text_start, chunk.text_end))
        return self._release(text, keep_last=True)

    def rest(self, text: str) -> list[WordTiming]:
        """The words not yet returned, once the stream is over."""
        return self._release(text, keep_last=False)

    def _release(self, text: str, keep_last: bool) -> list[WordTiming]:
        spans = merge_spans(self._chunks)
        complete = spans[self._released : len(spans) - 1 if keep_last else len(spans)]
        self._released += len(complete)
        return word_timings(text, complete)


class AsyncTextStream(AsyncAudioStream):
    """AsyncAudioStream fed by push_text / flush / end_input; iterate for PcmChunks."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: The text pushed so far (Start.text included); offsets in chunks and End refer to it.
        self.text = self.codes.start_text
        self._spans: list[tuple[int, int, int, int]] = []

    def push_text(self, text: str) -> None:
        """Append text; the server speaks each sentence (or long clause) once it is complete."""
        if text:
            self.text += text
            self.codes.send_text(text)

    def flush(self) -> None:
        """Speak what has arrived now, even a partial clause."""
        self.codes.send_text(flush=True)

    def end_input(self) -> None:
        """No more text: the stream ends once the rest is spoken."""
        self.codes.send_text(end_of_input=True)

    async def __anext__(self) -> PcmChunk:
        chunk = await super().__anext__()
        self._spans.append((chunk.first_frame, chunk.num_frames, chunk.text_start, chunk.text_end))
        return chunk

    def word_timestamps(self) -> list[WordTiming]:
        """Every word of the audio received so far, timed from the stream's first frame (0 s):
        each segment's characters spread evenly over its frames (an estimate from the talker's
        conditioning, not a forced alignment)."""
        return word_timings(self.text, merge_spans(self._spans))

    @property
    def text_offset_played(self) -> int | None:
        """After the stream ended: characters of `text` the listener heard (End.text_offset_played)."""
        return self.end.text_offset_played if self.end is not None else None

    @property
    def heard_text(self) -> str | None:
        """After the stream ended: the text up to `text_offset_played`."""
        offset = self.text_offset_played
        return None if offset is None else self.text[:offset]

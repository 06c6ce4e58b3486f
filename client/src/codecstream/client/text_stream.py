"""Speech for text that arrives in pieces, as an LLM writes its reply.

    async with client.stream_text(decoder=decoder, voice="ryan") as stream:
        stream.push_text("Hello")          # as the tokens come
        stream.push_text(" there.")
        stream.end_input()
        async for chunk in stream:          # PcmChunk with the text span it speaks
            play(chunk.samples)
            show(stream.new_word_timings())  # the words this chunk's audio completed

Where the server grows one talker request (GetCodecInfoResponse.streamed_text_grows) every chunk
names the text tokens its own frames read; otherwise the server speaks the text in segments
(sentences and long clauses, synthesis.proto TextInput). `flush()` speaks what has arrived now.
After `cancel(played_frames)`, `text_offset_played` says how far the listener heard.
"""

from __future__ import annotations

from codecstream.client.synthesis import AsyncAudioStream


class AsyncTextStream(AsyncAudioStream):
    """AsyncAudioStream fed by push_text / flush / end_input; iterate for PcmChunks."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._text = self.codes.start_text
        self._input_ended = False

    @property
    def text(self) -> str:
        """The text pushed so far (Start.text included); offsets in chunks and End refer to it."""
        return self._text

    @property
    def text_complete(self) -> bool:
        return self._input_ended

    def push_text(self, text: str) -> None:
        """Append text; the server speaks it as it arrives (the last, unfinished word waits)."""
        if text:
            self._text += text
            self.codes.send_text(text)

    def flush(self) -> None:
        """Speak what has arrived now, even a partial clause or word."""
        self.codes.send_text(flush=True)

    def end_input(self) -> None:
        """No more text: the stream ends once the rest is spoken."""
        self._input_ended = True
        self.codes.send_text(end_of_input=True)

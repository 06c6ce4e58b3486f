"""Turns the server's messages back into frames, enforcing the order the contract promises.

Header first, then Chunks with seq 0, 1, 2, ... whose first_frame continues the previous chunk,
then exactly one End whose frame count matches what arrived. Anything else raises a
StreamOrderError naming the message that broke the order; codes that do not parse raise CodesError.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from codecstream.protocol.codes import unpack_codes
from codecstream.protocol.decoding import NUM_CODEBOOKS
from codecstream.protocol.errors import CodesError, StreamOrderError
from codecstream.v1 import synthesis_pb2


@dataclasses.dataclass(frozen=True)
class ReceivedChunk:
    """A validated chunk: its position and its codes, shape (num_frames, num_codebooks) int16."""

    seq: int
    first_frame: int
    codes: np.ndarray
    generated_at_us: int
    sent_at_us: int
    #: Serialized size of the SynthesizeResponse that carried it (for bytes-on-the-wire accounting).
    message_bytes: int = 0
    #: Characters [text_start, text_end) of the text the frames speak (Chunk.text_start/text_end).
    text_start: int = 0
    text_end: int = 0
    #: No later chunk speaks more of that span (Chunk.ends_text_span).
    ends_text_span: bool = False

    @property
    def num_frames(self) -> int:
        return int(self.codes.shape[0])


class StreamReassembler:
    """Feed it every SynthesizeResponse of one stream in arrival order; it returns the chunks."""

    def __init__(self) -> None:
        self.header: synthesis_pb2.Header | None = None
        self.end: synthesis_pb2.End | None = None
        self.reference_codes = np.zeros((0, NUM_CODEBOOKS), dtype=np.int16)
        self.next_seq = 0
        self.next_frame = 0
        self._resuming = False

    @property
    def finished(self) -> bool:
        return self.end is not None

    @property
    def last_seq(self) -> int | None:
        """Highest seq received so far, None before the first chunk (what Resume.last_acked_seq wants)."""
        return self.next_seq - 1 if self.next_seq else None

    def expect_resume(self) -> None:
        """The connection was lost: the next message is the same stream's Header again, then the
        chunks after `last_seq`."""
        if self.header is None:
            raise StreamOrderError("cannot resume a stream whose Header never arrived")
        if self.end is not None:
            raise StreamOrderError("cannot resume a stream that already ended")
        self._resuming = True

    def accept(self, message: synthesis_pb2.SynthesizeResponse) -> ReceivedChunk | None:
        """Validate one message; return the chunk it carries, or None for Header and End."""
        kind = message.WhichOneof("kind")
        if self.end is not None:
            raise StreamOrderError(f"{kind or 'empty message'} after End: End must be the last message")
        if kind == "header":
            self._accept_header(message.header)
            return None
        if self.header is None:
            raise StreamOrderError(f"{kind or 'empty message'} before Header: Header must come first")
        if kind == "chunk":
            chunk = self._accept_chunk(message.chunk)
            return dataclasses.replace(chunk, message_bytes=message.ByteSize())
        if kind == "end":
            self._accept_end(message.end)
            return None
        raise StreamOrderError("message with no kind set: expected header, chunk or end")

    def _accept_header(self, header: synthesis_pb2.Header) -> None:
        if self._resuming:
            if header.stream_id != self.header.stream_id:
                raise StreamOrderError(
                    f"resumed stream id {header.stream_id!r} differs from the original {self.header.stream_id!r}"
                )
            self._resuming = False
            return
        if self.header is not None:
            raise StreamOrderError("second Header: a stream has exactly one Header")
        codec = header.codec
        if codec.num_codebooks < 1 or codec.codebook_size < 1:
            raise StreamOrderError(
                f"Header codec spec has {codec.num_codebooks} codebooks of size {codec.codebook_size}: "
                "both must be >= 1"
            )
        try:
            self.reference_codes = unpack_codes(
                header.reference_codes, header.reference_frames, codec.num_codebooks, codec.codebook_size
            )
        except CodesError as error:
            raise CodesError(f"Header reference codes: {error}") from None
        self.header = header

    def _accept_chunk(self, chunk: synthesis_pb2.Chunk) -> ReceivedChunk:
        if self._resuming:
            raise StreamOrderError(f"chunk seq {chunk.seq} before the resumed stream's Header")
        if chunk.seq != self.next_seq:
            what = "duplicate" if chunk.seq < self.next_seq else "gap"
            raise StreamOrderError(f"chunk seq {chunk.seq} ({what}): expected seq {self.next_seq}")
        if chunk.first_frame != self.next_frame:
            raise StreamOrderError(
                f"chunk seq {chunk.seq} starts at frame {chunk.first_frame}, expected frame {self.next_frame}"
            )
        if chunk.num_frames < 1:
            raise StreamOrderError(f"chunk seq {chunk.seq} has {chunk.num_frames} frames, expected >= 1")
        if chunk.text_end < chunk.text_start:
            raise StreamOrderError(
                f"chunk seq {chunk.seq} has text span [{chunk.text_start}, {chunk.text_end}): end before start"
            )
        codec = self.header.codec
        try:
            codes = unpack_codes(chunk.codes, chunk.num_frames, codec.num_codebooks, codec.codebook_size)
        except CodesError as error:
            raise CodesError(f"chunk seq {chunk.seq}: {error}") from None
        self.next_seq += 1
        self.next_frame += chunk.num_frames
        return ReceivedChunk(
            chunk.seq,
            chunk.first_frame,
            codes,
            chunk.generated_at_us,
            chunk.sent_at_us,
            text_start=chunk.text_start,
            text_end=chunk.text_end,
            ends_text_span=chunk.ends_text_span,
        )

    def _accept_end(self, end: synthesis_pb2.End) -> None:
        if self._resuming:
            raise StreamOrderError("End before the resumed stream's Header")
        if end.reason == synthesis_pb2.END_REASON_UNSPECIFIED:
            raise StreamOrderError("End with reason UNSPECIFIED: the server must say why the stream ended")
        if end.frames_generated != self.next_frame:
            raise StreamOrderError(f"End reports {end.frames_generated} frames but chunks carried {self.next_frame}")
        self.end = end

"""`codecstream say`: speak text through a server, decoding on this device; play it and/or save a WAV."""

from __future__ import annotations

import argparse
import codecs
import os
import pathlib
import sys
import threading
import time

from codecstream.client.audio_out import AudioDeviceUnavailable, Speaker, WavWriter
from codecstream.client.command_error import CommandError
from codecstream.client.commands import add_connection_arguments, add_request_arguments, connect, request_options
from codecstream.client.decoder_download import AUTO
from codecstream.client.jitter_buffer import JitterBuffer
from codecstream.client.playout import PlayoutClock
from codecstream.client.runtimes import BACKENDS
from codecstream.protocol.chunking import ChunkSchedule
from codecstream.protocol.decoding import FRAME_SECONDS
from codecstream.v1 import synthesis_pb2 as pb


class LiveLine:
    """One status line, rewritten in place on a terminal, printed once at the end otherwise."""

    def __init__(self, stream=sys.stderr) -> None:
        self._stream = stream
        self._interactive = stream.isatty()

    def update(self, text: str) -> None:
        if self._interactive:
            self._stream.write("\r\033[K" + text)
            self._stream.flush()

    def finish(self, text: str) -> None:
        self._stream.write(("\r\033[K" if self._interactive else "") + text + "\n")
        self._stream.flush()


def run_say(args: argparse.Namespace) -> int:
    if not args.out and not args.play:
        raise CommandError("nothing to do with the audio: pass --out FILE.wav and/or --play", exit_code=2)
    options = request_options(args)
    # The buffer plans for the chunks the stream will bring: the ramp asked for, else the default.
    buffer = JitterBuffer(schedule=ChunkSchedule(tuple(options["chunking"])) if "chunking" in options else None)
    speaker = None
    if args.play:
        try:
            speaker = Speaker(buffer)
        except AudioDeviceUnavailable as error:
            if not args.out:
                raise CommandError(str(error)) from None
            print(f"codecstream say: {error}; writing {args.out} only", file=sys.stderr)
    line = LiveLine()
    # Underruns as a player would meet them, playing each chunk in real time from the first once it
    # is decoded, whether or not this run plays: a WAV-only run measures the stream as well.
    playout = PlayoutClock()
    wav = WavWriter(args.out) if args.out else None
    try:
        stream = _speak(args, options, buffer, speaker, line, playout, wav)
    except BaseException as error:
        # A failed run leaves no file behind (not a WAV header without audio); an interrupted one
        # keeps what was heard.
        if wav:
            wav.close()
            if not isinstance(error, KeyboardInterrupt) or not wav.samples_written:
                args.out.unlink(missing_ok=True)
        raise
    finally:
        if speaker:
            speaker.close()
    if wav:
        wav.close()
    stats = stream.stats
    first = f"{stats.time_to_first_audio_s * 1000:.0f} ms" if stats.time_to_first_audio_s is not None else "none"
    line.finish(
        f"{stats.audio_s:.2f} s of audio ({_reason(stream.end)}), first audio {first}, "
        f"decode RTF {stats.decode_rtf:.2f}, "
        f"{stats.wire_bytes_per_audio_second:.0f} B/s on the wire, underruns {playout.underruns}"
        + (f" -> {args.out}" if args.out else "")
    )
    return 0


def _speak(args, options: dict, buffer: JitterBuffer, speaker, line: LiveLine, playout: PlayoutClock, wav):
    """Stream the text, decode it here, and hand the audio to the speaker and the WAV; the stream."""
    with connect(args) as client:
        if args.text == "-":
            stream = client.stream_text(decoder=args.decoder, backend=args.backend, **options)
            threading.Thread(target=_feed_stdin, args=(stream,), daemon=True, name="codecstream-stdin").start()
        else:
            stream = client.synthesize(args.text, decoder=args.decoder, backend=args.backend, **options)
        try:
            for chunk in stream:
                playout.handed(chunk.decoded_s, chunk.num_frames)
                if wav:
                    wav.write(chunk.samples)
                if speaker:
                    buffer.push(chunk.samples, chunk.decode_s, chunk.arrived_s)
                stats = stream.stats
                line.update(
                    f"first audio {stats.time_to_first_audio_s * 1000:.0f} ms | decode RTF {stats.decode_rtf:.2f} | "
                    f"buffer {buffer.buffered_s:.2f} s | {stats.audio_s:.1f} s audio"
                )
            buffer.end_of_stream()
            while speaker and not buffer.finished:
                time.sleep(0.02)
        except KeyboardInterrupt:
            played = int(buffer.stats.played_s / FRAME_SECONDS) if speaker else stream.stats.frames
            buffer.clear()
            stream.cancel(played_frames=played)
            line.finish(f"cancelled after {stream.stats.audio_s:.1f} s of audio (server: {_reason(stream.end)})")
            raise
    return stream


def _feed_stdin(stream) -> None:
    """Push standard input to a text stream as it arrives (an LLM piped in), then end the input."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while piece := os.read(sys.stdin.fileno(), 4096):
        stream.push_text(decoder.decode(piece))
    stream.push_text(decoder.decode(b"", final=True))
    stream.end_input()


def _reason(end: pb.End | None) -> str:
    return pb.EndReason.Name(end.reason).removeprefix("END_REASON_") if end else "no End"


def register_say(subparsers) -> None:
    parser = subparsers.add_parser("say", help="speak text: stream codes from a server, decode here, play and/or save")
    add_connection_arguments(parser)
    add_request_arguments(parser, text_help="text to speak; '-': read it from standard input while it is written")
    parser.add_argument("--out", type=pathlib.Path, help="write a 16-bit WAV file")
    parser.add_argument("--play", action="store_true", help="play through the default output device")
    parser.add_argument(
        "--decoder",
        default=AUTO,
        help="decoder artifact directory (codecstream export-decoder) or checkpoint; "
        "default: the server's own, downloaded once and cached",
    )
    parser.add_argument("--backend", default=BACKENDS[0], choices=BACKENDS, help="decoder runtime")
    parser.set_defaults(handler=run_say)

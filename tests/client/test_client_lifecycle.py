"""The client's lifecycle as app code meets it: closing twice, failing to open, finished and abandoned
streams, deadlines, one decoder shared by concurrent streams, one error hierarchy."""

from __future__ import annotations

import asyncio
import inspect
import threading

import grpc
import numpy as np
import pytest
from codecstream.client import (
    AsyncClient,
    Client,
    CodecMismatch,
    CodecStreamError,
    ConnectionOptions,
    DeadlineExceeded,
    StartOptions,
)
from codecstream.client import errors as client_errors
from codecstream.client.command_error import CommandError
from codecstream.client.errors import from_rpc_error
from codecstream.client.requests import build_start
from codecstream.client.runtimes import DecoderLoadError, open_decoder
from codecstream.protocol import decoder_digest
from codecstream.protocol import errors as protocol_errors
from codecstream.v1 import synthesis_pb2 as pb

from tests.conftest import StalledReplay, StallingReplay, random_codes


def finishes(function, timeout: float = 20.0) -> bool:
    """Run `function` in a thread; whether it returned within `timeout` (a hang is a failure)."""
    thread = threading.Thread(target=function, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive()


def client_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "codecstream-client"]


def test_closing_a_client_twice_returns_at_once(replay_server):
    client = Client(replay_server.target)
    client.close()
    assert finishes(client.close)

    async def twice():
        async_client = AsyncClient(replay_server.target)
        await async_client.close()
        await async_client.close()

    asyncio.run(asyncio.wait_for(twice(), 10))


def test_a_client_that_fails_to_open_leaves_no_thread_behind(tmp_path):
    before = len(client_threads())
    with pytest.raises(OSError):
        Client("127.0.0.1:1", tls=tmp_path / "no-such-root.pem")
    assert len(client_threads()) == before


def test_a_finished_code_stream_iterates_as_empty_again(replay_server):
    with Client(replay_server.target) as client:
        codes = client.stream_codes("Hi.")
        assert sum(chunk.num_frames for chunk in codes) == len(replay_server.source.recording.codes)
        assert finishes(lambda: list(codes)) and list(codes) == []


def test_a_finished_audio_stream_iterates_as_empty_again(replay_server_factory, checkpoint):
    server = replay_server_factory(codes=random_codes(12), decoder_digest=decoder_digest(checkpoint))
    decoder = open_decoder(checkpoint, backend="torch")
    with Client(server.target) as client:
        stream = client.synthesize("Hi.", decoder=decoder)
        assert sum(chunk.num_frames for chunk in stream) == 12
        assert finishes(lambda: list(stream)) and list(stream) == []


def test_leaving_a_stream_block_early_cancels_the_stream(replay_server_factory, checkpoint):
    server = replay_server_factory(codes=random_codes(2000), fps=50.0, decoder_digest=decoder_digest(checkpoint))
    with Client(server.target) as client:
        with client.stream_codes("A long text.") as codes:
            next(codes)
        assert codes.end.reason == pb.END_REASON_CANCELLED
        decoder = open_decoder(checkpoint, backend="torch")
        with client.synthesize("A long text.", decoder=decoder) as audio:
            next(audio)
        assert audio.end.reason == pb.END_REASON_CANCELLED
    assert server.wait_until(lambda: server.live_requests() == 0)


def test_leaving_an_async_stream_block_early_cancels_the_stream(replay_server_factory):
    server = replay_server_factory(codes=random_codes(2000), fps=50.0)

    async def run() -> pb.End:
        async with AsyncClient(server.target) as client:
            async with client.stream_codes("A long text.") as stream:
                await anext(stream)
            return stream.end

    assert asyncio.run(run()).reason == pb.END_REASON_CANCELLED


@pytest.mark.parametrize("when", ["before its header", "mid-stream"])
def test_a_dropped_stream_is_over_at_once_and_a_cancel_after_it_raises_nothing(replay_server_factory, checkpoint, when):
    # A stream given up on (abandon(): its server owes audio and sends none) is not cancelled again:
    # the cancel waited for the dropped call and raised its CancelledError into the caller.
    source_class = StalledReplay if when == "before its header" else StallingReplay
    server = replay_server_factory(
        codes=random_codes(40), fps=100.0, decoder_digest=decoder_digest(checkpoint), source_class=source_class
    )

    async def scenario():
        async with AsyncClient(server.target) as client:
            stream = client.synthesize("Hello there.", decoder=await client.open_decoder(checkpoint))
            if when == "mid-stream":
                while stream.stats.frames < StallingReplay.STALL_AFTER:
                    await asyncio.wait_for(anext(stream), 10)
            pending = asyncio.ensure_future(anext(stream))  # the server sends nothing more
            done, _ = await asyncio.wait({pending}, timeout=0.3)
            assert not done
            pending.cancel()
            stream.codes.abandon()
            return await asyncio.wait_for(stream.cancel(3), 10)

    assert asyncio.run(scenario()) is None  # no End: the server never confirmed


def test_a_stream_past_its_deadline_fails_with_deadline_exceeded(replay_server_factory):
    server = replay_server_factory(codes=random_codes(2000), fps=25.0)
    with Client(server.target) as client, pytest.raises(DeadlineExceeded):
        for _ in client.stream_codes("A long text.", timeout_s=0.5):
            pass
    assert server.wait_until(lambda: server.live_requests() == 0)


def test_two_concurrent_streams_on_one_decoder_play_what_they_play_alone(replay_server_factory, checkpoint):
    # The README's example, twice at once on one opened decoder.
    server = replay_server_factory(codes=random_codes(60, seed=4), fps=200.0, decoder_digest=decoder_digest(checkpoint))
    decoder = open_decoder(checkpoint, backend="torch")

    def play(client) -> np.ndarray:
        return np.concatenate([chunk.samples for chunk in client.synthesize("Hello there.", decoder=decoder)])

    with Client(server.target) as client:
        alone = play(client)
    results: list[np.ndarray] = []
    with Client(server.target) as first, Client(server.target) as second:
        threads = [threading.Thread(target=lambda c=c: results.append(play(c))) for c in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert len(results) == 2
    for pcm in results:
        np.testing.assert_array_equal(pcm, alone)


def test_both_clients_take_the_same_documented_keyword_options():
    for name in ("stream_codes", "synthesize", "stream_text"):
        blocking = inspect.signature(getattr(Client, name)).parameters
        asynchronous = inspect.signature(getattr(AsyncClient, name)).parameters
        assert list(blocking) == list(asynchronous), name
    built = [name for name in inspect.signature(build_start).parameters if name != "text"]
    assert built == list(StartOptions.__annotations__), "StartOptions and build_start list the same options"


def test_the_blocking_client_passes_on_every_connection_option_of_the_async_one():
    parameters = inspect.signature(AsyncClient.__init__).parameters.values()
    keywords = [parameter.name for parameter in parameters if parameter.kind is parameter.KEYWORD_ONLY]
    assert keywords == list(ConnectionOptions.__annotations__)


def test_every_error_codecstream_raises_is_a_codecstream_error():
    modules = (client_errors, protocol_errors)
    classes = [
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == module.__name__
    ]
    assert len(classes) > 10
    assert all(issubclass(cls, CodecStreamError) for cls in [*classes, DecoderLoadError])
    assert issubclass(protocol_errors.ProtocolError, ValueError)
    assert not issubclass(CommandError, CodecStreamError), "the CLI's error is not a library error"


def test_a_server_refusing_the_decoder_and_the_client_finding_it_raise_the_same_error():
    class Refusal(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.FAILED_PRECONDITION

        def details(self):
            return "client decoder does not match"

    refusal = from_rpc_error(Refusal())
    assert isinstance(refusal, CodecMismatch) and refusal.code == grpc.StatusCode.FAILED_PRECONDITION


def test_a_refusal_reaches_the_caller_as_itself_though_text_was_written_after_the_server_closed(
    replay_server_factory, checkpoint
):
    # The server refuses the Start at once while the client still writes TextInputs: grpc.aio
    # reports such a write as INTERNAL "Internal error from Core" (grpc/grpc#36066) unless the
    # client reads the status the server sent.
    server = replay_server_factory(decoder_digest=decoder_digest(checkpoint))
    decoder = open_decoder(checkpoint)

    async def refused_once() -> CodecStreamError:
        async with AsyncClient(server.target) as client:
            stream = client.stream_text(decoder=decoder, voice="nobody")
            for index in range(50):
                stream.push_text(f"word {index} ")
            try:
                await stream.__anext__()
            except CodecStreamError as error:
                return error
        raise AssertionError("a stream with an unknown voice was not refused")

    for _ in range(40):
        error = asyncio.run(refused_once())
        assert isinstance(error, client_errors.InvalidRequest), error
        assert "unknown voice 'nobody'" in str(error)


def test_a_streamed_text_asked_to_be_resumable_is_refused_not_silently_made_otherwise(
    replay_server_factory, checkpoint
):
    # Issue 39: stream_text overwrote a caller's resumable=True with False, without a word.
    server = replay_server_factory(codes=random_codes(6), decoder_digest=decoder_digest(checkpoint))
    with Client(server.target) as client:
        with pytest.raises(ValueError, match="stream_text cannot be resumable: text sent while disconnected"):
            client.stream_text("Hello", decoder=checkpoint, resumable=True)
        with client.stream_text("Hello", decoder=checkpoint, resumable=False) as stream:
            stream.end_input()
            assert sum(chunk.num_frames for chunk in stream) > 0


def _public_properties(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_") and not callable(inspect.getattr_static(cls, name))}


def test_the_blocking_twins_offer_the_same_properties_as_before_one_forwarding_mechanism():
    from codecstream.client.client import AudioStream, CodeStream, TextStream

    shared = {"header", "end", "resumes", "replica", "reference_codes"}
    assert _public_properties(CodeStream) == shared | {"stream_id"}
    audio = shared | {"stats", "text", "text_offset_played", "heard_text"}
    assert _public_properties(AudioStream) == audio
    assert _public_properties(TextStream) == audio
    assert CodeStream.replica.__doc__ == AudioStream.replica.__doc__
    assert CodeStream.end.__doc__ == "The server's End, once the stream is over."


def test_every_property_of_a_blocking_twin_is_the_value_of_the_async_stream_it_drives(
    replay_server_factory, checkpoint
):
    server = replay_server_factory(codes=random_codes(6), decoder_digest=decoder_digest(checkpoint))
    decoder = open_decoder(checkpoint, backend="torch")
    with Client(server.target) as client:
        codes = client.stream_codes("Hi.", resumable=True)
        audio = client.synthesize("Hi.", decoder=decoder, resumable=True)
        text = client.stream_text("Hi.", decoder=decoder)
        text.end_input()
        for stream in (codes, audio, text):
            assert sum(chunk.num_frames for chunk in stream) == 6
            driven = stream._stream
            code_stream = driven if stream is codes else driven.codes
            for name in _public_properties(type(stream)):
                value = getattr(stream, name)
                if name in {"resumes", "replica", "reference_codes"}:
                    expected = getattr(code_stream, name)
                else:
                    expected = getattr(driven, name)
                assert value is expected or value == expected, name
            assert stream.header is not None and stream.end.reason == pb.END_REASON_EOS
            with pytest.raises(AttributeError, match="end of a blocking stream is read-only"):
                stream.end = None

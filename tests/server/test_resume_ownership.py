"""Resume belongs to the client that started the stream, and a Resume takes over a stale connection."""

from __future__ import annotations

import grpc
import pytest
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc

from tests.conftest import random_codes

TOKEN_A, TOKEN_B = "token-of-a", "token-of-b"


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


class OpenStream:
    """A resumable stream on its own channel, read one message at a time."""

    def __init__(self, target: str, first: pb.SynthesizeRequest, metadata=()) -> None:
        self.channel = grpc.insecure_channel(target)
        stub = synthesis_pb2_grpc.SynthesisServiceStub(self.channel)
        self.responses = stub.Synthesize(iter([first]), metadata=metadata, timeout=30)

    def next(self) -> pb.SynthesizeResponse:
        return next(self.responses)

    def rest(self) -> tuple[list[pb.SynthesizeResponse], grpc.RpcError | None]:
        received = []
        try:
            for response in self.responses:
                received.append(response)
        except grpc.RpcError as error:
            return received, error
        return received, None

    def close(self) -> None:
        self.responses.cancel()
        self.channel.close()


@pytest.fixture
def streams():
    opened: list[OpenStream] = []

    def open_stream(target, first, metadata=()) -> OpenStream:
        opened.append(OpenStream(target, first, metadata))
        return opened[-1]

    yield open_stream
    for stream in opened:
        stream.close()


def resume(stream_id: str, last: int | None = None) -> pb.SynthesizeRequest:
    message = pb.Resume(stream_id=stream_id)
    if last is not None:
        message.last_acked_seq = last
    return pb.SynthesizeRequest(resume=message)


START = pb.SynthesizeRequest(
    start=pb.Start(text="A long text.", resumable=True, chunking=pb.ChunkingPolicy(ramp_frames=[2]))
)


def test_another_token_cannot_resume_a_stream_and_is_told_exactly_what_an_unknown_id_gets(
    replay_server_factory, streams
):
    server = replay_server_factory(codes=random_codes(400), fps=50.0, auth_tokens=frozenset({TOKEN_A, TOKEN_B}))
    owner = streams(server.target, START, bearer(TOKEN_A))
    stream_id = owner.next().header.stream_id

    _, theirs = streams(server.target, resume(stream_id), bearer(TOKEN_B)).rest()
    _, unknown = streams(server.target, resume("0" * 32), bearer(TOKEN_B)).rest()
    assert theirs.code() == unknown.code() == grpc.StatusCode.NOT_FOUND
    assert theirs.details().replace(stream_id, "ID") == unknown.details().replace("0" * 32, "ID")


def test_the_owner_resumes_with_the_same_token_in_another_letter_case_of_the_scheme(replay_server_factory, streams):
    server = replay_server_factory(codes=random_codes(60), fps=50.0, auth_tokens=frozenset({TOKEN_A}))
    owner = streams(server.target, START, (("authorization", f"bearer {TOKEN_A}"),))
    stream_id = owner.next().header.stream_id
    owner.next()
    owner.close()
    received, error = streams(
        server.target, resume(stream_id, last=0), (("authorization", f"BEARER {TOKEN_A}"),)
    ).rest()
    assert error is None
    assert received[0].header.stream_id == stream_id and received[1].chunk.seq == 1
    assert received[-1].end.reason == pb.END_REASON_EOS


def test_a_resume_takes_over_a_stream_still_attached_to_a_stale_call(replay_server_factory, streams):
    # The old connection looks alive to the server (a half-open connection it has not noticed yet).
    server = replay_server_factory(codes=random_codes(200), fps=50.0)
    stale = streams(server.target, START)
    stream_id = stale.next().header.stream_id
    first_chunk = stale.next().chunk
    received, error = streams(server.target, resume(stream_id, last=first_chunk.seq)).rest()
    assert error is None
    assert received[0].header.stream_id == stream_id
    chunks = [r.chunk for r in received if r.HasField("chunk")]
    assert chunks[0].seq == first_chunk.seq + 1
    assert [c.seq for c in chunks] == list(range(chunks[0].seq, chunks[0].seq + len(chunks)))
    assert sum(c.num_frames for c in chunks) + first_chunk.num_frames == 200
    assert received[-1].end.reason == pb.END_REASON_EOS
    _, superseded = stale.rest()
    assert superseded.code() == grpc.StatusCode.ABORTED
    assert superseded.details() == f"stream {stream_id} was resumed by another call"

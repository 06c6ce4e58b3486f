"""Resume: a client that loses its connection reattaches and gets the missing chunks, no re-synthesis."""

import numpy as np
import pytest
from codecstream.client import Client, Unavailable
from codecstream.server.limits import ServerLimits
from codecstream.v1 import synthesis_pb2 as pb

from tests.conftest import random_codes


def test_stream_survives_a_cut_connection_with_identical_frames(replay_server_factory, proxy_factory):
    codes = random_codes(150)
    server = replay_server_factory(codes=codes, fps=150.0)
    proxy = proxy_factory(server.server.port)
    with Client(proxy.target) as client:
        stream = client.stream_codes("A long text.", chunking=[5], resumable=True)
        received = [next(stream) for _ in range(4)]
        proxy.cut()
        received += list(stream)
    assert stream.resumes >= 1
    np.testing.assert_array_equal(np.concatenate([c.codes for c in received]), codes)
    assert [c.seq for c in received] == list(range(len(received)))
    assert stream.end.reason == pb.END_REASON_EOS
    assert server.live_requests() == 0


def test_stream_that_is_not_resumable_is_cancelled_when_the_connection_breaks(replay_server_factory, proxy_factory):
    server = replay_server_factory(codes=random_codes(400), fps=100.0)
    proxy = proxy_factory(server.server.port)
    with Client(proxy.target) as client:
        stream = client.stream_codes("A long text.", resumable=False)
        next(stream)
        proxy.cut()
        with pytest.raises(Unavailable):  # a stream that is not resumable does not reattach
            list(stream)
        assert stream.resumes == 0
    assert server.wait_until(lambda: server.live_requests() == 0)


def test_detached_resumable_stream_is_stopped_after_the_resume_window(replay_server_factory, proxy_factory):
    server = replay_server_factory(codes=random_codes(4000), fps=100.0, limits=ServerLimits(resume_window_s=0.3))
    proxy = proxy_factory(server.server.port)
    with Client(proxy.target, resume_timeout_s=0) as client:
        stream = client.stream_codes("A long text.", resumable=True)
        next(stream)
        proxy.cut()
        assert server.wait_until(lambda: server.live_requests() == 0, timeout=5)
    assert server.wait_until(lambda: not server.service.sessions)

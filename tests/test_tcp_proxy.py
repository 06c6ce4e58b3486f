"""The tests' TCP proxy ends cleanly: a task it leaves pending is reported by the garbage collector
as an asyncio ERROR inside whichever test runs then (a download test that asserts no ERROR failed
so on CI, from a proxy another test had closed with a frozen connection)."""

from __future__ import annotations

import asyncio
import socket

from codecstream.testing.waiting import wait_for

from tests.tcp_proxy import CuttableProxy


def test_closing_the_proxy_ends_every_task_of_a_frozen_connection():
    with socket.create_server(("127.0.0.1", 0)) as upstream:  # the kernel accepts into its backlog
        proxy = CuttableProxy(upstream.getsockname()[1])
        with socket.create_connection(("127.0.0.1", proxy.port)) as client:
            client.sendall(b"hello")
            wait_for(lambda: proxy.bytes_to_upstream == 5, 10, "the connection's pumps running", step_s=0.01)
            proxy.freeze()
            proxy.close()
    assert proxy.loop.is_closed()
    assert not asyncio.all_tasks(proxy.loop)

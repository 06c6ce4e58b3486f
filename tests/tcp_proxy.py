"""A loopback TCP proxy whose connections a test can cut or freeze, to force real connection faults.

- `cut()`: both sides see a reset (RST), as when a NAT or a balancer drops the connection.
- `freeze()`: the proxy stops forwarding in both directions but keeps every socket open: a
  half-open connection (a peer that vanished without a FIN), which only keepalive can notice.
- `freeze_to_client()`: the proxy stops reading what the server sends: a client that never reads
  (TCP buffers fill, then the server's writes block).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class CuttableProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._to_upstream = asyncio.Event()
        self._to_client = asyncio.Event()
        self._to_upstream.set()
        self._to_client.set()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        self.target = f"127.0.0.1:{self.port}"

    async def _handle(self, client_reader, client_writer) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers |= {client_writer, upstream_writer}

        async def pump(reader, writer, flowing: asyncio.Event):
            with contextlib.suppress(Exception):
                while True:
                    await flowing.wait()
                    data = await reader.read(65536)
                    if not data:
                        break
                    await flowing.wait()
                    writer.write(data)
                    await writer.drain()
            writer.close()

        await asyncio.gather(
            pump(client_reader, upstream_writer, self._to_upstream),
            pump(upstream_reader, client_writer, self._to_client),
        )

    def cut(self) -> None:
        """Abort every open connection (both sides see a reset), keep accepting new ones."""

        def abort_all():
            self._to_upstream.set()
            self._to_client.set()
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()

        self.loop.call_soon_threadsafe(abort_all)

    def freeze(self) -> None:
        """Stop forwarding in both directions, sockets left open (a half-open connection)."""
        self.loop.call_soon_threadsafe(self._to_upstream.clear)
        self.loop.call_soon_threadsafe(self._to_client.clear)

    def freeze_to_client(self) -> None:
        """Stop reading from the server (a client that never reads); client-to-server still flows."""
        self.loop.call_soon_threadsafe(self._to_client.clear)

    def close(self) -> None:
        self.cut()
        self.loop.call_soon_threadsafe(self._server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

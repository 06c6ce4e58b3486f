"""A loopback TCP proxy whose connections a test can cut or freeze, to force real connection faults.

- `cut()`: both sides see a reset (RST), as when a NAT or a balancer drops the connection.
- `freeze()`: the proxy stops forwarding in both directions but keeps every socket open: a
  half-open connection (a peer that vanished without a FIN), which only keepalive can notice.
- `freeze_to_client()`: the proxy stops reading what the server sends: a client that never reads
  (TCP buffers fill, then the server's writes block); `thaw_to_client()` lets it flow again.
- `reject(count)` / `reject_for(seconds)`: new connections are accepted and reset at once, as
  while a network is still down: a client's reconnect attempts fail.
- `bytes_to_upstream`: what the clients sent the server, over every connection so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time


class _Link:
    """One proxied connection: its two sockets and whether each direction still flows."""

    def __init__(self, client_writer: asyncio.StreamWriter, upstream_writer: asyncio.StreamWriter) -> None:
        self.writers = (client_writer, upstream_writer)
        self.to_upstream = asyncio.Event()
        self.to_client = asyncio.Event()
        self.to_upstream.set()
        self.to_client.set()


class CuttableProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.loop = asyncio.new_event_loop()
        self._links: set[_Link] = set()
        self._rejects_left = 0
        self._reject_until = 0.0
        #: Connections reset by reject() / reject_for().
        self.rejected = 0
        self.bytes_to_upstream = 0
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        self.target = f"127.0.0.1:{self.port}"

    async def _handle(self, client_reader, client_writer) -> None:
        if self._rejects_left > 0 or time.monotonic() < self._reject_until:
            self._rejects_left = max(0, self._rejects_left - 1)
            self.rejected += 1
            client_writer.transport.abort()
            return
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        link = _Link(client_writer, upstream_writer)
        self._links.add(link)

        async def pump(reader, writer, flowing: asyncio.Event, upstream: bool):
            with contextlib.suppress(Exception):
                while True:
                    await flowing.wait()
                    data = await reader.read(65536)
                    if not data:
                        break
                    await flowing.wait()
                    writer.write(data)
                    if upstream:
                        self.bytes_to_upstream += len(data)
                    await writer.drain()
            writer.close()

        await asyncio.gather(
            pump(client_reader, upstream_writer, link.to_upstream, upstream=True),
            pump(upstream_reader, client_writer, link.to_client, upstream=False),
        )
        self._links.discard(link)

    def cut(self) -> None:
        """Abort every open connection (both sides see a reset), keep accepting new ones."""

        def abort_all():
            for link in list(self._links):
                for writer in link.writers:
                    writer.transport.abort()
                link.to_upstream.set()
                link.to_client.set()
            self._links.clear()

        self.loop.call_soon_threadsafe(abort_all)

    def reject(self, count: int) -> None:
        """Reset the next `count` connections as soon as they are made."""

        def set_count():
            self._rejects_left = count

        self.loop.call_soon_threadsafe(set_count)

    def reject_for(self, seconds: float) -> None:
        """Reset every connection made in the next `seconds`."""
        self._reject_until = time.monotonic() + seconds

    def freeze(self) -> None:
        """Stop forwarding on the open connections, sockets left open (half-open connections);
        connections made later flow normally."""

        def freeze_all():
            for link in self._links:
                link.to_upstream.clear()
                link.to_client.clear()

        self.loop.call_soon_threadsafe(freeze_all)

    def freeze_to_client(self) -> None:
        """Stop reading from the server on the open connections (clients that never read)."""

        def freeze_all():
            for link in self._links:
                link.to_client.clear()

        self.loop.call_soon_threadsafe(freeze_all)

    def thaw_to_client(self) -> None:
        """Undo freeze_to_client: the server's data flows to the clients again."""

        def thaw_all():
            for link in self._links:
                link.to_client.set()

        self.loop.call_soon_threadsafe(thaw_all)

    def close(self) -> None:
        """Stop accepting, reset every connection and end every task of the proxy before its loop
        stops: a task left pending (a frozen connection's pumps) is reported when the garbage
        collector finds it, as an asyncio ERROR inside whichever test runs then."""
        self.cut()

        async def end_tasks() -> None:
            self._server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(end_tasks(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()

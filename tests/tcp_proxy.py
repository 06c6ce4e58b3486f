"""A loopback TCP proxy whose connections a test can cut, to force real connection loss."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class CuttableProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
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

        async def pump(reader, writer):
            with contextlib.suppress(Exception):
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            writer.close()

        await asyncio.gather(pump(client_reader, upstream_writer), pump(upstream_reader, client_writer))

    def cut(self) -> None:
        """Abort every open connection (both sides see a reset), keep accepting new ones."""

        def abort_all():
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()

        self.loop.call_soon_threadsafe(abort_all)

    def close(self) -> None:
        self.cut()
        self.loop.call_soon_threadsafe(self._server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

"""A TCP relay to PostgreSQL that tests cut, stall and bring back: a server out of reach."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class Relay:
    """A TCP relay to PostgreSQL that can drop its connections, be cut, or stall; and come back."""

    def __init__(self, host: str, port: int) -> None:
        """Relay to ``host:port`` once started."""
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.port = 0

    @property
    def serving(self) -> bool:
        """Whether the relay listens."""
        return self._server is not None and self._server.is_serving()

    async def start(self) -> None:
        """Listen (on a free loopback port the first time, on the same one afterwards)."""
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def drop(self) -> None:
        """Close every relayed connection (as a server restart does), still listening."""
        for writer in list(self._writers):
            writer.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def cut(self) -> None:
        """Stop listening and close every relayed connection."""
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        await self.drop()

    def stall(self) -> None:
        """Keep every connection (and accept new ones) but forward no byte, either way."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forward again, starting with what was held during the stall."""
        self._flowing.set()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(client_w)
        try:
            server_r, server_w = await asyncio.open_connection(*self._target)
        except OSError:
            client_w.close()
            return
        self._writers.add(server_w)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    await self._flowing.wait()
                    dst.write(data)
                    await dst.drain()

        try:
            await asyncio.wait(
                [
                    asyncio.ensure_future(pipe(client_r, server_w)),
                    asyncio.ensure_future(pipe(server_r, client_w)),
                ],
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for writer in (client_w, server_w):
                writer.close()
                self._writers.discard(writer)
            self._tasks.discard(task)


@contextlib.asynccontextmanager
async def relay_to(postgres_url: str) -> AsyncIterator[Relay]:
    """A started relay to the PostgreSQL of ``postgres_url``; forwarding and cut at the end."""
    url = urlsplit(postgres_url)
    relay = Relay(url.hostname or "127.0.0.1", url.port or 5432)
    await relay.start()
    try:
        yield relay
    finally:
        relay.resume()
        with contextlib.suppress(Exception):
            await relay.cut()

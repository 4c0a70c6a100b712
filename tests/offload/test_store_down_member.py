"""A member whose payload store is down: its failed reference goes to a retry tier, not nowhere.

The store (S3Proxy behind a port this test opens and closes) refuses connections while the
member reads the message: the read fails (``OffloadError``, a transient failure) and the copy
for the retry tier needs no look at the store, since the reference says its object was written
moments ago. Before, that look failed too, the copy was never produced and the message was left
undelivered until the member restarted, however soon the store came back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from urllib.parse import urlparse

import obstore
import pytest
from obstore.store import S3Store
from offload.helpers import S3PROXY, closed_port, declared
from redis.asyncio import Redis
from runtime.helpers import FAST, eventually, lane_spec, running
from support import require_service

from pipeline.offload import reference as ref
from pipeline.offload.errors import OffloadError
from pipeline.offload.lazy import LazyPayload, read_body
from pipeline.offload.policy import OffloadPolicy
from pipeline.offload.store import PayloadStore
from pipeline.offload.writer import (
    REFRESH_AFTER_S,
    Offloader,
    OffloadingProducer,
    topic_policies,
)
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


class Switchable:
    """A loopback port that refuses connections until :meth:`open` forwards them to S3Proxy."""

    def __init__(self, target: tuple[str, int]) -> None:
        """A closed port for now; forwards to ``target`` (host, port) once opened."""
        self.port = closed_port()
        self._target = target
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        """Accept connections and forward them."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def close(self) -> None:
        """Refuse new connections and cut those open."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        pipes = list(self._pipes)
        for task in pipes:
            task.cancel()
        for task in pipes:
            with suppress(asyncio.CancelledError):
                await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(_pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65_536):
            writer.write(chunk)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def emptied(store: PayloadStore) -> None:
    """Delete every object under the store's prefix, and the directories S3Proxy lists."""
    for key in [obj.key async for obj in store.list()]:
        await store.delete(key)
    raw = S3Store.from_url(store.url, client_options={"allow_http": True}, region="us-east-1")
    # In a thread: the switch forwarding the request runs on this event loop.
    markers = await asyncio.to_thread(
        lambda: [m["path"] for page in obstore.list(raw) for m in page]
    )
    for key in [*sorted(markers, key=len, reverse=True), ""]:
        await store.delete(key)


@asynccontextmanager
async def s3_behind_a_switch(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Switchable]:
    """S3Proxy's credentials, its endpoint the switchable port (closed until opened)."""
    for name, value in S3PROXY.items():
        if not os.environ.get(name):
            monkeypatch.setenv(name, value)
    endpoint = urlparse(os.environ["AWS_ENDPOINT_URL"])
    host, port = endpoint.hostname or "127.0.0.1", endpoint.port or 9000
    require_service("s3proxy", host, port)
    switch = Switchable((host, port))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{switch.port}")
    try:
        yield switch
    finally:
        await switch.close()


async def test_a_store_down_while_a_member_reads_sends_the_message_to_its_retry_tier(
    transport: Transport, redis: Redis, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Store down at the read: one retry-tier copy, handled once the store is back, no restart."""
    payload = b"r" * 300_000
    async with s3_behind_a_switch(monkeypatch) as switch:
        url = f"s3://pipeline/test-{unique}"
        spec = lane_spec(
            f"s3down_{unique}",
            2,
            retry={"tiers": ["300ms"], "max_attempts": 20},
            offload={"above": "256KiB", "store": url},
        )
        offloader = Offloader(topic_policies([spec]))
        async with declared(transport, redis, unique, spec):
            await switch.open()
            producer = OffloadingProducer(transport.producer(), offloader)
            await producer.send(spec.name, payload, key=b"k")
            await producer.close()
            await switch.close()  # the store is down from here on

            got: list[bytes] = []
            app = App([spec])

            @app.handler(spec.lane)
            async def handle(event: bytes | LazyPayload, ctx: Context) -> None:
                got.append(await read_body(event))

            group = f"g-{unique}"
            member = Member(app, transport, group, FAST, redis=redis, redis_prefix=unique)
            try:
                async with running(member):
                    await eventually(lambda: member.stats.retried >= 1, timeout_s=30)
                    await switch.open()  # the store is back
                    await eventually(lambda: member.stats.handled == 1, timeout_s=30)
                assert got == [payload]
                assert member.stats.dead_lettered == 0
            finally:
                await transport.admin().delete_group(group, spec.topic_names())
                await switch.open()
                await emptied(offloader.store(url))


async def test_only_a_reference_written_within_a_day_goes_out_while_its_store_is_down(
    s3_down_port: int,
) -> None:
    """Store down: a copy of a reference written moments ago goes out; a day-old one waits."""
    url = "s3://pipeline/payloads"
    offloader = Offloader({"up": OffloadPolicy(above=1024, store=url)})
    now_ms = int(time.time() * 1000)
    fresh = dataclasses.replace(ref.reference_for(url, b"x" * 2048), written_ms=now_ms)
    await offloader.keep("up", *fresh.encode())  # no look at the store: it went out
    old_ms = int((time.time() - REFRESH_AFTER_S - 60) * 1000)
    for stale in (
        dataclasses.replace(fresh, written_ms=old_ms),
        ref.reference_for(url, b"y" * 2048),
    ):
        with pytest.raises(OffloadError, match=f"127.0.0.1:{s3_down_port}"):
            await offloader.keep("up", *stale.encode())

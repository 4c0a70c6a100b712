"""The dispatcher's close ends though a produce lost its cancellation (CPython issue 86296)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from contract.helpers import make_topic
from ingress.helpers import META, build, client, meta_body
from ingress.signing import hub_signature
from support import LosesFirstCancel

from pipeline.cancel_tasks import cancel_until_done
from pipeline.config import Settings
from pipeline.envelope import Delivered, Record
from pipeline.ingress.dispatch import Dispatcher
from pipeline.logstore import RowState, Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.transport import create_transport
from pipeline.transport.protocol import Producer

SECRET = "meta-app-secret"  # noqa: S105 - a test secret


class StalledProducer:
    """The real producer behind a broker that never answers, losing the first cancellation.

    On Python 3.11 ``asyncio.wait_for`` (redis-py writes under it, psycopg's pool waits under
    it) returns the result instead of raising when the cancellation lands as it arrives: the
    send then goes on waiting.
    """

    def __init__(self, inner: Producer) -> None:
        """Hold every send to ``inner``; nothing is sent."""
        self.inner = inner
        self.stall = LosesFirstCancel()

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:  # noqa: ARG002 - the protocol's signature
        """Wait for a broker that never answers; a first cancellation is lost on the way."""
        await self.stall.run()
        raise AssertionError("unreachable: the stall ends only by its cancellation")


async def test_close_ends_though_a_produce_lost_its_cancellation(
    tmp_path: Path,
    sqlite_store: SqliteLogStore,
    settings: Settings,
    redis_service: str,
    unique: str,
) -> None:
    """close() cancels the pumps again until they end; the ingress's stop used to wait for ever.

    The row stays ``received``, for the sweeper.
    """
    transport = create_transport(settings, "redis")
    topic = f"messages-{unique}"
    await make_topic(transport, topic, 1)
    sources = build(tmp_path, {"whatsapp": {**META, "topic": topic, "routes": []}}, {topic: "m"})
    stalled = StalledProducer(transport.producer())
    dispatcher = Dispatcher(stalled, sqlite_store)
    _, http = client(sources, sqlite_store, dispatcher)
    body = meta_body(0)
    async with http:
        answer = await http.post(
            "/hooks/whatsapp",
            content=body,
            headers={"x-hub-signature-256": hub_signature(SECRET, body)},
        )
    assert answer.json()["status"] == "accepted"
    await asyncio.wait_for(stalled.stall.running.wait(), 10)
    closing = asyncio.create_task(dispatcher.close(timeout_s=0.1))
    try:
        await asyncio.wait([closing], timeout=10)  # not wait_for: the close swallowed its cancel
        assert closing.done(), "the dispatcher's close still waits for its pump"
        assert stalled.stall.absorbed == 1
        assert await sqlite_store.count_by_state(Selection()) == {RowState.RECEIVED: 1}
    finally:
        await cancel_until_done(closing)  # a close that hung (the defect) does not outlive it
        await stalled.inner.close()
        await transport.close()

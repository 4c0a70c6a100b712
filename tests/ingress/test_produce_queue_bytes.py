"""The fast produce queue is bounded in bytes: past the cap, rows wait for the sweeper."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from contract.helpers import consume_until, make_topic
from ingress.helpers import META, build, client, meta_body
from ingress.signing import hub_signature

from pipeline.config import Settings, SweeperSettings
from pipeline.envelope import Record
from pipeline.ingress import headers as h
from pipeline.ingress.dispatch import Dispatcher
from pipeline.ingress.sweeper import Sweeper
from pipeline.logstore import RowState, Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.transport import create_transport
from pipeline.transport.protocol import Producer

SECRET = "meta-app-secret"  # noqa: S105 - a test secret
BODY_BYTES = 512 * 1024
CAP_BYTES = 2 * 1024 * 1024


class HeldProducer:
    """The real producer behind a gate: a send waits until the test opens it (a stalled broker)."""

    def __init__(self, inner: Producer) -> None:
        """Hold the sends to ``inner`` until :attr:`gate` is set."""
        self.inner = inner
        self.gate = asyncio.Event()

    async def send_many(self, topic: str, records: Sequence[Record]) -> None:
        """Wait for the gate, then send for real."""
        await self.gate.wait()
        await self.inner.send_many(topic, records)


class NeverHurry:
    """A lane backlog that is never backed up (this test does not exercise patience)."""

    async def is_backlogged(self, lane: str) -> bool:  # noqa: ARG002 - the protocol's signature
        """No lane is ever backed up."""
        return False


async def test_queue_holds_at_most_its_bytes_and_the_sweeper_produces_the_rest(
    tmp_path: Path,
    sqlite_store: SqliteLogStore,
    settings: Settings,
    redis_service: str,
    unique: str,
) -> None:
    """With the broker stalled the queue keeps at most its byte cap; every row is produced later."""
    transport = create_transport(settings, "redis")
    topic = f"messages-{unique}"
    await make_topic(transport, topic, 2)
    sources = build(tmp_path, {"whatsapp": {**META, "topic": topic, "routes": []}}, {topic: "m"})
    held = HeldProducer(transport.producer())
    dispatcher = Dispatcher(held, sqlite_store, queue_max=10_000, queue_max_bytes=CAP_BYTES)
    _, http = client(sources, sqlite_store, dispatcher)
    bodies = [meta_body(n, size=BODY_BYTES) for n in range(12)]
    async with http:
        for body in bodies:
            answer = await http.post(
                "/hooks/whatsapp",
                content=body,
                headers={"x-hub-signature-256": hub_signature(SECRET, body)},
            )
            assert answer.json()["status"] == "accepted"
    kept = dispatcher.waiting
    assert 0 < kept < len(bodies)
    assert kept * len(bodies[0]) <= CAP_BYTES
    assert dispatcher.waiting_bytes == kept * len(bodies[0])
    assert dispatcher.counters.overflowed == len(bodies) - kept

    held.gate.set()
    await dispatcher.close()
    assert (dispatcher.waiting, dispatcher.waiting_bytes) == (0, 0)
    counts = await sqlite_store.count_by_state(Selection())
    assert counts == {RowState.PRODUCED: kept, RowState.RECEIVED: len(bodies) - kept}
    sweeper = Sweeper(
        sqlite_store,
        transport.producer(),
        NeverHurry(),
        {"m": [topic]},
        SweeperSettings(unproduced_after_s=0.001),
    )
    report = await sweeper.sweep_once()
    assert (report.produced, report.failed) == (len(bodies) - kept, 0)
    assert await sqlite_store.count_by_state(Selection()) == {RowState.PRODUCED: len(bodies)}

    consumer = transport.consumer(f"g-{unique}", [topic])
    got = await consume_until(consumer, lambda r: len(r) >= len(bodies))
    await consumer.close()
    await transport.close()
    events = sorted(m.headers[h.EVENT_ID].decode() for m in got)
    assert events == sorted(f"wamid.{n}" for n in range(len(bodies)))

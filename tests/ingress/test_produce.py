"""After the answer: events are produced keyed with their headers, even across a broker outage."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from contract.helpers import consume_until, make_topic
from ingress.helpers import META, build, client, meta_body
from ingress.redis_server import RedisServer
from ingress.signing import hub_signature

from pipeline.config import Settings, SweeperSettings
from pipeline.envelope import Message
from pipeline.ingress import headers as h
from pipeline.ingress.dispatch import Dispatcher
from pipeline.ingress.sweeper import Sweeper
from pipeline.logstore import RowState, Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport

SECRET = "meta-app-secret"  # noqa: S105 - a test secret


def signed(body: bytes) -> dict[str, str]:
    """Headers of a Meta delivery of ``body``."""
    return {"x-hub-signature-256": hub_signature(SECRET, body)}


async def wait_until_states(
    store: SqliteLogStore, expected: dict[RowState, int], timeout_s: float = 30.0
) -> None:
    """Poll the store until its rows are in ``expected`` states; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (counts := await store.count_by_state(Selection())) != expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"rows are {counts}, expected {expected}")
        await asyncio.sleep(0.05)


class NeverHurry:
    """A lane backlog that is never backed up (these tests do not exercise patience)."""

    async def is_backlogged(self, lane: str) -> bool:  # noqa: ARG002 - the protocol's signature
        """No lane is ever backed up."""
        return False


async def test_accepted_events_are_produced_keyed_and_marked(
    tmp_path: Path, sqlite_store: SqliteLogStore, transport: Transport, unique: str
) -> None:
    """Each accepted webhook becomes one keyed event with its headers; its row turns produced."""
    topic = f"messages-{unique}"
    await make_topic(transport, topic, 2)
    sources = build(tmp_path, {"whatsapp": {**META, "topic": topic, "routes": []}}, {topic: "m"})
    dispatcher = Dispatcher(transport.producer(), sqlite_store)
    _, http = client(sources, sqlite_store, dispatcher)
    bodies = [meta_body(n) for n in range(20)]
    async with http:
        answers = await asyncio.gather(
            *(http.post("/hooks/whatsapp", content=b, headers=signed(b)) for b in bodies)
        )
    assert all(a.json()["status"] == "accepted" for a in answers)
    await wait_until_states(sqlite_store, {RowState.PRODUCED: 20})
    await dispatcher.close()
    consumer = transport.consumer(f"g-{unique}", [topic])
    got = await consume_until(consumer, lambda r: len(r) >= 20)
    await consumer.close()
    by_event = {m.headers[h.EVENT_ID].decode(): m for m in got}
    assert sorted(by_event) == sorted(f"wamid.{n}" for n in range(20))
    first = by_event["wamid.3"]
    assert first.value == bodies[3]
    assert first.key == b"wa-3"
    assert first.headers[h.TENANT] == b"biz-1"
    assert first.headers[h.SOURCE] == b"whatsapp"
    assert first.headers[h.REPLAY_COUNT] == b"0"
    row = await sqlite_store.get(first.headers[h.ROW_ID].decode())
    assert row is not None
    assert row.event_id == "wamid.3"


@pytest.fixture
async def private_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A redis-server of this test's own, stoppable and restartable."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


async def test_broker_down_during_a_burst_loses_nothing(
    tmp_path: Path,
    sqlite_store: SqliteLogStore,
    settings: Settings,
    private_redis: RedisServer,
    unique: str,
) -> None:
    """With the broker down every webhook is still accepted; after it returns all are produced."""
    topic = f"messages-{unique}"
    broker_settings = settings.model_copy(
        update={"redis": settings.redis.model_copy(update={"url": private_redis.url})}
    )
    transport = create_transport(broker_settings, "redis")
    await make_topic(transport, topic, 2)
    sources = build(tmp_path, {"whatsapp": {**META, "topic": topic, "routes": []}}, {topic: "m"})
    dispatcher = Dispatcher(transport.producer(), sqlite_store)
    app, http = client(sources, sqlite_store, dispatcher)

    private_redis.stop()
    down = [meta_body(n) for n in range(100)]
    async with http:
        answers = await asyncio.gather(
            *(http.post("/hooks/whatsapp", content=b, headers=signed(b)) for b in down)
        )
        assert [a.status_code for a in answers] == [200] * 100
        deadline = time.monotonic() + 30
        while dispatcher.counters.failed < 100:
            assert time.monotonic() < deadline, dispatcher.counters
            await asyncio.sleep(0.05)
        assert await sqlite_store.count_by_state(Selection()) == {RowState.RECEIVED: 100}

        private_redis.start()
        back = [meta_body(n) for n in range(100, 110)]
        for body in back:
            assert (
                await http.post("/hooks/whatsapp", content=body, headers=signed(body))
            ).is_success
    await wait_until_states(sqlite_store, {RowState.RECEIVED: 100, RowState.PRODUCED: 10})

    sweeper = Sweeper(
        sqlite_store,
        transport.producer(),
        NeverHurry(),
        {"m": [topic]},
        SweeperSettings(unproduced_after_s=0.001),
    )
    report = await sweeper.sweep_once()
    assert (report.produced, report.failed) == (100, 0)
    assert await sqlite_store.count_by_state(Selection()) == {RowState.PRODUCED: 110}
    await dispatcher.close()

    consumer = transport.consumer(f"g-{unique}", [topic])
    got: list[Message] = await consume_until(consumer, lambda r: len(r) >= 110)
    await consumer.close()
    await transport.close()
    events = [m.headers[h.EVENT_ID].decode() for m in got]
    assert sorted(events) == sorted(f"wamid.{n}" for n in range(110))
    assert app.counters["whatsapp", "accepted"] == 110

"""The Retry-After of a 503: short after an idle spell and at a cold start, growing if stalled."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import subprocess
from pathlib import Path

import pytest
from ingress.helpers import (
    META,
    build,
    ingress_env,
    meta_body,
    serve_until_listening,
    write_whatsapp_source,
)
from ingress.signing import hub_signature
from logstore.helpers import FakeClock

from pipeline.ingress.app import IngressApp
from pipeline.ingress.slots import COLD_START_RETRY_AFTER_S, SourceSlots
from pipeline.logstore.sqlite import SqliteLogStore

SECRET = "retry-after-secret"  # noqa: S105 - a test secret
SLOTS = 4
BURST = 100


@pytest.fixture
def env(tmp_path: Path, redis_service: str, unique: str) -> dict[str, str]:
    """An ingress on SQLite and the shared Redis: 4 slots, shedding at once, a topic of its own."""
    write_whatsapp_source(tmp_path, f"messages-{unique}", SECRET)
    return ingress_env(
        tmp_path,
        redis_service,
        PIPELINE_INGRESS__ADMISSION__MAX_IN_FLIGHT=str(SLOTS),
        PIPELINE_INGRESS__ADMISSION__QUEUE_TIMEOUT_MS="0",
    )


def _request(url: str, n: int) -> bytes:
    body = meta_body(n)
    host = url.removeprefix("http://")
    head = (
        f"POST /hooks/whatsapp HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"x-hub-signature-256: {hub_signature(SECRET, body)}\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


async def burst(url: str, first: int) -> list[tuple[int, int | None]]:
    """BURST deliveries on connections opened beforehand, sent at once: (status, Retry-After)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connections = [await asyncio.open_connection(host, int(port)) for _ in range(BURST)]
    for n, (_, writer) in enumerate(connections):
        writer.write(_request(url, first + n))
    answers = []
    for reader, writer in connections:
        head = (await reader.readuntil(b"\r\n\r\n")).decode().lower().split("\r\n")
        status = int(head[0].split()[1])
        fields = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
        retry_after = fields.get("retry-after")
        answers.append((status, int(retry_after) if retry_after is not None else None))
        writer.close()
        await writer.wait_closed()
    return answers


def _retry_afters(answers: list[tuple[int, int | None]]) -> list[int]:
    assert {status for status, _ in answers} <= {200, 503}, answers
    shed = [retry_after for status, retry_after in answers if status == 503]
    assert shed, "the burst was not shed at all: it did not exceed the slots"
    assert None not in shed
    return [s for s in shed if s is not None]


async def test_a_burst_after_a_cold_start_or_an_idle_spell_is_told_to_come_back_soon(
    env: dict[str, str], started: list[subprocess.Popen[str]]
) -> None:
    """A burst the ingress clears in a moment is not told to wait long, cold or after idling."""
    _, url = serve_until_listening(env, started)
    cold = _retry_afters(await burst(url, 0))
    assert max(cold) <= 5, cold
    await asyncio.sleep(3)  # the idle spell under test, not a wait for anything
    idle = _retry_afters(await burst(url, BURST))
    assert max(idle) <= 5, idle


def test_the_cold_start_answer_is_the_documented_default_not_the_maximum() -> None:
    """Before anything completed, Retry-After is the small documented default."""
    clock = FakeClock(0.0)
    slots = SourceSlots(max_in_flight=2, queue_timeout_ms=0, max_retry_after_s=60, clock=clock)
    assert asyncio.run(slots.acquire())
    assert slots.retry_after_s() == COLD_START_RETRY_AFTER_S


def test_an_idle_spell_keeps_the_rate_last_drained_at() -> None:
    """Minutes of idling do not turn a 100-a-second drain into a long Retry-After."""
    clock = FakeClock(0.0)
    slots = SourceSlots(max_in_flight=50, queue_timeout_ms=0, max_retry_after_s=60, clock=clock)

    async def drain(count: int, every_s: float) -> None:
        for _ in range(count):
            assert await slots.acquire()
            clock.advance(every_s)
            slots.release()

    asyncio.run(drain(200, 0.01))
    clock.advance(300)
    asyncio.run(_fill(slots))
    assert slots.retry_after_s() == 1  # 50 ahead at about 100 a second


def test_retry_after_grows_under_sustained_overload() -> None:
    """A drain slowed to 5 a second with 50 ahead answers about 10 s, and more as it stalls."""
    clock = FakeClock(0.0)
    slots = SourceSlots(max_in_flight=50, queue_timeout_ms=0, max_retry_after_s=60, clock=clock)
    asyncio.run(_fill(slots))
    for _ in range(50):  # every slot taken, one completing each 0.2 s, taken again at once
        clock.advance(0.2)
        slots.release()
        assert asyncio.run(slots.acquire())
    slow = slots.retry_after_s()
    assert 8 <= slow <= 12, slow  # 50 ahead at 5 a second
    clock.advance(3)  # nothing completes
    assert slots.retry_after_s() > 2 * slow


def test_a_source_stalled_from_the_start_is_told_to_wait_longer_as_it_stays_stalled() -> None:
    """With nothing ever completing, the cold default grows with the time the work has waited."""
    clock = FakeClock(0.0)
    slots = SourceSlots(max_in_flight=2, queue_timeout_ms=0, max_retry_after_s=60, clock=clock)
    asyncio.run(_fill(slots))
    clock.advance(30)
    assert slots.retry_after_s() >= 30


async def _fill(slots: SourceSlots) -> None:
    while await slots.acquire():
        pass


class TickingClock:
    """A monotonic clock that moves 10 ms each time it is read: each request spans 10 ms."""

    def __init__(self) -> None:
        """Start at zero."""
        self.now_s = 0.0

    def __call__(self) -> float:
        """The time, then 10 ms later."""
        self.now_s += 0.01
        return self.now_s


async def test_a_log_store_that_fails_every_insert_does_not_count_as_draining(
    tmp_path: Path, sqlite_store: SqliteLogStore
) -> None:
    """With every insert failing, the 503s are no drain: the shed Retry-After grows, not 1 s."""
    sources = build(
        tmp_path,
        {"whatsapp": {**META, "secrets": [SECRET], "routes": []}},
        {"messages": "messages"},
    )
    slots = SourceSlots(
        max_in_flight=50, queue_timeout_ms=0, max_retry_after_s=60, clock=TickingClock()
    )
    source = dataclasses.replace(sources["whatsapp"], admission=slots)
    app = IngressApp({"whatsapp": source}, sqlite_store, None)

    async def deliver(first: int, count: int) -> set[int]:
        statuses = set()
        for n in range(first, first + count):
            body = meta_body(n)
            headers = {"x-hub-signature-256": hub_signature(SECRET, body)}
            statuses.add((await app.webhook(source, headers, body))[0])
        return statuses

    assert await deliver(0, 100) == {200}  # a drain measured: each request in hand 10 ms
    with sqlite3.connect(tmp_path / "ingress.db") as db:  # the database now refuses every row
        db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON ingress_log "
            "BEGIN SELECT RAISE(ABORT, 'disk full'); END"
        )
    assert await deliver(100, 300) == {503}  # 3 s of work in hand, none of it stored
    await _fill(slots)
    assert slots.retry_after_s() >= 5  # the store's own 503 says 5 s; the shed say no less

"""A ``pl-due-ms`` header on a message read from a lane's main topic is no retry copy's due time.

Only the retry router writes ``pl-due-ms``, on retry-tier topics. Any producer can write it to
a main topic too (a retry copy pasted back, a replay tool, a hostile tenant): such a message is
new work, run in its key's order, not held as a copy behind which its key's later messages
overtake it.
"""

from __future__ import annotations

import time

from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, flaky_head, lane_spec, produce, running

from pipeline import headers as h
from pipeline.envelope import Message, Record
from pipeline.runtime.batch import BatchGate
from pipeline.runtime.member import Member
from pipeline.runtime.sojourn import deadline_ms, due_since_ms
from pipeline.topics.spec import BatchPolicy
from pipeline.transport.protocol import Transport

_FAR = str(int(time.time() * 1000) + 3_600_000).encode()
"""A due time an hour ahead."""


async def test_a_main_topic_message_with_a_due_time_keeps_its_keys_order(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Behind a parked head, a main-topic message due in an hour runs before its key's next.

    ``a1`` fails once (its key parked behind its retry copy), ``a2`` carries ``pl-due-ms`` an
    hour ahead, ``a3`` none: the key runs a1, a2, a3, and ``a2`` is not held an extra tier.
    """
    spec = lane_spec(f"duemain_{unique}", 1, retry={"tiers": ["300ms"]})
    await declare(transport, spec)
    app, completed, _ = flaky_head(spec, failures=1)

    await produce(
        transport,
        spec.name,
        [
            Record(b"a1", b"a"),
            Record(b"a2", b"a", {h.DUE_MS: _FAR}),
            Record(b"a3", b"a"),
            Record(b"b1", b"b", {h.DUE_MS: _FAR}),
            Record(b"b2", b"b"),
        ],
    )
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: len(completed[b"a"]) == 3 and len(completed[b"b"]) == 2)
    assert completed[b"b"] == [b"b1", b"b2"]
    assert completed[b"a"] == [b"a1", b"a2", b"a3"]
    assert member.stats.retried == 1


def _message(topic: str, headers: dict[str, bytes]) -> Message:
    return Message(topic, 0, 7, b"k", b"v", headers, timestamp_ms=1_000_000)


def test_a_main_topic_due_time_moves_no_deadline() -> None:
    """``max_age`` counts from a main-topic message's production, whatever its ``pl-due-ms``."""
    spec = lane_spec("agelane", 1, max_age="1m")
    forged = _message("agelane", {h.DUE_MS: _FAR})
    assert due_since_ms(forged) == 1_000_000
    assert deadline_ms(forged, spec) == 1_000_000 + 60_000
    copy = _message("agelane.retry.5s", {h.DUE_MS: b"2000000"})
    assert due_since_ms(copy) == 2_000_000


def test_a_main_topic_due_time_starts_no_earlier_sla() -> None:
    """A main-topic message is new work: its SLA clock starts with it, not at a copy's header."""
    headers = {h.DUE_MS: _FAR, h.SLA_FROM_MS: b"5", h.PRODUCED_AT_MS: b"5"}
    assert h.sla_from_ms(headers, 1_000_000, topic="lane") == 1_000_000
    assert h.sla_from_ms(headers, 1_000_000, topic="lane.retry.5s") == 5


def test_a_batch_lane_takes_a_main_topic_due_time_for_fresh_work() -> None:
    """Told it is no copy, the batch gate neither puts it ahead nor promotes it by the header.

    Its headers claim an SLA started at the epoch's first milliseconds: a copy's would be
    promoted at once on a busy member; fresh work waits for idle capacity.
    """
    policy = BatchPolicy.model_validate({"idle_below": 0.5, "sla": "10s", "promote_at": 0.5})
    started: list[int] = []
    gate: BatchGate[Message] = BatchGate(
        lambda m: started.append(m.offset), lambda: (4, 4), clock_ms=lambda: 1_000_100
    )
    headers = {h.DUE_MS: b"1000000", h.SLA_FROM_MS: b"5", h.PRODUCED_AT_MS: b"5"}
    gate.offer(_message("bulk", headers), "bulk", policy, copy=False)
    assert started == []
    gate.offer(_message("bulk.retry.1s", headers), "bulk", policy, copy=True)
    assert started == [7]


def test_the_batch_gate_judges_a_message_it_is_not_told_about_by_its_topic() -> None:
    """Without ``copy=``, the batch gate follows the chain's rule: a copy is read from a tier."""
    policy = BatchPolicy.model_validate({"idle_below": 0.5, "sla": "10s", "promote_at": 0.5})
    started: list[int] = []
    gate: BatchGate[Message] = BatchGate(
        lambda m: started.append(m.offset), lambda: (4, 4), clock_ms=lambda: 1_000_100
    )
    headers = {h.DUE_MS: b"1000000", h.SLA_FROM_MS: b"5", h.PRODUCED_AT_MS: b"5"}
    gate.offer(_message("bulk", headers), "bulk", policy)
    assert started == []
    gate.offer(_message("bulk.retry.1s", headers), "bulk", policy)
    assert started == [7]

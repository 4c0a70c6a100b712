"""A lane whose main topic ends in ``.retry`` keeps its copies' ids across its retry tiers.

A main topic may end in ``.retry`` (only ``.retry.`` is reserved), so its tiers are
``<name>.retry.retry.<delay>``. The guard must still read such a tier's copy as the message it
came from: otherwise the copy runs as a new message, and on an ordered lane it is held behind
its own parked head, which never comes, with every later message of its key.
"""

from __future__ import annotations

from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, flaky_head, lane_spec, running

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


def test_a_copy_on_a_tier_of_a_retry_named_topic_names_its_origin() -> None:
    """Its origin (the main topic, or a tier of it) is accepted; another lane's is not."""
    main = "pay.retry"
    tier = "pay.retry.retry.200ms"
    on_main = {h.ORIGIN_TOPIC: main.encode(), h.ORIGIN_PARTITION: b"0", h.ORIGIN_OFFSET: b"5"}
    on_tier = {**on_main, h.ORIGIN_TOPIC: tier.encode()}
    assert h.origin(tier, on_main) == "pay.retry:0:5"
    assert h.origin(tier, on_tier) == f"{tier}:0:5"
    # A message read from the main topic is no copy, whatever its headers say: only the retry
    # router writes them, on its tiers and dead-letter topic, and a redrive removes them; on the
    # main topic another producer wrote them (tests/retry/test_main_topic_copy_headers.py).
    assert h.origin(main, on_main) is None
    assert h.origin(main, on_tier) is None
    # Lane ``pay``'s tier (``pay.retry.200ms``) and main topic are no positions of ``pay.retry``.
    assert h.origin(tier, {**on_main, h.ORIGIN_TOPIC: b"pay.retry.200ms"}) is None
    assert h.origin(main, {**on_main, h.ORIGIN_TOPIC: b"pay"}) is None
    # And ``pay.retry``'s positions are none of lane ``pay``'s.
    assert h.origin("pay.retry.200ms", on_main) is None
    assert h.origin("pay.retry.200ms", on_tier) is None
    assert h.origin("pay", on_tier) is None


async def test_an_ordered_lane_named_dot_retry_retries_in_order(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Its failed head's copy runs as that head, and the key's next message runs after it."""
    spec = lane_spec(
        f"pay_{unique}.retry",
        1,
        lane=f"pay_{unique}",
        dead_letter=f"pay_{unique}-dlq",
        retry={"tiers": ["200ms"], "max_attempts": 3},
    )
    await declare(transport, spec)
    app, completed, attempts = flaky_head(spec, failures=1)

    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"a1", b"a"), Record(b"a2", b"a")])
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: len(completed[b"a"]) == 2, timeout_s=30)
    assert completed[b"a"] == [b"a1", b"a2"]
    assert attempts == [1, 2]
    assert member.stats.retried == 1

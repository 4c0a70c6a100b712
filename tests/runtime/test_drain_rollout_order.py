"""A lane left without its retry tiers, rolled out while members of the old declaration still run.

During the rollout the old members still read the tier its parked head's copy waits in: that
copy comes back and runs as the key's head, and its end releases the followers in order. A new
member's reap tick must not release the followers first (the head would then run after them).
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from runtime.guard_parts import Handlers, main_message, member_guard, retry_copy, routing_guard
from runtime.helpers import eventually, lane_spec

from pipeline.runtime import App, Context
from pipeline.runtime.app import Lane


def _lane(name: str, **fields: object) -> Lane:
    """The lane ``name`` as one release declares it (its handler is never called)."""
    app = App([lane_spec(name, 1, **fields)])

    @app.handler(name)
    async def handle(event: bytes, ctx: Context) -> None:
        raise AssertionError("the handler stage is replaced in these tests")

    return app.lanes[name]


async def test_a_new_member_does_not_release_followers_of_a_head_an_old_member_still_retries(
    redis: Redis, unique: str, prefix: str
) -> None:
    """Old members: ordered with a 1 h tier. New members: the same lane, its tier removed.

    X failed into the 1 h tier (its key parked), Y is held behind it. A new member's reap tick
    comes before X's copy is due; the old member then reads X's copy from the tier.
    """
    old = _lane(f"roll_{unique}", retry={"tiers": ["1h"]})
    new = _lane(old.name)
    assert new.spec.ordered
    assert not new.routes.retry_topics
    a, runs = routing_guard(redis, prefix, old, b"x")
    assert await a.run(old, main_message(old, 0, b"x")) == "retried"
    await a.flush()
    assert await a.run(old, main_message(old, 1, b"y")) == "parked"
    handlers = Handlers()
    b = member_guard(redis, prefix, new, handlers, "b")
    await b.tick({new.name: new})
    await asyncio.gather(*b._reaped)
    # X's copy still comes back from the tier the old members read: Y must wait for it.
    assert [value for _, value, _, _ in handlers.runs] == [], "Y ran before X's copy"
    assert await a.run(old, retry_copy(old, 0, 0, b"x")) == "handled"
    await eventually(lambda: runs == [b"x", b"x", b"y"])
    await a.close()
    await b.close()

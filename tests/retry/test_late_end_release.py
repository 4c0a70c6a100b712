"""An end sent again once Redis answers does not take another member's release over.

A member whose end on a parked key got no answer (Redis unreachable) sends it again at its next
tick (``RunGuard._record_again``), since that end is what releases the key's held followers. By
then the key may have been parked anew and its followers be running in another member's
release: the late end of a message that is not among the key's parked messages must release
nothing, or the followers would run in both members at once.
"""

from __future__ import annotations

from redis.asyncio import Redis
from retry.test_marks_outage import guard, ordered_lane, start_of

from pipeline.envelope import Message
from pipeline.retry.guard_store import KeyEnds, Start
from pipeline.retry.keys import encode_key

KEY = encode_key(b"k")


def main(spec_name: str, offset: int) -> tuple[Start, Message]:
    """A first delivery of key ``k`` at ``offset`` of the main topic: its start and message."""
    at = f"{spec_name}:0:{offset}"
    return Start(at, KEY, at, ordered=True), Message(spec_name, 0, offset, b"k", b"v")


async def test_a_late_end_leaves_another_members_release_alone(redis: Redis, unique: str) -> None:
    """k:6 parked the key, k:7 is held; k:6's copy releases k:7 to member A: B's late end waits."""
    spec = ordered_lane(unique)
    a, b = guard(redis, unique, spec), guard(redis, unique, spec)
    late, _ = main(spec.name, 5)  # ran on B, its key then unparked; its end got no answer
    assert await start_of(b, late) == "process"
    head, _ = main(spec.name, 6)
    assert await start_of(a, head) == "process"
    assert await a.route(head, 2, park=True)
    follower, message = main(spec.name, 7)
    assert await start_of(a, follower, message) == "held"
    await a.begin_many([head.end_line + "\t1"], [])
    copy = Start(head.ident, KEY, f"{spec.name}.retry.5s:0:0", ordered=True, attempt=2)
    assert await start_of(a, copy) == "head"
    [released] = await a.end_many([KeyEnds([(copy, "done")], follow_dead=False)])
    assert [r.ident for r in released] == [follower.ident]
    # Redis answers B again: its end is sent again while A runs k:7.
    assert await b.end_many([KeyEnds([(late, "done")], follow_dead=False)]) == [[]], (
        "a late end took over the release A holds: k:7 would run in both members"
    )
    rel = Start(follower.ident, KEY, "rel", ordered=True, attempt=0)
    assert await a.end_many([KeyEnds([(rel, "done")], follow_dead=False)]) == [[]]
    assert await a.parked_count() == 0

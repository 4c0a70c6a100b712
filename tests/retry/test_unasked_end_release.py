"""The end of a parked key's message that is not its head leaves another member's release alone.

While Redis does not answer, the guard fails open: a message of a parked key may run unasked,
fail, and be parked behind the key's head once its end reaches Redis; its retry copy, let
through unasked too, ends in ``gd_end_many`` (``RunGuard`` sends such a copy's end there, as it
may be a head). By then the key's followers may be running in another member's release: that
end leaves the parked set, and must release nothing, or a follower would run in both members.
"""

from __future__ import annotations

from redis.asyncio import Redis
from retry.test_late_end_release import KEY, main
from retry.test_marks_outage import guard, ordered_lane, start_of

from pipeline.retry.guard_store import Ending, KeyEnds, Start


async def test_an_end_behind_the_head_leaves_the_release_in_progress_alone(
    redis: Redis, unique: str
) -> None:
    """k:1 and k:2 are released to A; k:9, parked behind them unasked, ends on B: no release."""
    spec = ordered_lane(unique)
    a, b = guard(redis, unique, spec), guard(redis, unique, spec)
    head, _ = main(spec.name, 0)
    assert await start_of(a, head) == "process"
    assert await a.route(head, 2, park=True)
    for offset in (1, 2):
        follower, message = main(spec.name, offset)
        assert await start_of(a, follower, message) == "held"
    await a.begin_many([head.end_line + "\t1"], [])
    copy = Start(head.ident, KEY, f"{spec.name}.retry.5s:0:0", ordered=True, attempt=2)
    assert await start_of(a, copy) == "head"
    [released] = await a.end_many([KeyEnds([(copy, "done")], follow_dead=False)])
    assert [r.ident for r in released] == [f"{spec.name}:0:1", f"{spec.name}:0:2"]
    # k:9 ran unasked (Redis silent), failed: its end parks it behind the key's followers.
    late, _ = main(spec.name, 9)
    assert await b.end_many([KeyEnds([(late, "parked")], follow_dead=False)]) == [[]]
    # Its copy, let through unasked too, succeeds: its end reaches Redis while A runs k:1.
    late_copy = Start(late.ident, KEY, f"{spec.name}.retry.5s:0:1", ordered=True, attempt=2)
    assert await b.end_many([KeyEnds([(late_copy, "done")], follow_dead=False)]) == [[]], (
        "k:9's end took over the release A holds: k:1 would run in both members"
    )
    ends: list[tuple[Start, Ending]] = [
        (Start(r.ident, KEY, "rel", ordered=True, attempt=0), "done") for r in released
    ]
    assert await a.end_many([KeyEnds(ends, follow_dead=False)]) == [[]]  # A's release ends
    assert await a.parked_count() == 0

"""Work in the members' Redis that a changed declaration leaves with no member to release it.

Held followers and debounce buffers are left there by a real member, then looked for.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import yaml
from pydantic import BaseModel
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running
from support import run_pipeline

from pipeline.envelope import Record
from pipeline.retry.keys import guard_keys
from pipeline.runtime import App, Context
from pipeline.runtime.eviction import warn_stranded
from pipeline.runtime.member import Member
from pipeline.topics.stranded import stranded_in_redis
from pipeline.transport.protocol import Transport


async def test_followers_parked_on_a_renamed_lane_are_named_on_an_unordered_one_not(
    transport: Transport, redis: Redis, unique: str, tmp_path: Path
) -> None:
    """A lane renamed while a key is parked is named by apply; one made unordered is not.

    A member of the unordered lane drains the key itself (test_lane_drained); a renamed lane's
    followers are read by no member.
    """
    before = lane_spec(f"park_{unique}", 1, retry={"tiers": ["3s"]})
    await declare(transport, before)
    prefix = f"t{unique}"
    ran: dict[bytes, list[bytes]] = defaultdict(list)

    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"a1" and ctx.attempt == 1:
            raise RuntimeError("dependency down")
        ran[ctx.message.key or b""].append(event)

    app = App([before])
    app.handler(before.lane)(handle)
    await produce(transport, before.name, [Record(b"a1", b"a"), Record(b"a2", b"a")])
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
    async with running(member):  # stopped before a1's copy is due: a2 waits held in Redis
        await eventually(lambda: member.stats.retried == 1 and member.stats.parked == 1)
    assert await stranded_in_redis(redis, prefix, [before]) == []

    unordered = before.model_copy(update={"ordered": False})
    app = App([unordered])
    app.handler(unordered.lane)(handle)
    assert await redis.hlen(guard_keys(prefix, before.lane).parked) == 1

    # Still declared, unordered now: its members release what it parked (test_lane_drained.py).
    assert await stranded_in_redis(redis, prefix, [unordered]) == []
    assert await warn_stranded(redis, prefix, list(app.lanes.values())) == []
    renamed = before.model_copy(update={"lane": f"renamed_{unique}"})
    said = await stranded_in_redis(redis, prefix, [renamed])
    parked = f"{{{prefix}:guard:{before.lane}}}:parked"
    assert said == [
        (
            f"lane {before.lane!r}: 1 key(s) parked in Redis ({parked}) with followers held"
            " behind them, but no declaration names the lane now (renamed or removed), so no"
            f" member releases them: declare lane {before.lane!r} again and run its members"
            " until pipeline status shows nothing held, then make the change"
        )
    ]
    # `pipeline topics apply` of the renamed declaration says so on stderr, as printed.
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "lane.yaml").write_text(
        yaml.safe_dump(
            {
                "name": before.name,
                "lane": renamed.lane,
                "partitions": 1,
                "retry": {"tiers": ["3s"]},
            }
        ),
        encoding="utf-8",
    )
    env = {
        **os.environ,
        "PIPELINE_TOPICS_DIR": str(topics),
        "PIPELINE_REDIS__KEY_PREFIX": prefix,
    }
    applied = run_pipeline("topics", "apply", "--dry-run", "-t", transport.name, env=env)
    assert applied.returncode == 0, applied.stderr
    assert f"warning: {said[0]}" in applied.stderr.splitlines()
    # Declared as it was, the parked key is its members' to release: nothing to say.
    assert await stranded_in_redis(redis, prefix, [before]) == []


class Said(BaseModel):
    """One message of a conversation."""

    conversation_id: str


async def test_buffers_of_a_lane_no_longer_debounced_are_named(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """A conversation buffered for its turn, then the lane's debounce removed: one line."""
    quiet = {"key": "conversation_id", "quiet_s": 3600, "max_wait_s": 3600}
    spec = lane_spec(f"deb_{unique}", 1, debounce=quiet)
    await declare(transport, spec)
    prefix = f"t{unique}"
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        del events, ctx

    body = Said(conversation_id="c1").model_dump_json().encode()
    await produce(transport, spec.name, [Record(body, b"c1")])
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.buffered == 1)
    assert await stranded_in_redis(redis, prefix, [spec]) == []
    plain = spec.model_copy(update={"debounce": None})
    [line] = await stranded_in_redis(redis, prefix, [plain])
    due = f"{{{prefix}:deb:{spec.lane}}}:due"
    assert line.startswith(
        f"lane {spec.lane!r}: 1 conversation(s) buffered in Redis ({due}), but the lane is no"
        " longer debounced, so no member turns them"
    )

"""``pipeline topics apply`` that creates a lane's main topic anew names the guard keys left.

The guard remembers finished messages by where they were first delivered
(``topic:partition:offset``). A topic deleted and created again gives those positions out again,
so while the lane's guard keys stay in Redis a retry copy of a new message at a reused position
is taken for a late duplicate and dropped (docs/runtime.md). Apply said nothing of it: the first
sign was the guard's WARNING, after a message was lost. Now the apply that creates the topic
says so at once, one line per lane, with the keys to delete; it deletes nothing itself.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running
from support import delete_after_test, run_pipeline

from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport

_LANE: dict[str, Any] = {"partitions": 1, "retry": {"tiers": ["3s"]}}
"""Each lane of the test: one partition and one retry tier (the yaml says the same)."""


def _stale_line(spec: TopicSpec, tag: str) -> str:
    return (
        f"warning: lane {spec.lane!r}: topic {spec.name} was just created while Redis still"
        f" holds the lane's guard keys ({tag}*), which remember finished messages by where"
        " they were first delivered (topic:partition:offset); the new topic gives those"
        " positions out again, so a retry copy of a new message at such a position would be"
        " taken for a late duplicate and dropped: delete the lane's guard keys"
        f" ({tag}*) while no member of the lane runs (redis-cli --scan --pattern '{tag}*'"
        " | xargs -r redis-cli del)"
    )


def _apply(transport: Transport, tmp_path: Path, prefix: str, *specs: TopicSpec) -> tuple[str, str]:
    """``pipeline topics apply`` of ``specs`` as a user runs it: stdout, stderr (exit 0)."""
    topics = tmp_path / "topics"
    topics.mkdir(exist_ok=True)
    for spec in specs:
        declared: dict[str, Any] = {"name": spec.name, "lane": spec.lane, **_LANE}
        (topics / f"{spec.lane}.yaml").write_text(yaml.safe_dump(declared), encoding="utf-8")
    delete_after_test(transport, [name for spec in specs for name in spec.topic_names()])
    env = {**os.environ, "PIPELINE_TOPICS_DIR": str(topics), "PIPELINE_REDIS__KEY_PREFIX": prefix}
    applied = run_pipeline("topics", "apply", "-t", transport.name, env=env)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    return applied.stdout, applied.stderr


@pytest.fixture
async def transport(
    request: pytest.FixtureRequest, settings: Settings, unique: str
) -> AsyncIterator[Transport]:
    """Each real transport in turn, under a key prefix of the test's own (``t`` + unique).

    The members' guard keys and, on Redis Streams, the topics live under the prefix that
    ``pipeline topics apply`` is given; no other test's apply finds this test's lanes there.
    """
    request.getfixturevalue(f"{request.param}_service")
    redis_settings = settings.redis.model_copy(update={"key_prefix": f"t{unique}"})
    made = create_transport(settings.model_copy(update={"redis": redis_settings}), request.param)
    yield made
    await made.close()


@pytest.mark.parametrize("transport", ["kafka", "redis"], indirect=True)
async def test_a_main_topic_made_anew_under_guard_keys_is_named_by_apply(
    transport: Transport, redis: Redis, unique: str, tmp_path: Path
) -> None:
    """Guard state written by a real member, the topics deleted, apply: one line for the lane.

    A second lane created at the same time with no guard keys gets none; applying again (the
    topic exists now, the keys still do) gets none either.
    """
    used = lane_spec(f"used_{unique}", **_LANE)
    await declare(transport, used)
    prefix = f"t{unique}"

    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"a1" and ctx.attempt == 1:
            raise RuntimeError("dependency down")
        ran[ctx.message.key or b""].append(event)

    ran: dict[bytes, list[bytes]] = defaultdict(list)
    app = App([used])
    app.handler(used.lane)(handle)
    await produce(transport, used.name, [Record(b"a1", b"a"), Record(b"a2", b"a")])
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
    async with running(member):  # a1 fails and parks its key: the lane's guard keys exist
        await eventually(lambda: member.stats.retried == 1 and member.stats.parked == 1)
    tag = f"{{{prefix}:guard:{used.lane}}}"
    assert [key async for key in redis.scan_iter(match=f"{tag}*", count=1000)]

    admin = transport.admin()
    for name in used.topic_names():
        await admin.delete_topic(name)
    fresh = lane_spec(f"fresh_{unique}", **_LANE)

    done, stderr = _apply(transport, tmp_path, prefix, used, fresh)
    said = stderr.splitlines()
    assert f"create {used.name} (" in done, done
    assert f"create {fresh.name} (" in done, done

    assert _stale_line(used, tag) in said, "\n".join(said)
    assert [line for line in said if "guard keys" in line] == [_stale_line(used, tag)]
    assert not [line for line in said if fresh.lane in line], "\n".join(said)
    # Nothing is deleted by apply.
    assert [key async for key in redis.scan_iter(match=f"{tag}*", count=1000)]

    done, again = _apply(transport, tmp_path, prefix, used, fresh)
    assert "topics already match 2 declaration(s)" in done, done
    assert "guard keys" not in again, again

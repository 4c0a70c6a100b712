"""Every group using a Redis that lost its data while no member ran says so at its next start.

The state-loss marker is one hash per key prefix: the first member to start after a FLUSHALL
(or a restart empty) found it missing, asked the broker, and reported the loss; it wrote the
marker again, so a member of a second group of that Redis and prefix found it there and said
nothing, though the followers held for that group were gone too. The marker now keeps one
field per group (written at each start): a member whose group's field is missing asks the
broker for its group.
"""

from __future__ import annotations

from pathlib import Path

from redis.asyncio import Redis
from runtime.consumed_lane import consumed_lane
from runtime.helpers import consume_until, lane_spec, private_member_env, write_idle_app
from runtime.private_redis import bare_redis

from pipeline.config import Settings
from pipeline.runtime.state_loss import marker_key


def critical(lines: list[str]) -> list[str]:
    """The CRITICAL lines among ``lines``."""
    return [line for line in lines if "CRITICAL" in line]


async def test_a_second_group_reports_a_loss_while_no_member_ran(
    settings: Settings, kafka_service: str, tmp_path: Path, unique: str
) -> None:
    """Groups A and B, each with held followers committed; FLUSHALL; A starts, then B: two lines."""
    prefix = f"t{unique}"
    groups = {f"ga-{unique}": f"ea_{unique}", f"gb-{unique}": f"eb_{unique}"}
    for group, name in groups.items():
        await consumed_lane(settings, lane_spec(name, 1, retry={"tiers": ["1s"]}), group)
        (tmp_path / group).mkdir()
        write_idle_app(tmp_path / group, name)
    with bare_redis() as server:
        envs = {
            group: private_member_env(tmp_path / group, kafka_service, server.url, prefix)
            for group in groups
        }
        for group, name in groups.items():  # each ran on this Redis before: the marker is there
            lines, code = await consume_until(
                tmp_path / group, f"{name}:app", group, envs[group], "consuming as"
            )
            assert code == 0, "".join(lines)
        client = Redis.from_url(server.url)
        try:
            assert await client.exists(marker_key(prefix)) == 1
            await client.flushall()  # no member runs: none of them sees it
        finally:
            await client.aclose()
        reported = {}
        for group, name in groups.items():  # A first: it writes the marker again; then B
            lines, code = await consume_until(
                tmp_path / group, f"{name}:app", group, envs[group], "consuming as"
            )
            assert code == 0, "".join(lines)
            reported[group] = critical(lines)
    assert [len(reported[group]) for group in groups] == [1, 1], reported
    for group, name in groups.items():
        (line,) = reported[group]
        assert f"group {group} has consumed {name} before" in line, line
        assert "lost its data while no member" in line, line

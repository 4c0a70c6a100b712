"""A lane that begins keeping messages in Redis is not taken for a Redis that lost its data.

Members whose lanes kept nothing only in Redis wrote no state marker, while their group
committed offsets: the first start after ``retry:`` was added to the ordered lane found the
marker missing and the group's commits, and paged (CRITICAL, ``pipeline_redis_state_lost_total``)
though nothing was lost. Every member writes the marker now; only those keeping state watch it.
"""

from __future__ import annotations

from pathlib import Path

from redis.asyncio import Redis
from runtime.consumed_lane import consumed_lane
from runtime.helpers import consume_until, lane_spec, private_member_env, write_idle_app
from runtime.private_redis import bare_redis

from pipeline.config import Settings
from pipeline.runtime.state_loss import marker_key


async def test_adding_retry_to_a_lane_its_group_consumed_is_no_loss(
    settings: Settings, kafka_service: str, tmp_path: Path, unique: str
) -> None:
    """Plain lane run first (marker written), then with tiers: no missing-marker line."""
    name, group, prefix = f"plain_{unique}", f"g-{unique}", f"t{unique}"
    # its tier topics exist for the second run
    await consumed_lane(settings, lane_spec(name, 1, retry={"tiers": ["1s"]}), group)
    write_idle_app(tmp_path, name)
    declared = tmp_path / "topics" / f"{name}.yaml"
    with_tiers = declared.read_text()
    declared.write_text(f"name: {name}\npartitions: 1\n")  # first: nothing kept in Redis
    with bare_redis() as server:
        env = private_member_env(tmp_path, kafka_service, server.url, prefix)
        lines, code = await consume_until(tmp_path, f"{name}:app", group, env, "consuming as")
        assert code == 0, "".join(lines)
        client = Redis.from_url(server.url)
        try:
            assert await client.hget(marker_key(prefix), "epoch") is not None
        finally:
            await client.aclose()
        declared.write_text(with_tiers)  # then: an ordered lane with a tier holds followers
        lines, code = await consume_until(tmp_path, f"{name}:app", group, env, "consuming as")
    log = "".join(lines)
    assert code == 0, log
    assert "holds no state-loss marker" not in log, log
    assert "CRITICAL" not in log, log

"""`pipeline consume` tells of a Redis that lost its data while no member of its group ran.

The group committed offsets on an ordered lane with retry tiers (its held followers were kept in
Redis only); that Redis then has no state marker: the member's start says so (CRITICAL) and
counts the loss, where it said nothing before.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from runtime.consumed_lane import consumed_lane
from runtime.helpers import consume, lane_spec, next_line, private_member_env, write_idle_app
from runtime.private_redis import bare_redis
from test_redis_state_lost import lost_count

from pipeline.config import Settings
from pipeline.testing.ports import free_port


async def test_consume_reports_a_loss_while_no_member_ran(
    settings: Settings, kafka_service: str, tmp_path: Path, unique: str
) -> None:
    """Offsets committed, an empty Redis: one CRITICAL line at start and the loss counted once."""
    name, group, prefix = f"lostb_{unique}", f"g-{unique}", f"t{unique}"
    # ordered: followers are held in Redis
    await consumed_lane(settings, lane_spec(name, 1, retry={"tiers": ["1s"]}), group)
    write_idle_app(tmp_path, name)
    metrics_port = free_port()
    with bare_redis() as server:
        env = private_member_env(tmp_path, kafka_service, server.url, prefix, metrics_port)
        proc = await consume(tmp_path, f"{name}:app", group, env)
        assert proc.stderr is not None
        lines: list[str] = []
        try:
            line = await next_line(proc.stderr, lines, "holds no state-loss marker")
            await next_line(proc.stderr, lines, "consuming as group")
            await lost_count(metrics_port, group, 1.0)
            proc.send_signal(signal.SIGTERM)
            _, rest = await asyncio.wait_for(proc.communicate(), 60)
            lines += rest.decode().splitlines(keepends=True)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 0, "".join(lines)
    assert "CRITICAL" in line
    assert f"although group {group} has" in line
    assert server.url in line
    assert len([x for x in lines if "holds no state-loss marker" in x]) == 1, "".join(lines)

"""A member stopped by SIGTERM does not look at its state-loss marker on its way out.

The look at the marker as the member ends is for an end caused by a Redis that lost its data
(its topics gone under it on Redis Streams: the watch's line then comes before the exit line).
Made at every end, it cost a SIGTERM'd member whose Redis does not answer one more call of up
to twice the socket timeout (5 s, retried once): with Redis frozen, the exit took 35.9 s where
it took 25.7 s before, past the consumers' terminationGracePeriodSeconds (31).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from redis.asyncio import Redis
from runtime.consumed_lane import consumed_lane
from runtime.helpers import consuming, lane_spec, private_member_env, write_idle_app
from runtime.private_redis import bare_redis

from pipeline.config import Settings
from pipeline.runtime.state_loss import marker_key


def _looks(commands: list[str], key: str) -> int:
    """How many of the MONITOR ``commands`` are looks at marker ``key`` (one count each)."""
    return sum(1 for c in commands if c.startswith(f"HINCRBY {key} count "))


async def test_a_sigterm_exit_makes_no_last_look(
    settings: Settings, kafka_service: str, tmp_path: Path, unique: str
) -> None:
    """After a periodic look, SIGTERM: no look at the marker until the member has exited."""
    name, group, prefix = f"qx_{unique}", f"g-{unique}", f"t{unique}"
    await consumed_lane(settings, lane_spec(name, 1, retry={"tiers": ["1s"]}), group)
    write_idle_app(tmp_path, name)
    key = marker_key(prefix)
    done = f"done-{unique}"
    with bare_redis() as server:
        env = private_member_env(tmp_path, kafka_service, server.url, prefix)
        client = Redis.from_url(server.url)
        lines: list[str] = []
        after: list[str] = []
        try:
            async with (
                consuming(tmp_path, f"{name}:app", group, env) as proc,
                client.monitor() as monitor,
            ):
                seen = 0
                while seen < 2:  # the look at start, then a periodic one (5 s later)
                    command = str((await asyncio.wait_for(monitor.next_command(), 60))["command"])
                    seen += _looks([command], key)
                # The next periodic look is 5 s away, and none comes once SIGTERM set stop.
                proc.send_signal(signal.SIGTERM)
                _, err = await asyncio.wait_for(proc.communicate(), 90)
                lines = err.decode().splitlines()
                await client.echo(done)  # every command before it is in the monitor before it
                while done not in (
                    command := str((await asyncio.wait_for(monitor.next_command(), 60))["command"])
                ):
                    after.append(command)
        finally:
            await client.aclose()
    log = "\n".join(lines)
    assert proc.returncode == 0, log
    assert _looks(after, key) == 0, after

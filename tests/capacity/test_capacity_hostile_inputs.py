"""Hostile inputs to the planner: corrupt service times, keys of another type, NaN and inf."""

from __future__ import annotations

import math
import time

import pytest
from redis.asyncio import Redis
from typer.testing import CliRunner

from pipeline.capacity import keys as k
from pipeline.capacity.history import ArrivalHistory
from pipeline.capacity.plan import plan_lane
from pipeline.capacity.queueing import erlang_c, mean_wait_s, slots_for_wait
from pipeline.capacity.settings import CapacitySettings
from pipeline.cli import app

NOW_S = 20_000 * 86_400 + 14 * 3600.0
NOW_MIN = int(NOW_S // 60)


@pytest.mark.parametrize(
    "fields",
    [
        {"c": "2", "s": "-4"},  # a negative total: sized for no busy slot at all
        {"c": "3", "s": "0"},  # zero seconds: likewise
        {"c": "2", "s": "abc"},  # not a number: a traceback
        {"c": "x", "s": "1.5"},
    ],
)
async def test_a_corrupt_service_time_falls_back_to_the_configured_one(
    redis: Redis, prefix: str, fields: dict[str, str]
) -> None:
    """Measured service times that are no positive number are not a measurement."""
    key = k.service(prefix, "messages")
    minute = NOW_MIN - 1
    await redis.hset(key, mapping={f"{kind}:{minute}": v for kind, v in fields.items()})
    await redis.hset(key, mapping={f"c:{minute - 1}": "1"})  # a count with no seconds
    history = ArrivalHistory(redis, prefix)
    await history.add_once(
        "test", [(1, {("messages", m): 600 for m in range(NOW_MIN - 15, NOW_MIN)})], settled={}
    )
    settings = CapacitySettings(service_s={"messages": 2.0})
    plan = await plan_lane(history, "messages", settings, slots_per_member=4, now_s=NOW_S)
    assert (plan.service_s, plan.service_source) == (2.0, "configured")
    assert plan.desired_members == math.ceil(10 * 2.0 / (4 * 0.7))


def test_a_capacity_key_of_another_type_is_named_not_called_unreachable(
    redis_service: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis answering WRONGTYPE is one line naming the key, not 'cannot reach Redis'."""
    import redis as sync_redis  # noqa: PLC0415 - the CLI runs its own loop

    key = k.service(prefix, "messages")
    client = sync_redis.Redis.from_url(redis_service)
    try:
        client.set(key, "not a hash")
        monkeypatch.setenv("PIPELINE_REDIS__URL", redis_service)
        monkeypatch.setenv("PIPELINE_REDIS__KEY_PREFIX", prefix)
        result = CliRunner().invoke(app, ["capacity", "messages"])
    finally:
        client.delete(key)
        client.close()
    assert result.exit_code == 1, result.output
    assert "cannot reach" not in result.output
    assert "WRONGTYPE" in result.output
    assert f"{{{prefix}:cap:messages}}" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


@pytest.mark.timeout(10)
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_load_that_is_no_number_is_refused_at_once(bad: float) -> None:
    """NaN or inf arrivals or service time raise ValueError; slots_for_wait looped for ever."""
    started = time.monotonic()
    for call in (
        lambda: slots_for_wait(bad, 1.0, 1.0),
        lambda: slots_for_wait(1.0, bad, 1.0),
        lambda: mean_wait_s(bad, 1.0, 4),
        lambda: erlang_c(4, bad),
    ):
        with pytest.raises(ValueError, match="finite"):
            call()
    assert time.monotonic() - started < 5

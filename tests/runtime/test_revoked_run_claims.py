"""A revoked partition's run still going keeps its claim: the next owner never runs it beside.

A revocation waits on its partitions' running handlers for the shutdown grace (on Kafka within
the group's poll budget); a run still going then goes on. Its partition's next owner reads the
message again, so on a guarded lane it must find the run's claim and wait for it.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec
from runtime.test_member_poll_budget import one_key_per_partition, short_poll_interval

from pipeline.config import RuntimeSettings, Settings
from pipeline.envelope import Record
from pipeline.retry.guard_store import GuardStore
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport


class Overlaps:
    """Runs of each key going on now, across members, and the most seen at once."""

    def __init__(self) -> None:
        """Nothing runs yet; the handlers hold until ``release`` is set."""
        self.now: Counter[bytes] = Counter()
        self.most = 0
        self.runs: list[tuple[str, int]] = []
        self.release = asyncio.Event()

    def app(self, spec: TopicSpec, member: str) -> App:
        """An app whose handler records its runs under ``member`` and holds until released."""
        made = App([spec])

        @made.handler(spec.lane)
        async def handle(event: bytes, ctx: Context) -> None:
            key = ctx.message.key or b""
            self.runs.append((member, ctx.message.partition))
            self.now[key] += 1
            self.most = max(self.most, self.now[key])
            try:
                await self.release.wait()
            finally:
                self.now[key] -= 1

        return made


def asking(store: GuardStore) -> list[int]:
    """Count the times ``store`` asks whether a previous owner still claims a partition."""
    asked = [0]
    real = store.claiming

    async def counted(*args: object) -> object:
        asked[0] += 1
        return await real(*args)  # type: ignore[arg-type]

    store.claiming = counted  # type: ignore[method-assign,assignment]
    return asked


async def _revoked_while_running(
    transport: Transport,
    redis: Redis,
    prefix: str,
    group: str,
    spec: TopicSpec,
    settings: RuntimeSettings,
) -> None:
    """A runs a message per partition; B joins; the moved run outlasts A's revocation wait.

    B's copy of that message must wait for A's run (B asks about A's claim) and run after it.
    """
    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"v", key) for key in one_key_per_partition(2)])
    await producer.close()
    seen = Overlaps()
    a = Member(seen.app(spec, "a"), transport, group, settings, redis=redis, redis_prefix=prefix)
    b = Member(seen.app(spec, "b"), transport, group, settings, redis=redis, redis_prefix=prefix)
    asked = asking(b._guard._stores[spec.lane])
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    running_a = asyncio.create_task(a.run(stop_a))
    running_b: asyncio.Task[None] | None = None
    try:
        await eventually(lambda: a._chain.lanes.running == 2)
        running_b = asyncio.create_task(b.run(stop_b))
        await eventually(lambda: asked[0] >= 2 or any(m == "b" for m, _ in seen.runs))
        assert seen.most == 1, seen.runs  # B started A's running message beside it
        seen.release.set()
        await eventually(lambda: any(m == "b" for m, _ in seen.runs))  # once A's run ended
    finally:
        seen.release.set()
        stop_a.set()
        stop_b.set()
        await asyncio.wait_for(running_a, 60)
        if running_b is not None:
            await asyncio.wait_for(running_b, 60)
    assert seen.most == 1, seen.runs  # what moved ran again at B, each after A's run of it


def _transport(settings: Settings, name: str) -> Transport:
    """Redis Streams, or Kafka on the classic protocol (its rebalances move main partitions)."""
    if name == "redis":
        return create_transport(settings, "redis")
    return short_poll_interval(settings, "classic")


@pytest.mark.parametrize("name", ["redis", "kafka"])
async def test_a_run_outlasting_the_grace_of_its_revocation_keeps_its_claim(
    request: pytest.FixtureRequest,
    settings: Settings,
    redis: Redis,
    prefix: str,
    unique: str,
    name: str,
) -> None:
    """A run still going when its revocation's grace ends is never run beside by the next owner."""
    request.getfixturevalue(f"{name}_service")
    transport = _transport(settings, name)
    spec = lane_spec(f"revclaim_{unique}", 2, retry={"tiers": ["1s"]})
    await declare(transport, spec)
    short = FAST.model_copy(update={"shutdown_grace_s": 0.5})
    try:
        await _revoked_while_running(transport, redis, prefix, f"g-{unique}", spec, short)
    finally:
        await transport.close()


@pytest.mark.usefixtures("kafka_service")
async def test_a_run_outlasting_the_poll_budget_of_its_revocation_keeps_its_claim(
    settings: Settings, redis: Redis, prefix: str, unique: str
) -> None:
    """On Kafka, a run still going past the revocation's poll budget keeps its claim."""
    transport = short_poll_interval(settings, "classic")
    spec = lane_spec(f"revbudget_{unique}", 2, retry={"tiers": ["1s"]})
    await declare(transport, spec)
    patient = FAST.model_copy(update={"shutdown_grace_s": 30.0})  # only the budget bounds it
    try:
        await _revoked_while_running(transport, redis, prefix, f"g-{unique}", spec, patient)
    finally:
        await transport.close()

"""CPU-bound handlers run in kill-able worker processes."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence

import pytest
from contract.helpers import consume_until
from redis.asyncio import Redis
from runtime import cpu_app
from runtime.helpers import FAST, alive, declare, eventually, lane_spec, produce, running

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.errors import ConfigError
from pipeline.runtime import App, Context
from pipeline.runtime.cpu import ProcessPool
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport


@pytest.fixture
async def done_set(redis_service: str, unique: str) -> AsyncIterator[tuple[Redis, str]]:
    """The Redis set the workers write their results to (named after the test's lane)."""
    client = Redis.from_url(redis_service)
    key = f"cpu-done:cpu_{unique}"
    yield client, key
    await client.delete(key)
    await client.aclose()


async def cpu_lane(
    transport: Transport,
    unique: str,
    handler: Callable[[bytes, Context], object],
    values: Sequence[bytes],
    *,
    time_limit_s: float = 30.0,
) -> tuple[TopicSpec, Member]:
    """The lane cpu_<unique> holding ``values``, and a member of g-<unique> running ``handler``."""
    spec = lane_spec(f"cpu_{unique}", 1, ordered=False, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    app = App([spec])
    app.handler(spec.lane, cpu=True, time_limit_s=time_limit_s)(handler)
    await produce(transport, spec.name, [Record(value) for value in values])
    return spec, Member(app, transport, f"g-{unique}", FAST)


async def test_hung_and_crashed_workers_are_replaced_and_retried(
    transport: Transport, done_set: tuple[Redis, str], unique: str
) -> None:
    """A handler past its limit is killed, one that kills its worker is caught; both retry."""
    redis, key = done_set
    _, member = await cpu_lane(
        transport, unique, cpu_app.crunch, [b"hang", b"crash", b"fine"], time_limit_s=2.0
    )
    expected = sum(i * i for i in range(200_000))
    async with running(member):
        await eventually(lambda: member.stats.handled == 3, timeout_s=90)
    results = {v.decode() for v in await redis.smembers(key)}
    assert results == {f"hang:2:{expected}", f"crash:2:{expected}", f"fine:1:{expected}"}
    assert member.stats.retried == 2


async def test_a_cpu_handlers_errors_keep_their_kind_across_the_process_boundary(
    transport: Transport, done_set: tuple[Redis, str], unique: str
) -> None:
    """A fatal error pickle cannot rebuild is still fatal, an unpicklable one still retried."""
    redis, key = done_set
    spec, member = await cpu_lane(transport, unique, cpu_app.refuse, [b"refuse", b"lock"])
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 2, timeout_s=90)
    assert {v.decode() for v in await redis.smembers(key)} == {"refuse:1", "lock:1", "lock:2"}
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    dead = await consume_until(dlq, lambda got: len(got) >= 2)
    await dlq.close()
    by_value = {m.value: m.headers for m in dead}
    assert by_value[b"refuse"][h.ERROR_CLASS] == b"pipeline.errors.DeadLetter"
    assert by_value[b"refuse"][h.ERROR_MESSAGE] == b"Refused: 422: not a document"
    assert by_value[b"refuse"][h.ATTEMPT] == b"1"
    assert by_value[b"lock"][h.ERROR_CLASS] == b"builtins.RuntimeError"
    assert by_value[b"lock"][h.ERROR_MESSAGE] == b"Unpicklable: the dependency held a lock"


async def test_a_cpu_handler_that_returns_what_pickle_cannot_copy_succeeds(
    transport: Transport, done_set: tuple[Redis, str], unique: str
) -> None:
    """The runtime has no use for a handler's return value, so it cannot fail the run."""
    redis, key = done_set
    _, member = await cpu_lane(transport, unique, cpu_app.answer, [b"done"])
    async with running(member):
        await eventually(lambda: member.stats.handled + member.stats.retried >= 1, timeout_s=90)
    assert (member.stats.handled, member.stats.retried) == (1, 0)
    assert {v.decode() for v in await redis.smembers(key)} == {"done:1"}


async def test_ctx_once_in_a_cpu_handler_fails_saying_it_is_not_available_there(
    transport: Transport, done_set: tuple[Redis, str], unique: str
) -> None:
    """ctx.once in a worker fails at the call, saying why, instead of silently not running."""
    redis, key = done_set
    spec, member = await cpu_lane(transport, unique, cpu_app.remember, [b"once"])
    async with running(member):
        await eventually(
            lambda: member.stats.handled + member.stats.dead_lettered >= 1, timeout_s=90
        )
    assert (member.stats.handled, member.stats.dead_lettered) == (0, 1)
    assert await redis.smembers(key) == set()  # the handler stopped at the call
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    (dead,) = await consume_until(dlq, lambda got: len(got) >= 1)
    await dlq.close()
    assert dead.headers[h.ERROR_CLASS] == b"pipeline.errors.ConfigError"
    assert b"not available in cpu=True handlers" in dead.headers[h.ERROR_MESSAGE]


async def test_a_worker_that_died_while_idle_does_not_fail_the_next_call(
    done_set: tuple[Redis, str], unique: str
) -> None:
    """A worker killed between calls (the OOM killer) is replaced before the next call runs."""
    redis, key = done_set
    pool = ProcessPool(1, grace_s=0.5)
    try:
        await pool.run("runtime.cpu_app:whoami", (f"cpu_{unique}",), 30.0)
        (first,) = {v.decode() for v in await redis.smembers(key)}
        pid = int(first.removeprefix("pid:"))
        os.kill(pid, signal.SIGKILL)
        await eventually(lambda: not alive(pid))
        await pool.run("runtime.cpu_app:whoami", (f"cpu_{unique}",), 30.0)
    finally:
        await pool.close()
    assert len(await redis.smembers(key)) == 2


def test_cpu_handlers_must_be_plain_module_functions() -> None:
    """A coroutine or a nested function cannot be a CPU-bound handler."""
    app = App([lane_spec("cpu_rules")])

    async def not_plain(event: bytes, ctx: Context) -> None: ...

    def nested(event: bytes, ctx: Context) -> None: ...

    with pytest.raises(ConfigError, match="plain `def`"):
        app.handler("cpu_rules", cpu=True)(not_plain)
    with pytest.raises(ConfigError, match="module-level"):
        app.handler("cpu_rules", cpu=True)(nested)

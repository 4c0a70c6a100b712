"""A member's shutdown on both real brokers: handlers still running when the grace ends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from redis.asyncio import Redis
from runtime.helpers import FAST, consume_process, declare, eventually, lane_spec

from pipeline.envelope import Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import _STOP_MARGIN_S, Member
from pipeline.transport.protocol import Transport

IMPATIENT = FAST.model_copy(update={"shutdown_grace_s": 0.2, "cancel_grace_s": 0.2})


async def test_a_handler_past_the_grace_is_cancelled_before_its_partition_is_given_up(
    transport: Transport, unique: str
) -> None:
    """A run going on past the grace is stopped while the member still owns its partition."""
    spec = lane_spec(f"grace_{unique}", 1)
    await declare(transport, spec)
    app = App([spec])
    member: Member | None = None
    owned_when_cancelled: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        try:
            await asyncio.Event().wait()  # outlives any grace
        except asyncio.CancelledError:
            assert member is not None
            owned_when_cancelled.append(len(member.assignment))
            raise

    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"slow", b"a")])
    await producer.close()
    member = Member(app, transport, f"g-{unique}", IMPATIENT)
    stop = asyncio.Event()
    task = asyncio.create_task(member.run(stop))
    await eventually(lambda: member._chain.lanes.running == 1)
    stop.set()
    await asyncio.wait_for(task, 60)
    assert owned_when_cancelled == [1]


async def test_a_handler_that_ignores_its_cancellation_does_not_hold_the_member_for_ever(
    transport: Transport, unique: str
) -> None:
    """The member stops and commits what finished; the stubborn run is left, not committed."""
    spec = lane_spec(f"stubborn_{unique}", 1)
    await declare(transport, spec)
    app = App([spec])
    release = asyncio.Event()
    done: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        while event == b"stubborn" and not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # swallowed: the handler goes on
        done.append(event)

    producer = transport.producer()
    records = [Record(b"stubborn", b"a")] + [Record(b"v%d" % i, b"k%d" % i) for i in range(5)]
    await producer.send_many(spec.name, records)
    await producer.close()
    member = Member(app, transport, f"g-{unique}", IMPATIENT)
    stop = asyncio.Event()
    task = asyncio.create_task(member.run(stop))
    await eventually(lambda: len(done) == 5)
    stop.set()
    try:
        finished, _ = await asyncio.wait({task}, timeout=60)
        assert finished, "the member did not stop"
        await task
    finally:
        release.set()  # lets the stubborn handler end, so the test's loop can close
        await asyncio.wait({task}, timeout=60)
    assert member.abandoned == 1
    lag = await transport.admin().group_lag(f"g-{unique}", spec.name)
    assert [p.committed for p in lag] == [0]  # the stubborn message is delivered again


async def test_a_handler_that_ignores_its_cancellation_holds_the_shutdown_one_margin_only(
    transport: Transport, unique: str
) -> None:
    """A stubborn run is waited for once (cancel_grace_s and the margin), not again at its claim."""
    spec = lane_spec(f"stubborn_once_{unique}", 1)
    await declare(transport, spec)
    app = App([spec])
    release = asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # swallowed: the handler goes on
                await release.wait()

    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"stubborn", b"a")])
    await producer.close()
    member = Member(app, transport, f"g-{unique}", IMPATIENT)
    stop = asyncio.Event()
    task = asyncio.create_task(member.run(stop))
    await eventually(lambda: member._chain.lanes.running == 1)
    stop.set()
    # A bound, not a measure: one margin and two seconds for the commit and leaving, while two
    # margins (the stuck run's claims waited for again) would pass it by seconds.
    bound_s = IMPATIENT.shutdown_grace_s + IMPATIENT.cancel_grace_s + _STOP_MARGIN_S + 2
    try:
        finished, _ = await asyncio.wait({task}, timeout=bound_s)
        assert finished, f"the member took more than {bound_s} s to stop"
        await task
    finally:
        release.set()  # lets the stubborn handler end, so the test's loop can close
        await asyncio.wait({task}, timeout=60)
    assert member.abandoned == 1


async def test_consume_exits_after_sigterm_when_a_handler_ignores_its_cancellation(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """`pipeline consume` stops on SIGTERM, saying which run it left behind, not never."""
    spec = lane_spec(f"stubborn_cli_{unique}", 1)
    group, started = f"g-{unique}", f"started-{unique}"
    env = {
        **os.environ,
        "STUBBORN_TOPIC": spec.name,
        "STUBBORN_STARTED": started,
        "PIPELINE_RUNTIME__SHUTDOWN_GRACE_S": "0.2",
        "PIPELINE_RUNTIME__CANCEL_GRACE_S": "0.2",
    }
    proc = await consume_process(
        transport,
        spec,
        "runtime.stubborn_app:app",
        group,
        Record(b"stubborn", b"a"),
        env,
        asyncio.subprocess.PIPE,
    )
    try:
        while not await redis.llen(started):
            assert proc.returncode is None, "the member ended before the handler started"
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    assert b"did not stop when cancelled at shutdown" in stderr


async def test_a_second_signal_stops_consume_without_waiting_out_the_grace(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """A second signal during the drain cancels what still runs and exits, saying so."""
    spec = lane_spec(f"sleepy_cli_{unique}", 1)
    group, started = f"g-{unique}", f"started-{unique}"
    env = {
        **os.environ,
        "SLEEPY_TOPIC": spec.name,
        "SLEEPY_STARTED": started,
        "PIPELINE_RUNTIME__SHUTDOWN_GRACE_S": "3600",  # never waited out by the test
        "PIPELINE_RUNTIME__CANCEL_GRACE_S": "0.2",
    }
    proc = await consume_process(
        transport,
        spec,
        "runtime.sleepy_app:app",
        group,
        Record(b"slow", b"a"),
        env,
        asyncio.subprocess.PIPE,
    )
    try:
        while not await redis.llen(started):
            assert proc.returncode is None, "the member ended before the handler started"
            await asyncio.sleep(0.05)
        await redis.delete(started)
        proc.send_signal(signal.SIGTERM)  # the drain: it would wait for the handler an hour
        proc.send_signal(signal.SIGINT)  # the second Ctrl-C: stop now
        _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, stderr.decode()
    assert b"1 run(s) still going cancelled, not committed" in stderr, stderr.decode()
    lag = await transport.admin().group_lag(group, spec.name)
    assert [p.committed for p in lag] in ([0], [None])  # the message is delivered again

"""A long-work run whose handler failed on its own is not stopped while its failure is routed.

The handler stage routes a handler's failure (a retry-tier copy, or a dead letter) while the run
is still in the cancel gate (:class:`~pipeline.runtime.longwork.LongWork`). A cancellation, or a
hung verdict, that came in that window used to cancel the routing: the failure's line was lost,
the run ended as stopped and, hung, it was routed a second time (two retry-tier copies: the
message ran twice). Once the handler has returned or raised on its own the run can no longer be
stopped: such a stop is one INFO line (already finishing), and the routing finishes.

The member runs against the real broker and Redis; only its producer is held, in its send to the
retry tier (the message already given to the broker, the delivery report not yet back), until
the stop came.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually, lane_spec, running
from runtime.owned import Declare

from pipeline.config import RuntimeSettings
from pipeline.envelope import Delivered, Record
from pipeline.log_repeats import RepeatFilter
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Admin, Consumer, Producer, Reader, Transport

QUICK = RuntimeSettings(
    commit_interval_ms=100, shutdown_grace_s=5.0, cancel_poll_ms=50, cancel_grace_s=0.5
)
FAILURES = "pipeline.runtime.failure_log"
GATE = "pipeline.runtime.longwork"
REFUSED = "already finishing"


class HeldProducer:
    """The real producer, whose first send to a retry tier waits for ``release``.

    ``sent_first``: it waits once the copy is with the broker (its delivery report is late),
    else before it is sent.
    """

    def __init__(self, producer: Producer, *, sent_first: bool) -> None:
        """Send through ``producer``."""
        self._producer = producer
        self._sent_first = sent_first
        self.retry_sends: list[str] = []
        """The retry-tier topics sent to, in order (a send cancelled half-way counts)."""
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Delivered:
        """Send; the first copy to a retry tier waits for ``release`` (see the class)."""
        first = ".retry." in topic and not self.held.is_set()
        if first and not self._sent_first:
            self.held.set()
            await self.release.wait()
        delivered = await self._producer.send(
            topic, value, key=key, headers=headers, partition=partition
        )
        if ".retry." in topic:
            self.retry_sends.append(topic)
        if first and self._sent_first:
            self.held.set()
            await self.release.wait()  # its delivery report is late
        return delivered

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """The real producer's."""
        return await self._producer.send_many(topic, records)

    async def flush(self, timeout_s: float = 30.0) -> None:
        """The real producer's."""
        await self._producer.flush(timeout_s)

    async def close(self) -> None:
        """The real producer's."""
        await self._producer.close()


class HeldTransport:
    """The real transport, whose one producer is a :class:`HeldProducer`."""

    def __init__(self, transport: Transport, *, sent_first: bool) -> None:
        """Wrap ``transport`` (``sent_first``: see :class:`HeldProducer`)."""
        self._transport = transport
        self._sent_first = sent_first
        self.name = transport.name
        self.producer_made: HeldProducer | None = None

    def producer(self) -> Producer:
        """A held producer (the member makes one)."""
        self.producer_made = HeldProducer(self._transport.producer(), sent_first=self._sent_first)
        return self.producer_made

    def consumer(self, group: str, topics: Sequence[str], **kwargs: Any) -> Consumer:
        """The real transport's."""
        return self._transport.consumer(group, topics, **kwargs)

    def reader(self, topics: Sequence[str], **kwargs: Any) -> Reader:
        """The real transport's."""
        return self._transport.reader(topics, **kwargs)

    def admin(self) -> Admin:
        """The real transport's."""
        return self._transport.admin()

    async def close(self) -> None:
        """The real transport is the fixture's to close."""


def _records(caplog: pytest.LogCaptureFixture, lane: str) -> list[logging.LogRecord]:
    """The runtime's records at INFO or above that name ``lane`` (member lines not)."""
    return [
        r
        for r in caplog.records
        if r.levelno >= logging.INFO
        and r.name.startswith("pipeline.runtime.")
        and r.name != "pipeline.runtime.member"
        and lane in r.getMessage()
    ]


def _refused(caplog: pytest.LogCaptureFixture) -> bool:
    return any(REFUSED in r.getMessage() for r in caplog.records)


def _long_lane(unique: str) -> TopicSpec:
    """A lane of long work: two attempts, a retry tier of 100 ms, a heartbeat timeout of 1 s."""
    return lane_spec(
        f"lw_{unique}", 1, retry={"tiers": ["100ms"], "max_attempts": 2}, heartbeat_timeout="1s"
    )


async def _send(transport: Transport, spec: TopicSpec) -> None:
    producer = transport.producer()
    try:
        await producer.send(spec.name, b"x", key=b"k-1")
    finally:
        await producer.close()


async def test_a_cancellation_while_a_failure_is_routed_leaves_the_routing_be(
    transport: Transport,
    redis: Redis,
    prefix: str,
    unique: str,
    lanes: Declare,
    caplog: pytest.LogCaptureFixture,
    caplog_repeats: RepeatFilter,
) -> None:
    """The failure's copy is made and told; the cancellation then skips the copy, not the run."""
    del caplog_repeats
    caplog.set_level(logging.INFO)
    spec = _long_lane(unique)
    await lanes(spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def transcribe(event: bytes, ctx: Context) -> None:
        raise RuntimeError(f"boom on {event!r}")

    await _send(transport, spec)
    # Held before it is sent: the copy comes due only once the member knows the cancellation.
    held = HeldTransport(transport, sent_first=False)
    member = Member(app, held, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        assert held.producer_made is not None
        await held.producer_made.held.wait()  # the failure's copy is on its way
        await app.cancel(redis, key="k-1", reason="user left", prefix=prefix)
        await eventually(lambda: _refused(caplog) or member.stats.cancelled > 0)
        held.producer_made.release.set()
        # Its copy made, then skipped when it came due (the cancellation covers it).
        await eventually(lambda: (member.stats.retried, member.stats.cancelled) == (1, 1))
    assert held.producer_made.retry_sends == [f"{spec.name}.retry.100ms"]
    assert (member.stats.retried, member.stats.cancelled, member.stats.hung) == (1, 1, 0)
    lines = [(r.name, r.levelno, r.getMessage()) for r in _records(caplog, spec.lane)]
    # The stop, refused while the copy was on its way; the failure, told once its copy was made;
    # the copy, skipped when it came due (its tier's delay at least half of 100 ms later).
    assert [(name, level) for name, level, _ in lines] == [
        (GATE, logging.INFO),
        (FAILURES, logging.WARNING),
        (GATE, logging.INFO),
    ], lines
    refused, failure, skipped = (text for _, _, text in lines)
    assert f"handler failed on {spec.name}[0]@0 (key k-1, attempt 1 of 2)" in failure
    assert f"next: retry tier {spec.name}.retry.100ms" in failure
    assert refused == (
        f"not stopping {spec.name}[0]@0 on lane {spec.lane} (user left): already finishing,"
        " its handler ended on its own"
    )
    assert skipped.startswith(f"cancelled {spec.name}.retry.100ms[0]@0 on lane {spec.lane}")
    assert skipped.endswith("(skipped): user left")


async def test_a_hung_verdict_while_a_failure_is_routed_routes_it_once(
    transport: Transport,
    redis: Redis,
    prefix: str,
    unique: str,
    lanes: Declare,
    caplog: pytest.LogCaptureFixture,
    caplog_repeats: RepeatFilter,
) -> None:
    """Silent while its failure's copy is delivered, the run is not hung: one copy, one run more.

    Before, the verdict cancelled the routing and routed the run again as ``HandlerHung``: two
    retry-tier copies of the message, both run.
    """
    del caplog_repeats
    caplog.set_level(logging.INFO)
    spec = _long_lane(unique)
    await lanes(spec)
    app = App([spec])
    attempts: list[int] = []

    @app.handler(spec.lane)
    async def transcribe(event: bytes, ctx: Context) -> None:
        ctx.heartbeat()  # from now on only its own beats count: it beats no more
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError(f"boom on {event!r}")

    await _send(transport, spec)
    held = HeldTransport(transport, sent_first=True)
    member = Member(app, held, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        assert held.producer_made is not None
        await held.producer_made.held.wait()
        await eventually(lambda: _refused(caplog) or member.stats.hung > 0)  # 1 s silent
        held.producer_made.release.set()
        await eventually(lambda: member.stats.retried > 0 and member.stats.handled > 0)
    assert held.producer_made.retry_sends == [f"{spec.name}.retry.100ms"]
    assert (member.stats.retried, member.stats.hung, member.stats.cancelled) == (1, 0, 0)
    assert attempts == [1, 2]
    lines = [(r.name, r.levelno, r.getMessage()) for r in _records(caplog, spec.lane)]
    assert [(name, level) for name, level, _ in lines] == [
        (GATE, logging.INFO),
        (FAILURES, logging.WARNING),
    ], lines
    refused, failure = (text for _, _, text in lines)
    assert f"handler failed on {spec.name}[0]@0 (key k-1, attempt 1 of 2)" in failure
    assert refused == (
        f"not stopping {spec.name}[0]@0 on lane {spec.lane} (hung): already finishing,"
        " its handler ended on its own"
    )

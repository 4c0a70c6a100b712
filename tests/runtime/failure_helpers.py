"""Helpers for the failure-log and dead-letter tests: their lines, failures and routing stages.

The failure log's lines (``pipeline.runtime.failure_log``) and the dead-letter warnings
(``pipeline.runtime.progress``) are read from ``caplog``; a member or a handler stage reports
dead letters through :class:`~pipeline.runtime.progress.DeadLetterWarnings`, as
``pipeline consume`` does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import pytest
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, lane_spec, produce, ran_until

from pipeline.envelope import Delivered, Message, Record
from pipeline.observability.metrics import Metrics
from pipeline.retry.policy import default_retryable
from pipeline.retry.router import RetryRouter
from pipeline.runtime import App, Context
from pipeline.runtime.app import Handler
from pipeline.runtime.handling import HandlerStage
from pipeline.runtime.member import Member
from pipeline.runtime.progress import DeadLetterWarnings
from pipeline.runtime.redirect import Redirector
from pipeline.runtime.stats import Stats
from pipeline.runtime.turns import TurnOutcome
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Producer, Transport

FAILURES = "pipeline.runtime.failure_log"
DEAD_LETTERS = "pipeline.runtime.progress"


def logged(
    caplog: pytest.LogCaptureFixture, logger: str, level: int = logging.WARNING
) -> list[logging.LogRecord]:
    """The records of ``logger`` at ``level``."""
    return [r for r in caplog.records if r.name == logger and r.levelno == level]


def first_lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    """The first lines of ``logger``'s WARNINGs."""
    return [r.getMessage().splitlines()[0] for r in logged(caplog, logger)]


def past_position(record: logging.LogRecord) -> str:
    """A failure line's first line from its exception on (past its ``(... attempt a of n): ``)."""
    return record.getMessage().splitlines()[0].split("): ", 1)[1]


def warnings_of(*specs: TopicSpec) -> DeadLetterWarnings:
    """Dead-letter warnings of ``specs``' lanes, each naming its lane's dead-letter topic."""
    return DeadLetterWarnings(Metrics(), {spec.lane: spec.dead_letter for spec in specs})


def warning_member(
    app: App, transport: Transport, redis: Redis, unique: str, *specs: TopicSpec
) -> Member:
    """A member of ``app`` that warns of the dead letters of ``specs``' lanes.

    Group ``g-UNIQUE``, Redis prefix ``UNIQUE``, settings :data:`~runtime.helpers.FAST`.
    """
    warnings = warnings_of(*specs)
    return Member(
        app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=unique, metrics=warnings
    )


def storm_with_one_other(count: int) -> list[Record]:
    """``count`` records alike but for their keys, and one ``b"other"`` (key ``odd``) halfway."""
    storm = [Record(b"v", f"key-{n:x}-{'ab'[n % 2]}".encode()) for n in range(count)]
    half = count // 2
    return [*storm[:half], Record(b"other", b"odd"), *storm[half:]]


async def cpu_lane_dead_lettered(
    transport: Transport,
    redis: Redis,
    unique: str,
    name: str,
    crunch: Callable[[bytes, Context], None],
    records: Sequence[Record],
    timeout_s: float,
) -> TopicSpec:
    """A CPU lane ``name`` whose handler ``crunch`` fails, run until each of ``records`` is dead.

    One partition, unordered, no retry tiers: each failure dead-letters. A member of
    :func:`~runtime.helpers.ran_until` runs until all of them are dead-lettered, within
    ``timeout_s``. The lane's declaration is returned.
    """
    spec = lane_spec(name, 1, ordered=False)
    await declare(transport, spec)
    app = App([spec])
    app.handler(spec.lane, cpu=True, time_limit_s=60)(cast("Handler", crunch))  # a plain def
    await produce(transport, spec.name, records)
    dead = len(records)
    await ran_until(
        app, transport, redis, unique, lambda m: m.stats.dead_lettered == dead, timeout_s
    )
    return spec


def _timed_out() -> None:
    """A turn handler's call that fails."""
    raise RuntimeError("the model timed out")


def raised() -> Exception:
    """``RuntimeError: the model timed out``, caught: with a traceback, as a handler's has one."""
    try:
        _timed_out()
    except RuntimeError as exc:
        return exc
    raise AssertionError("it did not fail")


async def never_called(event: bytes, ctx: Context) -> None:
    """A lane's handler whose turns are settled by the test (their outcome is given)."""
    raise AssertionError("not called")


async def hand_settled(transport: Transport, name: str) -> tuple[TopicSpec, App]:
    """A lane ``name`` declared, and an App of it whose turns the test settles itself.

    One partition, unordered, one 1 s retry tier, 3 attempts; the handler is never called.
    """
    spec = lane_spec(name, 1, ordered=False, retry={"tiers": ["1s"], "max_attempts": 3})
    await declare(transport, spec)
    app = App([spec])
    app.handler(spec.lane)(never_called)
    return spec, app


def failed_turn(topic: str, count: int, error: Exception) -> TurnOutcome:
    """A turn of ``count`` messages of ``topic`` (``said 0``, ...) ended with ``error``."""
    messages = [Message(topic, 0, n, b"conversation-1", b"said %d" % n, {}) for n in range(count)]
    return TurnOutcome(messages, "exhausted", error, attempts=3)


def routing_stage(
    app: App, lane: str, producer: Producer, warnings: DeadLetterWarnings, *, stopping: bool = False
) -> HandlerStage:
    """A handler stage of ``app``'s ``lane`` routing through ``producer``, as a member's does.

    ``stopping``: the routing's member is stopping, so a refused send is not tried again.
    """
    lanes = [app.lanes[lane]]
    stats = Stats()
    router = RetryRouter(producer)
    routing = Redirector(router, stats, default_retryable, lanes, metrics=warnings)
    routing.stopping = stopping
    return HandlerStage(app, routing, stats, lanes, cpu_workers=1)


class SecondSendAmiss:
    """The transport's producer, but its second send first goes through :meth:`second`."""

    def __init__(self, inner: Producer) -> None:
        """Wrap ``inner``, whose sends are counted."""
        self._inner = inner
        self._sends = 0

    def as_producer(self) -> Producer:
        """This wrapper, as the router takes a producer (it sends only)."""
        return cast("Producer", self)

    async def second(self) -> None:
        """What the second send does before it is sent (if it returns): here, nothing."""

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Delivered:
        """Send, the second send only once :meth:`second` returned."""
        self._sends += 1
        if self._sends == 2:
            await self.second()
        return await self._inner.send(topic, value, key=key, headers=headers, partition=partition)

"""A routed failure's exception is let go once routed: no task started meanwhile keeps it.

A member on Kafka runs a handler that raises; its failure is routed to a retry tier. The Kafka
producer starts its delivery-report task on its first send (the first retry copy), and a task
copies the context it was started in. Before, the failure log kept the exception in a context
variable while routing it, so that task kept the exception, its traceback and every local of
the handler's frame (a request's body, a model's output) for the producer's life.
"""

from __future__ import annotations

import gc
import weakref

from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running

from pipeline.envelope import Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


class _Big(Exception):
    """The handler's failure, whose frame holds a large local."""


def _gone(ref: weakref.ReferenceType[_Big]) -> bool:
    """Whether the object of ``ref`` is gone, once cycles are collected."""
    gc.collect()
    return ref() is None


async def test_the_first_routed_failure_is_not_kept_by_the_producers_task(
    kafka: Transport, unique: str
) -> None:
    """The first failure's exception is collected after it went to its retry tier."""
    spec = lane_spec(f"nk_{unique}", 1, ordered=False, retry={"tiers": ["30s"], "max_attempts": 3})
    await declare(kafka, spec)
    app = App([spec])
    raised: list[weakref.ReferenceType[_Big]] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        body = bytearray(10_000_000)  # a local of the frame: kept as long as the exception
        error = _Big(f"boom on {len(body)} bytes")
        raised.append(weakref.ref(error))
        raise error

    member = Member(app, kafka, f"g-{unique}", FAST)
    async with running(member):
        await produce(kafka, spec.name, [Record(b"x", b"k-1")])
        await eventually(lambda: member.stats.retried == 1)
        await eventually(lambda: _gone(raised[0]), timeout_s=10)  # while the producer lives

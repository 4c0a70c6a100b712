"""A TestApp behaves as `pipeline consume` does: the same scenario on the harness and on a member.

The reference is a real member (Kafka and Redis) running the same App; where a scenario needs
minutes of real time, the harness is held to what production is documented and configured to
do instead.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running

from pipeline import headers as h
from pipeline.config import RuntimeSettings, Settings
from pipeline.envelope import Message, Record
from pipeline.errors import DeadLetter, Retry
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.testing import TestApp
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport


def _refusing_app(spec: TopicSpec) -> App:
    """An App whose handler dead-letters every event, raising from a frame of its own."""
    app = App([spec])

    def refuse(event: bytes) -> None:
        raise DeadLetter(f"refused {event.decode()}")

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        refuse(event)

    return app


async def _dead_letters_of_a_member(
    transport: Transport, redis: Redis, spec: TopicSpec, group: str, prefix: str
) -> list[Message]:
    """Run ``spec``'s refusing App on a real member until its one event is dead-lettered."""
    await declare(transport, spec)
    await produce(transport, spec.name, [Record(b"e1", b"k1", {})])
    member = Member(_refusing_app(spec), transport, group, FAST, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 1)
    consumer = transport.consumer(f"{group}-dlq", [spec.dead_letter])
    try:
        seen: list[Message] = []
        for _ in range(120):
            seen.extend(await consumer.poll(10, 0.5))
            if seen:
                return seen
        raise AssertionError("the dead letter never arrived on the broker")
    finally:
        await consumer.close()


async def test_a_dead_letter_has_the_error_digest_production_gives_it(
    kafka_service: str, redis: Redis, unique: str, settings: Settings
) -> None:
    """`pl-error-digest` groups failures by the frames they were raised through.

    The harness's recording wrapper was one more frame between the runtime and the handler, so
    every failure a handler raised got another digest in a TestApp than in production: a test
    could not check the digest an alert or a redrive filter would see.
    """
    spec = lane_spec(f"fidelity_{unique}", 1, retry={"tiers": ["1s"]})
    transport = create_transport(settings, "kafka")
    try:
        (real,) = await _dead_letters_of_a_member(
            transport, redis, spec, f"g-{unique}", f"t{unique}"
        )
    finally:
        await transport.close()
    async with TestApp(_refusing_app(spec)) as t:
        await t.send(spec.lane, b"e1", key="k1")
        await t.drain()
        (dead,) = t.dead_letters(spec.lane)
    assert dead.message.headers[h.ERROR_DIGEST] == real.headers[h.ERROR_DIGEST]
    assert (dead.reason, dead.error_class, dead.error_message, dead.attempts) == (
        real.headers[h.DEAD_REASON].decode(),
        real.headers[h.ERROR_CLASS].decode(),
        real.headers[h.ERROR_MESSAGE].decode(),
        int(real.headers[h.ATTEMPT]),
    )


async def test_a_second_delivery_of_a_running_effect_retries_after_the_member_liveness() -> None:
    """`ctx.once`: a delivery that finds the effect running waits about a lease, then retries.

    The lease is the member's `runtime.liveness_ms` (5 s by default). The harness ran its member
    with a 50 s liveness, so a second delivery of an event (a webhook sent twice) waited out a
    10 s effect and returned on its first attempt, where `pipeline consume` retries it.
    """
    spec = TopicSpec.model_validate(
        {"name": "charges", "partitions": 1, "ordered": False, "retry": {"tiers": ["1s"]}}
    )
    app = App([spec])

    @app.handler("charges")
    async def handle(event: bytes, ctx: Context) -> None:
        async def charge() -> None:
            await asyncio.sleep(10)  # a slow payment provider: longer than a lease

        await ctx.once("charge", charge)

    async with TestApp(app) as t:
        await t.send("charges", b"first", key="k1", event_id="evt-1")
        await t.send("charges", b"again", key="k2", event_id="evt-1")
        await t.drain()
        runs = [(r.event, r.attempt, r.outcome) for r in t.runs("charges")]
        assert sorted(runs) == [
            (b"again", 1, "failed"),
            (b"again", 2, "handled"),
            (b"first", 1, "handled"),
        ]
        (retry,) = t.runs("charges", lambda r: r.outcome == "failed")
        assert isinstance(retry.error, Retry)
        assert retry.ended_s is not None
        assert 5 <= retry.ended_s - retry.started_s < 10  # a lease and its second, not the effect
        assert t.settings.runtime.liveness_ms == RuntimeSettings().liveness_ms

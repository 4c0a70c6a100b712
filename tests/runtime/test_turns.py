"""Debounced lanes on both brokers: one turn per conversation burst, retries, dead letters."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from contract.helpers import consume_until
from redis.asyncio import Redis
from redis.asyncio.retry import Retry as ClientRetry
from redis.backoff import NoBackoff
from runtime.helpers import (
    FAST,
    QUIET,
    Said,
    declare,
    eventually,
    lane_spec,
    produce,
    running,
    said,
)

from pipeline import headers as h
from pipeline.admission.debounce import Debouncer
from pipeline.errors import ConfigError, DeadLetter, Retry
from pipeline.observability.facades import DebounceMetrics, RuntimeMetrics
from pipeline.observability.metrics import Metrics
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


def test_a_debounced_lane_needs_a_turn_handler() -> None:
    """Registering a one-event handler on a debounced lane is a configuration error."""
    app = App([lane_spec("turns_cfg", 1, debounce=QUIET)])
    with pytest.raises(ConfigError, match="must take a list of events"):

        @app.handler("turns_cfg")
        async def handle(event: Said, ctx: Context) -> None:
            """Takes one event: wrong for a debounced lane."""


async def test_a_burst_is_one_turn_with_every_message_in_order(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Two conversations' bursts give exactly one turn each, holding all their messages in order."""
    spec = lane_spec(f"turns_{unique}", 2, debounce=QUIET)
    await declare(transport, spec)
    app = App([spec])
    turns: dict[str, list[list[int]]] = defaultdict(list)

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        turns[events[0].conversation_id].append([e.n for e in events])

    producer = transport.producer()
    burst = [said("c1", n) for n in range(5)] + [said("c2", n) for n in range(3)]
    await producer.send_many(spec.name, burst)
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: member.stats.handled == 8)
    assert turns == {"c1": [[0, 1, 2, 3, 4]], "c2": [[0, 1, 2]]}
    assert member.stats.turns == 2
    assert member.stats.buffered == 8


async def test_a_members_turn_metrics_count_turns_and_superseded_schedules(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Every message after a conversation's first in a burst supersedes its scheduled turn.

    Bursts of 5 and 3 messages: 2 turns, and 4 + 2 scheduled turns replaced by a newer message,
    in the member's Prometheus registry.
    """
    spec = lane_spec(f"turnmetrics_{unique}", 2, debounce=QUIET)
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        """Nothing to do: the turns are counted."""

    await produce(
        transport, spec.name, [said("c1", n) for n in range(5)] + [said("c2", n) for n in range(3)]
    )
    metrics = Metrics()
    member = Member(
        app,
        transport,
        f"g-{unique}",
        FAST,
        redis=redis,
        redis_prefix=f"t{unique}",
        turn_metrics=DebounceMetrics(metrics),
    )
    async with running(member):
        await eventually(lambda: member.stats.handled == 8)
    value = metrics.registry.get_sample_value
    assert value("pipeline_debounce_turns_total", {"lane": spec.lane}) == 2
    assert value("pipeline_debounce_superseded_total", {"lane": spec.lane}) == 6


async def test_a_turns_handler_run_is_timed_with_the_outcome_it_had(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Each turn's handler run is one ``pipeline_handler_duration_seconds`` sample, by outcome.

    Before, a turn's run recorded nothing: its messages showed only as ``buffered``, so a member
    never measured a debounced lane's service time and ``pipeline capacity`` used the default.
    """
    spec = lane_spec(f"turntimed_{unique}", 1, debounce=QUIET, retry={"max_attempts": 2})
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        if events[0].conversation_id == "broken":
            raise Retry("model busy")

    await produce(
        transport, spec.name, [said("c1", 0), said("c1", 1), said("c1", 2), said("broken", 0)]
    )
    metrics = Metrics()
    member = Member(
        app,
        transport,
        f"g-{unique}",
        FAST,
        redis=redis,
        redis_prefix=f"t{unique}",
        metrics=RuntimeMetrics(metrics),
        turn_metrics=DebounceMetrics(metrics),
    )
    async with running(member):
        await eventually(lambda: member.stats.handled == 3 and member.stats.dead_lettered == 1)
    value = metrics.registry.get_sample_value
    durations = {
        outcome: value(
            "pipeline_handler_duration_seconds_count", {"lane": spec.lane, "outcome": outcome}
        )
        for outcome in ("handled", "retried", "dead_lettered", "buffered")
    }
    assert durations == {"handled": 1, "retried": 1, "dead_lettered": 1, "buffered": 4}
    handled_s = value(
        "pipeline_handler_duration_seconds_sum", {"lane": spec.lane, "outcome": "handled"}
    )
    assert handled_s is not None
    assert handled_s > 0


async def test_a_failed_turn_runs_again_and_a_fatal_one_is_dead_lettered_in_order(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """A retryable failure reruns the same turn; a fatal one sends its messages to the DLQ."""
    spec = lane_spec(f"turnfail_{unique}", 1, debounce=QUIET, retry={"max_attempts": 3})
    await declare(transport, spec)
    app = App([spec])
    attempts: dict[str, list[int]] = defaultdict(list)

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        conversation = events[0].conversation_id
        attempts[conversation].append(ctx.attempt)
        if conversation == "flaky" and ctx.attempt == 1:
            raise Retry("model busy")
        if conversation == "broken":
            raise DeadLetter("cannot answer")

    producer = transport.producer()
    await producer.send_many(
        spec.name, [said("flaky", 0), said("flaky", 1), said("broken", 0), said("broken", 1)]
    )
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: member.stats.handled == 2 and member.stats.dead_lettered == 2)
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    dead = await consume_until(dlq, lambda got: len(got) == 2)
    await dlq.close()
    await producer.close()
    assert attempts["flaky"] == [1, 2]
    assert attempts["broken"] == [1]
    assert [Said.model_validate_json(m.value).n for m in dead] == [0, 1]
    assert all(m.headers[h.DEAD_REASON] == b"fatal" for m in dead)


async def test_a_turns_dead_letters_carry_the_attempts_the_turn_made(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """A turn that failed on each of its 2 attempts dead-letters its messages with attempt 2.

    Before, each dead letter of a turn said ``pl-attempt`` 1, whatever the turn had tried.
    """
    spec = lane_spec(f"turnattempt_{unique}", 1, debounce=QUIET, retry={"max_attempts": 2})
    await declare(transport, spec)
    app = App([spec])
    attempts: list[int] = []

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        attempts.append(ctx.attempt)
        raise Retry("model busy")

    await produce(transport, spec.name, [said("c1", 0), said("c1", 1)])
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 2)
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    dead = await consume_until(dlq, lambda got: len(got) == 2)
    await dlq.close()
    await transport.admin().delete_group(f"dlq-{unique}", [spec.dead_letter])
    assert attempts == [1, 2]
    assert [m.headers[h.ATTEMPT] for m in dead] == [b"2", b"2"]
    assert all(m.headers[h.DEAD_REASON] == b"exhausted" for m in dead)


async def test_a_turns_dead_letters_carry_the_time_of_its_first_failure(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """A turn that failed 3 times dead-letters each message with its first failure's time.

    Before, each dead letter gave the time of the turn's last run as ``pl-first-failure-ms``.
    The handler reads the member's own clock (Redis's, through the offset it measured): the
    host's, read a moment before the member's, was once later than it on a loaded machine.
    """
    spec = lane_spec(f"turnfirst_{unique}", 1, debounce=QUIET, retry={"max_attempts": 3})
    await declare(transport, spec)
    app = App([spec])
    started_ms: list[int] = []
    failed_ms: list[int] = []

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        started_ms.append(member._clock.now_ms())
        failed_ms.append(member._clock.now_ms())
        raise Retry("model busy")

    await produce(transport, spec.name, [said("c1", 0), said("c1", 1)])
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 2)
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    dead = await consume_until(dlq, lambda got: len(got) == 2)
    await dlq.close()
    await transport.admin().delete_group(f"dlq-{unique}", [spec.dead_letter])
    assert len(started_ms) == 3
    firsts = [int(m.headers[h.FIRST_FAILURE_MS]) for m in dead]
    assert firsts[0] == firsts[1]
    assert failed_ms[0] <= firsts[0] <= started_ms[1]  # the first run's failure, not a later one
    assert all(int(m.headers[h.LAST_FAILURE_MS]) >= failed_ms[2] for m in dead)


async def test_without_redis_every_message_is_a_turn_of_its_own(
    transport: Transport, unique: str
) -> None:
    """Redis unreachable: the debouncer fails open and no message is lost."""
    spec = lane_spec(f"turnopen_{unique}", 1, debounce=QUIET)
    await declare(transport, spec)
    app = App([spec])
    sizes: list[int] = []

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        sizes.append(len(events))

    producer = transport.producer()
    await producer.send_many(spec.name, [said("c", n) for n in range(3)])
    await producer.close()
    # Nothing listens on port 1; no client-side retries, so each refusal is immediate.
    dead = Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=ClientRetry(NoBackoff(), 0)
    )
    member = Member(app, transport, f"g-{unique}", FAST, redis=dead, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: member.stats.handled == 3)
    await dead.aclose()
    assert sizes == [1, 1, 1]


async def test_a_turn_runs_its_side_effect_once_across_its_retries(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """``ctx.once`` in a debounced turn: the effect runs on the first attempt, not on the retry.

    Before, a turn's context had no idempotency guard: ``ctx.once`` raised "needs Redis" on
    every attempt, so a turn that used it was retried until its messages were dead-lettered.
    """
    spec = lane_spec(f"turnonce_{unique}", 1, debounce=QUIET, retry={"max_attempts": 3})
    await declare(transport, spec)
    app = App([spec])
    effects: list[list[int]] = []
    attempts: list[int] = []

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        attempts.append(ctx.attempt)

        async def reply() -> None:
            effects.append([e.n for e in events])

        await ctx.once("reply", reply)
        if ctx.attempt == 1:
            raise Retry("the answer was sent; the bookkeeping after it failed")

    producer = transport.producer()
    await producer.send_many(spec.name, [said("c1", 0), said("c1", 1)])
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: member.stats.handled == 2)
    assert attempts == [1, 2]
    assert effects == [[0, 1]]
    assert member.stats.dead_lettered == 0


async def test_a_turn_whose_runs_never_finished_is_dead_lettered_as_poison_unrun(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Claimed and abandoned ``max_attempts`` times (its members died): poison, never run again.

    Before, a claim past the last attempt ran the turn all the same: a turn that kills its
    process (out of memory, a native crash) took down one member every lease, without end.
    """
    spec = lane_spec(f"turnpoison_{unique}", 1, debounce=QUIET, retry={"max_attempts": 2})
    await declare(transport, spec)
    await produce(transport, spec.name, [said("c1", 0), said("c1", 1)])
    reader = transport.consumer(f"read-{unique}", [spec.name])
    messages = await consume_until(reader, lambda got: len(got) == 2)
    await reader.close()
    prefix = f"t{unique}"
    assert spec.debounce is not None
    dying = Debouncer(redis, prefix, spec.lane, spec.debounce, lease_ms=50)  # members that die
    for message in messages:
        await dying.record("c1", message)
    abandoned = 0
    while abandoned < 2:  # each claim's member dies: its lease runs out, the next one claims
        claim = await dying.claim(10)
        abandoned += len(claim.turns)
        if not claim.turns:
            await asyncio.sleep(0.02)  # the turn is not due yet: no busy loop on the CPU
    app = App([spec])
    handled: list[list[int]] = []

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        handled.append([e.n for e in events])

    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 2)
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    dead = await consume_until(dlq, lambda got: len(got) == 2)
    await dlq.close()
    assert handled == []
    assert [Said.model_validate_json(m.value).n for m in dead] == [0, 1]
    assert all(m.headers[h.DEAD_REASON] == b"poison" for m in dead)
    assert [m.headers[h.ATTEMPT] for m in dead] == [b"2", b"2"]  # both runs it was allowed
    await transport.admin().delete_group(f"read-{unique}", [spec.name])


async def test_cancelled_messages_waiting_for_their_turn_are_left_out_of_it(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """``pipeline cancel --key c1`` while two messages wait in the buffer: the turn has the third.

    Before, a debounced lane's messages were past the cancel stage once buffered, so cancelled
    work still ran in its conversation's turn.
    """
    slow = {"key": "conversation_id", "quiet_s": 30, "max_wait_s": 60, "max_batch": 3}
    spec = lane_spec(f"turncancel_{unique}", 1, debounce=slow)
    await declare(transport, spec)
    app = App([spec])
    turns: list[list[int]] = []

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        turns.append([e.n for e in events])

    prefix = f"t{unique}"
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
    async with running(member):
        await produce(transport, spec.name, [said("c1", 0), said("c1", 1)])
        await eventually(lambda: member.stats.buffered == 2)  # due in 30 s
        await app.cancel(redis, key="c1", reason="user left", prefix=prefix)
        await eventually(lambda: bool(member._longwork.selectors))  # the member knows
        await produce(transport, spec.name, [said("c1", 2)])  # after it: new work; fills it
        await eventually(lambda: member.stats.cancelled == 2 and len(turns) == 1)
    assert turns == [[2]]

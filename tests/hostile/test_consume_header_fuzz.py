"""Hostile ``pl-*`` headers, keys and values on a lane's main and retry-tier topics, fuzzed.

Anyone who can produce to a lane's topics can write any headers, keys and values. A real member
of an ordered lane with retry tiers, on both brokers, consumes a seeded batch of such messages
whose handler sometimes fails: each message is handled or dead-lettered with a reason, a normal
message produced after them is handled, the group's committed positions reach the end of the
main and retry-tier topics, and nothing is raised out of the member's run.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis
from runtime.helpers import (
    FAST,
    declare,
    eventually,
    handled_by_a_member,
    lane_spec,
    produce,
    running,
)

from pipeline import headers as h
from pipeline.envelope import Message, Record
from pipeline.observability.facades import RuntimeMetrics
from pipeline.observability.metrics import Metrics
from pipeline.offload import reference as offload
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.tracing import TRACEPARENT, TRACESTATE
from pipeline.transport.protocol import Admin, Reader, Transport

SEED = 20_261_207
MIB = 1_048_576

NAMES = (
    h.ROW_ID,
    h.SOURCE,
    h.RECEIVED_AT_MS,
    h.EVENT_ID,
    h.TENANT,
    h.DEADLINE_MS,
    h.ABANDON_AFTER_MS,
    h.ATTEMPT,
    h.DUE_MS,
    h.ORIGIN_TOPIC,
    h.ORIGIN_PARTITION,
    h.ORIGIN_OFFSET,
    h.PRODUCED_AT_MS,
    h.SLA_FROM_MS,
    h.ERROR_CLASS,
    h.ERROR_MESSAGE,
    h.ERROR_DIGEST,
    h.FIRST_FAILURE_MS,
    h.LAST_FAILURE_MS,
    h.DEAD_REASON,
    h.REDRIVE_COUNT,
    h.REDRIVEN_FROM,
    h.REPLAY_COUNT,
    TRACEPARENT,
    TRACESTATE,
    offload.OFFLOAD,
    offload.SIZE,
    offload.SHA256,
    offload.CONTENT_TYPE,
)
"""Every header the pipeline reads or writes on a lane's messages."""

VALUES = (
    b"",
    b"abc",
    b"-1",
    b"0",
    b"1",
    b"1e309",
    b"nan",
    b"99999999999999999999999",
    b"-99999999999999999999999",
    b" 12 ",
    b"1_000",
    "\u00e9\u65e5\u672c".encode(),
    b"\xff\xfe\x00\xc3(",
    b"9" * 400,
    b"-" + b"9" * 400,
    b"9" * 5_000,
    b"00-" + b"f" * 32 + b"-" + b"f" * 16 + b"-ff",
)
"""Values any producer may write: empty, unparsable, signed, float, overflowing, not ASCII or
not UTF-8, beyond a float, over Python's integer digit limit, a well-formed bogus traceparent."""


class Repeated(Mapping[str, bytes]):
    """Headers whose names repeat (Kafka allows it): ``items()`` yields every pair."""

    def __init__(self, pairs: list[tuple[str, bytes]]) -> None:
        """Hold ``pairs`` in order."""
        self._pairs = pairs

    def __getitem__(self, name: str) -> bytes:
        """The last value of ``name``."""
        return dict(self._pairs)[name]

    def __iter__(self) -> Iterator[str]:
        """Each name once."""
        return iter(dict(self._pairs))

    def __len__(self) -> int:
        """How many distinct names."""
        return len(dict(self._pairs))

    def items(self) -> list[tuple[str, bytes]]:  # type: ignore[override]
        """Every pair, repeated names included."""
        return list(self._pairs)


@dataclass(frozen=True)
class Case:
    """One hostile message: ``value`` is unique in the batch and names the handler's behaviour."""

    value: bytes
    key: bytes | None
    headers: Mapping[str, bytes]

    def record(self) -> Record:
        """The record to produce."""
        return Record(self.value, self.key, self.headers)


def _value(tag: str, index: int) -> bytes:
    return f"{tag}-{index}".encode()


def hostile_batch(tag: str) -> list[Case]:
    """A seeded batch: every header with every value, random mixes, odd keys and values.

    ``tag`` (``m`` or ``t`` and a unique suffix) starts each value; its first letter seeds it.
    """
    rng = random.Random(f"{SEED}:{tag[0]}")
    cases: list[Case] = []
    width = len(VALUES)
    for shift in range(width):  # every (header, value) pair once, all headers at a time
        headers = {name: VALUES[(shift + k) % width] for k, name in enumerate(NAMES)}
        cases.append(Case(_value(tag, len(cases)), b"k%d" % shift, headers))
    for _ in range(40):  # one to three headers each, random
        names = rng.sample(NAMES, rng.randint(1, 3))
        headers = {name: rng.choice(VALUES) for name in names}
        cases.append(Case(_value(tag, len(cases)), b"r%d" % rng.randint(0, 7), headers))
    for name in (h.ATTEMPT, h.DUE_MS, h.DEADLINE_MS, h.TENANT, h.ORIGIN_TOPIC, TRACEPARENT):
        cases.append(Case(_value(tag, len(cases)), b"huge", {name: b"7" * MIB}))
        cases.append(  # a name repeated, the last value well-formed
            Case(
                _value(tag, len(cases)),
                b"dup",
                Repeated([(name, b"\xff"), (name, b"-5"), (name, b"2")]),
            )
        )
    now = str(int(time.time() * 1000)).encode()
    for key in (None, b"", b"K" * MIB, "\u00e9".encode(), b"\xff\x00"):
        cases.append(Case(_value(tag, len(cases)), key, {h.DUE_MS: now}))
    if tag.startswith("m"):  # one empty value in the whole batch, so it stays unique
        cases.append(Case(b"", b"empty-value", {}))
    cases.append(Case(tag.encode() + b"-big-" + b"V" * (MIB - 64), b"big-value", {h.ATTEMPT: b"x"}))
    return cases


def abandon_ms(headers: Mapping[str, bytes]) -> int:
    """The ``pl-abandon-after-ms`` the member reads off ``headers`` (0: none)."""
    return h.int_header(dict(headers.items()), h.ABANDON_AFTER_MS)


def behaviour(value: bytes) -> str:
    """What the handler does with the message whose value is ``value``."""
    digest = sum(value[:32]) + len(value)
    return ("ok", "ok", "fail-once", "ok", "always-fail")[digest % 5]


class Outcomes:
    """What became of each message, by value: handled (last attempt succeeded) or dead-lettered."""

    def __init__(self) -> None:
        """Nothing yet."""
        self.handled: set[bytes] = set()
        self.attempts: dict[bytes, int] = {}
        self.dead: dict[bytes, Message] = {}

    async def handle(self, event: bytes, ctx: Context) -> None:  # noqa: ARG002
        """Record the attempt; fail it as :func:`behaviour` says."""
        value = ctx.message.value
        self.attempts[value] = self.attempts.get(value, 0) + 1
        kind = behaviour(value)
        if kind == "always-fail" or (kind == "fail-once" and self.attempts[value] == 1):
            raise RuntimeError(f"upstream 503 for {value[:16]!r}")
        self.handled.add(value)

    def ended(self) -> set[bytes]:
        """The values handled or dead-lettered so far."""
        return self.handled | set(self.dead)

    async def read_dead(self, dlq: Reader) -> None:
        """Record every dead letter ``dlq`` reads, until cancelled."""
        while True:
            for message in await dlq.poll(500, 0.5):
                self.dead[message.value] = message


async def caught_up(admin: Admin, group: str, topics: list[str]) -> bool:
    """Whether ``group``'s committed position is the end of every partition of ``topics``."""
    for topic in topics:
        for lag in await admin.group_lag(group, topic):
            if (lag.committed or 0) < lag.end:
                return False
    return True


async def test_hostile_headers_keys_and_values_are_each_handled_or_dead_lettered(
    transport: Transport, unique: str, redis: Redis
) -> None:
    """A seeded batch on the main and the first retry-tier topic: every message ends."""
    spec = lane_spec(
        f"fz_{unique}",
        1,
        ordered=True,
        on_expiry="dead_letter",
        retry={"tiers": ["100ms", "200ms"], "max_attempts": 3},
    )
    await declare(transport, spec)
    app = App([spec])
    outcomes = Outcomes()
    app.handler(spec.lane)(outcomes.handle)
    main = hostile_batch(f"m{unique}")
    tier = hostile_batch(f"t{unique}")
    await produce(transport, spec.name, [case.record() for case in main])
    await produce(transport, spec.retry_topic_names()[0], [case.record() for case in tier])
    values = {case.value for case in main + tier}
    assert len(values) == len(main + tier)
    now_ms = int(time.time() * 1000)
    abandoned = {c.value for c in main + tier if 0 < abandon_ms(c.headers) <= now_ms}
    expected = values - abandoned  # no one waits for those: cancelled, dropped (counted)

    group = f"g-{unique}"
    dlq, admin = transport.reader([spec.dead_letter]), transport.admin()
    member = Member(
        app,
        transport,
        group,
        FAST,
        redis=redis,
        redis_prefix=f"t{unique}",
        metrics=RuntimeMetrics(Metrics()),
    )
    reading = asyncio.create_task(outcomes.read_dead(dlq))
    try:
        async with running(member):
            with contextlib.suppress(AssertionError):  # the missing ones are named below
                await eventually(lambda: expected <= outcomes.ended(), timeout_s=50)
            missing = sorted(v[:24] for v in expected - outcomes.ended())
            assert missing == [], f"{len(missing)} never ended; {member.stats}"
            await produce(transport, spec.name, [Record(b"normal", b"k0")])
            await eventually(lambda: b"normal" in outcomes.handled, timeout_s=20)
            topics = [spec.name, *spec.retry_topic_names()]
            deadline = time.monotonic() + 20
            while not await caught_up(admin, group, topics):
                assert time.monotonic() < deadline, "committed positions never reached the end"
                await asyncio.sleep(0.1)
    finally:
        reading.cancel()
        await dlq.close()
        await admin.close()

    assert member.stats.cancelled >= len(abandoned - outcomes.ended())
    reasons = {v: m.headers.get(h.DEAD_REASON) for v, m in outcomes.dead.items()}
    odd = sorted((v[:24], r) for v, r in reasons.items() if r not in _REASONS)
    assert odd == []


_REASONS = {b"exhausted", b"expired", b"poison", b"sequenced"}
"""Why a message of this batch may be dead-lettered (its handler raises no fatal error)."""


async def test_messages_with_the_same_garbled_origin_are_each_handled(
    transport: Transport, unique: str, redis: Redis
) -> None:
    """Origin headers naming no position of the lane give no id: neither is a "duplicate"."""
    spec = lane_spec(f"fzo_{unique}", 1, retry={"tiers": ["100ms"]})
    garbled = {h.ORIGIN_TOPIC: b"abc", h.ORIGIN_PARTITION: b"0", h.ORIGIN_OFFSET: b"1"}
    sends = {
        spec.name: [Record(b"a", b"k1", garbled), Record(b"b", b"k2", garbled)],
        spec.retry_topic_names()[0]: [Record(b"c", b"k3", garbled)],
    }
    handled = await handled_by_a_member(transport, redis, unique, spec, sends, 3)
    assert sorted(handled) == [b"a", b"b", b"c"]


async def test_a_due_time_beyond_a_float_is_due_now_not_a_failure_left_for_redelivery(
    transport: Transport, unique: str, redis: Redis
) -> None:
    """``pl-due-ms`` of 400 digits: the member's lateness metric took it as a number and raised."""
    spec = lane_spec(f"fzd_{unique}", 1, retry={"tiers": ["100ms"]})
    copies = [Record(b"far", b"k1", {h.DUE_MS: b"9" * 400}), Record(b"next", b"k2")]
    handled = await handled_by_a_member(
        transport,
        redis,
        unique,
        spec,
        {spec.retry_topic_names()[0]: copies},
        2,
        metrics=RuntimeMetrics(Metrics()),
        timeout_s=30,
    )
    assert sorted(handled) == [b"far", b"next"]


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        (b"12", 12),
        (b"-1", -1),
        (b"9223372036854775807", 2**63 - 1),
        (b"9223372036854775808", None),
        (b"9" * 400, None),
        (b" 12 ", None),
        (b"1_000", None),
        (b"+5", None),
        (b"1e309", None),
        (b"nan", None),
        (b"", None),
        (b"\xff", None),
    ],
)
def test_a_number_header_is_ascii_decimal_within_64_bits(raw: bytes, value: int | None) -> None:
    """What :func:`pipeline.headers.parse_int` takes; anything else is malformed."""
    assert h.parse_int(raw) == value

"""``pl-error-digest`` of a CPU lane's failure names where in the worker it was raised.

The digest hashes the exception's class and the file and function of every frame it was raised
through, so operators can group dead letters by cause. A CPU handler's exception comes back from
its worker pickled, without its traceback, and is raised again in the member: its frames were
the member's only (``handling.py``, ``cpu.py``), so every ValueError of a CPU lane had one digest,
whichever line raised it. The worker now hashes its own frames and sends the digest back with
the exception; the digest of an ordinary lane's failure is unchanged (pinned here: dead letters
already written are grouped by it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
from contract.helpers import consume_until
from redis.asyncio import Redis
from runtime import cpu_failing_app
from runtime.helpers import declare, lane_spec, produce, ran_until

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.retry.router import error_digest
from pipeline.runtime import App
from pipeline.runtime.cpu import ProcessPool, function_ref
from pipeline.transport.protocol import Transport

FORGED = b"f0f0f0f0f0f0"
"""A digest a producer wrote on the message: never the dead letter's."""


async def test_a_cpu_lanes_dead_letters_are_told_apart_by_where_the_worker_raised(
    streams: Transport, redis: Redis, unique: str
) -> None:
    """Two ValueErrors of ``inner_a`` share a digest; one of ``inner_b`` has another."""
    spec = lane_spec(f"cdig_{unique}", 1, ordered=False)  # no tiers: each failure dead-letters
    await declare(streams, spec)
    app = App([spec])
    app.handler(spec.lane, cpu=True, time_limit_s=60)(cpu_failing_app.crunch)
    forged = {h.ERROR_DIGEST: FORGED}
    sent = [Record(b"a1", b"k1"), Record(b"a2", b"k2", forged), Record(b"b1", b"k3", forged)]
    await produce(streams, spec.name, sent)
    await ran_until(app, streams, redis, unique, lambda m: m.stats.dead_lettered == 3, 120)
    dlq = streams.consumer(f"dlq-{unique}", [spec.dead_letter])
    try:
        dead = await consume_until(dlq, lambda r: len(r) >= 3)
    finally:
        await dlq.close()
    digests = {m.value: m.headers[h.ERROR_DIGEST] for m in dead}
    assert digests[b"a1"] == digests[b"a2"]
    assert digests[b"a1"] != digests[b"b1"]
    assert FORGED not in digests.values()


async def test_the_pools_exception_carries_the_digest_of_the_workers_frames() -> None:
    """The exception a worker sends back is digested by where the handler raised it."""
    pool = ProcessPool(1, grace_s=1.0)
    digests: dict[bytes, str] = {}
    try:
        for event in (b"a1", b"a2", b"b1"):
            with pytest.raises(ValueError, match=r"^bad ") as raised:
                await pool.run(function_ref(cpu_failing_app.crunch), (event, None), 60)
            digests[event] = error_digest(raised.value)
    finally:
        await pool.close()
    assert digests[b"a1"] == digests[b"a2"]
    assert digests[b"a1"] != digests[b"b1"]
    frames = ["cpu.py:_serve", "cpu_failing_app.py:crunch", "cpu_failing_app.py:inner_a"]
    shape = f"ValueError|{'|'.join(frames)}"
    assert digests[b"a1"] == hashlib.sha256(shape.encode()).hexdigest()[:12]


def _inner(value: int) -> None:
    raise ValueError(f"bad value {value}")


def _outer(value: int) -> None:
    _inner(value)


def _caught(fn: Callable[[int], None], value: int) -> BaseException:
    try:
        fn(value)
    except ValueError as exc:
        return exc
    raise AssertionError("nothing raised")


def test_an_ordinary_failures_digest_is_pinned() -> None:
    """The digest of a failure raised in the member stays the value existing dead letters hold.

    ``ValueError`` raised through ``_caught`` -> ``_outer`` -> ``_inner`` of this file:
    sha256 of ``ValueError|test_cpu_error_digest.py:_caught|...:_outer|...:_inner``, 12 hex.
    """
    assert error_digest(_caught(_outer, 1)) == "d30668719462"
    assert error_digest(RuntimeError("made, not raised")) == "91d9362b2ca9"

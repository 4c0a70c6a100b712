"""Nothing is lost when Redis refuses the run guard's calls at the worst moments of parking.

On an ordered lane with retry tiers, a message routed to a tier (a failure, or a deferral: a
spill's or an over-share's) parks its key, and its key's later messages are held in Redis behind
it, their offsets committed. If Redis cannot be reached, parking fails open: messages still
run, order across retries is not guarded for that time, and nothing is lost
(``docs/runtime.md``). These tests make a private Redis refuse the guard's calls (``FCALL``
taken from the member's ACL user: every call answers ``NOPERM``, the data stays) at the moments
that matter, and count at the end that every message ran:

* a parked key's head fails again, its copy is produced to the tier, and both the call that
  records the route (``gd_route``) and the end that parks the key again (``gd_end_many``) are
  refused; Redis answers again before that copy comes back. The head's start mark still named
  the copy that failed, so the next copy was taken for a duplicate of a run still going and
  dropped, its offset committed, and the followers held behind it never ran;
* the same for a deferral (what a spill does to a hot key's first waiting message).

Redis refuses from inside the handler and answers again from the log line that says the end was
not recorded: no sleeps, no timing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Self

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running
from runtime.private_redis import bare_redis

from pipeline.config import RuntimeSettings
from pipeline.envelope import Message, Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

USER, PASSWORD = "member", "member-secret"


class Refusals:
    """The member's Redis user, whose ``FCALL`` is taken away and given back by the test."""

    def __init__(self, admin: SyncRedis) -> None:
        """Create the user with every right (``admin``: the server's default user)."""
        self._admin = admin
        admin.execute_command("ACL", "SETUSER", USER, "on", f">{PASSWORD}", "~*", "&*", "+@all")
        self.refused = 0
        self.answered = 0

    def refuse(self) -> None:
        """Every ``FCALL`` of the member answers ``NOPERM`` from now on (its data stays)."""
        self._admin.execute_command("ACL", "SETUSER", USER, "-fcall")
        self.refused += 1

    def answer(self) -> None:
        """The member's ``FCALL``s answer again."""
        self._admin.execute_command("ACL", "SETUSER", USER, "+fcall")
        self.answered += 1


class _RefuseOnce(logging.Handler):
    """Takes the member's calls away the first time a line holding ``text`` is logged."""

    def __init__(self, refusals: Refusals, text: str) -> None:
        super().__init__(logging.DEBUG)
        self._refusals = refusals
        self._text = text

    def emit(self, record: logging.LogRecord) -> None:
        if not self._refusals.refused and self._text in record.getMessage():
            self._refusals.refuse()


class _AnswerAgain(logging.Handler):
    """Gives the member's calls back once it logged that an end on a parked key failed."""

    def __init__(self, refusals: Refusals) -> None:
        super().__init__(logging.WARNING)
        self._refusals = refusals

    def emit(self, record: logging.LogRecord) -> None:
        if "could not record" in record.getMessage():
            self._refusals.answer()


@contextmanager
def refusing_redis() -> Iterator[tuple[str, Refusals]]:
    """A private Redis, the member's URL on it, and the refusals; answers after an end failed."""
    with bare_redis() as server:
        admin = SyncRedis.from_url(server.url)
        refusals = Refusals(admin)
        handler = _AnswerAgain(refusals)
        ends = logging.getLogger("pipeline.runtime.ends")
        ends.addHandler(handler)
        try:
            yield f"redis://{USER}:{PASSWORD}@127.0.0.1:{server.port}/0", refusals
        finally:
            ends.removeHandler(handler)
            admin.close()


async def run_all(
    kafka: Transport,
    unique: str,
    url: str,
    app: App,
    topic: str,
    records: list[Record],
    done: list[bytes],
    settings: RuntimeSettings = FAST,
    *,
    retry: Retry | None = None,
) -> Member:
    """Produce ``records`` on ``topic``, run a member of ``app`` until ``done`` holds them all.

    ``retry``: its Redis client's (None: redis-py's default, no retry).
    """
    await produce(kafka, topic, records)
    redis = Redis.from_url(url) if retry is None else Redis.from_url(url, retry=retry)
    member = Member(app, kafka, f"g-{unique}", settings, redis=redis, redis_prefix=f"t{unique}")
    try:
        async with running(member):
            try:
                await eventually(lambda: len(set(done)) >= len(records), timeout_s=20)
            except AssertionError:
                raise AssertionError(
                    f"ran {done}, not every one of {len(records)}: a message was lost"
                    f" (stats: {member.stats})"
                ) from None
    finally:
        await redis.aclose()
    return member


async def _head_and_two_followers(
    kafka: Transport, unique: str, name: str, copy_runs: Callable[[Context, Refusals], None]
) -> tuple[Member, Refusals, list[bytes]]:
    """k:0 fails, parking its key (k:1 and k:2 held); each copy of it calls ``copy_runs`` first.

    Returns the member, the refusals and what ran, once all three ran.
    """
    spec = lane_spec(f"{name}_{unique}", 1, retry={"tiers": ["200ms"], "max_attempts": 6})
    await declare(kafka, spec)
    app = App([spec])
    done: list[bytes] = []
    with refusing_redis() as (url, refusals):

        @app.handler(spec.lane)
        async def handle(event: Message, ctx: Context) -> None:
            if event.value == b"k:0":
                if ctx.attempt == 1:
                    raise RuntimeError("fails, parks its key")
                copy_runs(ctx, refusals)
            done.append(event.value)

        records = [Record(b"k:%d" % n, b"k") for n in range(3)]
        member = await run_all(kafka, unique, url, app, spec.name, records, done)
    return member, refusals, done


async def test_a_head_failing_again_while_redis_refuses_its_route_still_runs(
    kafka: Transport, unique: str
) -> None:
    """k:0 fails, k:1 and k:2 are held; its copy fails while Redis refuses; all three run."""

    def fails_again_as_redis_goes(ctx: Context, refusals: Refusals) -> None:
        if ctx.attempt == 2:
            refusals.refuse()  # Redis goes away: the route and the end are refused
            raise RuntimeError("fails again")

    member, refusals, done = await _head_and_two_followers(
        kafka, unique, "headout", fails_again_as_redis_goes
    )
    assert refusals.refused == 1
    assert done == [b"k:0", b"k:1", b"k:2"], "order lost while Redis answered"
    assert member.stats.duplicates == 0


async def test_followers_of_a_head_whose_end_redis_refuses_still_run(
    kafka: Transport, unique: str
) -> None:
    """k:0 fails, k:1 and k:2 are held; its copy runs while Redis refuses its end: all run.

    The end of the head's copy is what releases its followers, and that copy's offset is
    committed either way.
    """

    def redis_goes(_ctx: Context, refusals: Refusals) -> None:
        refusals.refuse()  # Redis goes away as the head's copy ends

    _, refusals, done = await _head_and_two_followers(kafka, unique, "endout", redis_goes)
    assert refusals.refused == 1
    assert done == [b"k:0", b"k:1", b"k:2"]


async def test_a_spill_whose_park_redis_refuses_loses_nothing(
    kafka: Transport, unique: str
) -> None:
    """A hot key spills; Redis refuses from the spill until an end fails: every message runs.

    80 messages of key ``hot`` (20 ms each) fill a 20-message buffer (as in
    ``test_hot_key_spill.py``): the partition spills, and from that moment Redis refuses, so the
    first deferral's park (``gd_route``) and its end are refused; it answers again once that end
    failed, before the holds of the followers. Order across the deferral is not guarded for that
    time; every message runs.
    """
    spec = lane_spec(f"spillout_{unique}", 1, retry={"tiers": ["200ms"], "max_attempts": 6})
    await declare(kafka, spec)
    app = App([spec])
    done: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        if event.key == b"hot":
            await asyncio.sleep(0.02)  # the member's work, not a synchronisation
        done.append(event.value)

    settings = FAST.model_copy(
        update={"partition_high_water": 20, "partition_low_water": 10, "poll_max": 10}
    )
    assert isinstance(settings, RuntimeSettings)
    records = [Record(b"hot:%d" % n, b"hot") for n in range(80)]
    records += [Record(b"cold:%d" % n, b"cold%d" % n) for n in range(4)]
    with refusing_redis() as (url, refusals):
        spills = logging.getLogger("pipeline.runtime.chain")
        refuse = _RefuseOnce(refusals, "is full (partition_high_water)")
        level = spills.level
        spills.setLevel(logging.INFO)  # the spill's line
        spills.addHandler(refuse)
        try:
            member = await run_all(kafka, unique, url, app, spec.name, records, done, settings)
        finally:
            spills.removeHandler(refuse)
            spills.setLevel(level)
    assert refusals.refused == 1, "no spill"
    assert refusals.answered >= 1, "the deferral's end was not refused"
    assert member.stats.deferred >= 1
    assert sorted(set(done)) == sorted(record.value for record in records)


class _DroppingProxy:
    """A TCP proxy to Redis that, once armed, lets one call through and loses its reply.

    The call matching ``needle`` reaches Redis, which runs it; its reply never reaches the
    client, whose connection is closed instead (a network cut after the request went out).
    """

    def __init__(self, upstream_port: int, needle: bytes) -> None:
        """Forward to ``upstream_port``; lose the reply of the first call holding ``needle``."""
        self._upstream = upstream_port
        self._needle = needle
        self.armed = False
        self.dropped = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.port = 0

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()
            await asyncio.gather(writer.wait_closed(), return_exceptions=True)
        await self._server.wait_closed()

    def _track(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream)
        self._writers.append(up_writer)
        cut = asyncio.Event()
        self._track(self._back(up_reader, writer, cut))
        self._track(self._forth(reader, up_writer, cut))

    async def _forth(
        self, reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, cut: asyncio.Event
    ) -> None:
        while chunk := await reader.read(65536):
            up_writer.write(chunk)
            await up_writer.drain()
            if self.armed and self._needle in chunk:
                self.armed = False
                cut.set()  # the reply to this call is lost, the connection cut
                return

    async def _back(
        self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cut: asyncio.Event
    ) -> None:
        while chunk := await up_reader.read(65536):
            if cut.is_set():
                self.dropped += 1
                writer.close()  # Redis ran the call: its reply goes nowhere
                return
            writer.write(chunk)
            await writer.drain()


@pytest.mark.parametrize("retries", [0, 1], ids=["fail-open", "retried-once"])
async def test_a_hold_whose_reply_is_lost_is_not_lost(
    kafka: Transport, unique: str, retries: int
) -> None:
    """k:0 fails; k:1's hold reaches Redis but its reply is lost: k:1 is not lost.

    ``retries`` 0: the guard fails open and k:1 runs at once, ahead of k:0's copy, and once
    more when k:0's copy releases it (held all along). 1 (``pipeline consume``'s client, one
    quick retry): the call sent again finds k:1 held (``copy``), and k:1 runs once, in order.
    Its offset is committed only on a reply that says it is held.
    """
    spec = lane_spec(f"holdcut_{unique}", 1, retry={"tiers": ["200ms"], "max_attempts": 6})
    await declare(kafka, spec)
    app = App([spec])
    done: list[bytes] = []
    with bare_redis() as server:
        async with _DroppingProxy(server.port, b"\nk:1") as proxy:

            @app.handler(spec.lane)
            async def handle(event: Message, ctx: Context) -> None:
                if event.value == b"k:0" and ctx.attempt == 1:
                    proxy.armed = True  # k:1's hold, next, loses its reply
                    raise RuntimeError("fails, parks its key")
                done.append(event.value)

            retry = Retry(ExponentialBackoff(cap=0.2, base=0.05), retries)
            records = [Record(b"k:%d" % n, b"k") for n in range(3)]
            url = f"redis://127.0.0.1:{proxy.port}/0"
            await run_all(kafka, unique, url, app, spec.name, records, done, retry=retry)
            if retries == 0:  # k:1 ran ahead of the head, then again when released
                await eventually(lambda: len(done) == 4, timeout_s=20)
            assert proxy.dropped == 1, "no reply was lost"
    if retries == 0:
        assert done[0] == b"k:1", done
        assert sorted(done[1:]) == [b"k:0", b"k:1", b"k:2"], done
    else:
        assert done == [b"k:0", b"k:1", b"k:2"]

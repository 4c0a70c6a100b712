"""Redrive on both real brokers: dry run, filters, resume without duplicates, loop cap, expiry."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from contract.helpers import consume_until, expire_below
from redis.asyncio import Redis
from redrive.helpers import dead_letter_lane
from runtime.helpers import declare, lane_spec, produce
from support import delete_group_after, stopped_once_it_sent

from pipeline import headers as h
from pipeline.config import Settings
from pipeline.envelope import Delivered, Message, Record
from pipeline.errors import ConfigError, DeadLetter
from pipeline.redrive.redrive import Redrive, Report, group_name
from pipeline.redrive.select import Selection
from pipeline.retry.policy import Backoff
from pipeline.retry.router import LaneRoutes, RetryRouter
from pipeline.transport import create_transport
from pipeline.transport.protocol import Admin, Consumer, Producer, Reader, Transport


class Timeout(Exception):
    """An upstream timeout, as a handler would see it."""


async def _fill_dlq(transport: Transport, name: str) -> LaneRoutes:
    """Dead-letter 6 messages: 4 timeouts (one already redriven 3 times), 2 fatal."""
    spec = lane_spec(name, 2)
    await declare(transport, spec)
    routes = LaneRoutes(spec.name, (), spec.dead_letter, 1, Backoff(()))
    router = RetryRouter(transport.producer())
    for i in range(6):
        headers = {h.EVENT_ID: b"evt-%d" % i, h.TENANT: b"acme" if i % 2 else b"globex"}
        if i == 5:
            headers[h.REDRIVE_COUNT] = b"3"
        message = Message(spec.name, 0, 100 + i, b"k%d" % i, b"v%d" % i, headers)
        error = DeadLetter("bad payload") if i in (1, 3) else Timeout("upstream")
        await router.dead_letter(routes, message, "fatal", error)
    return routes


async def test_dry_run_counts_reasons_and_moves_nothing(transport: Transport, unique: str) -> None:
    """A dry run reports selected messages by reason and leaves the origin topic empty."""
    routes = await _fill_dlq(transport, f"rd_{unique}")
    report = await Redrive(transport, routes.dead_letter_topic, Selection(), dry_run=True).run()
    assert report.scanned == report.selected == 6
    assert report.moved == 0
    assert report.reasons["fatal: pipeline.errors.DeadLetter"] == 2
    assert sum(report.reasons.values()) == 6
    topics = await transport.admin().list_topics()
    assert topics[routes.topic].message_count == 0


async def test_redrive_moves_the_selection_back_once(transport: Transport, unique: str) -> None:
    """Selected messages go back to their origin with key and event id; a rerun moves nothing."""
    routes = await _fill_dlq(transport, f"rd_{unique}")
    selection = Selection(error_class="Timeout")
    first = await Redrive(transport, routes.dead_letter_topic, selection).run()
    assert (first.selected, first.moved, first.refused_loops) == (4, 3, 1)
    again = await Redrive(transport, routes.dead_letter_topic, selection).run()
    assert again.scanned == 0
    consumer = transport.consumer(f"check-{unique}", [routes.topic])
    back = await consume_until(consumer, lambda r: len(r) >= 3)
    await consumer.close()
    assert sorted(m.value for m in back) == [b"v0", b"v2", b"v4"]
    for message in back:
        assert message.key == b"k" + message.value[1:]
        assert message.headers[h.EVENT_ID] == b"evt-" + message.value[1:]
        assert message.headers[h.REDRIVE_COUNT] == b"1"
        assert h.ERROR_CLASS not in message.headers
        assert h.DEAD_REASON not in message.headers


async def test_an_interrupted_redrive_resumes_without_duplicates(
    transport: Transport, unique: str
) -> None:
    """A run stopped after two messages, run again, moves each selected message exactly once."""
    routes = await _fill_dlq(transport, f"rd_{unique}")
    selection = Selection(tenant="globex")
    partial = await Redrive(transport, routes.dead_letter_topic, selection, limit=2).run()
    assert partial.moved == 2
    rest = await Redrive(transport, routes.dead_letter_topic, selection).run()
    assert rest.moved == 1
    consumer = transport.consumer(f"check-{unique}", [routes.topic])
    back = await consume_until(consumer, lambda r: len(r) >= 3)
    await consumer.close()
    assert sorted(m.value for m in back) == [b"v0", b"v2", b"v4"]
    info = (await transport.admin().list_topics())[routes.topic]
    assert info.message_count == 3


async def test_expired_dead_letters_are_not_waited_for(
    transport: Transport, settings: Settings, unique: str
) -> None:
    """A partition whose records expired, all or the first of them, ends the run all the same."""
    routes = await _fill_dlq(transport, f"rd_{unique}")
    dlq = routes.dead_letter_topic
    gone, cut = await transport.admin().group_lag(f"nobody-{unique}", dlq)
    assert (gone.end, cut.end) == (3, 3)  # the keys split the six dead letters evenly
    await expire_below(transport, settings, gone.tp, gone.end)
    await expire_below(transport, settings, cut.tp, 1)
    job = Redrive(transport, dlq, Selection())
    ahead = await job.total()
    report = await asyncio.wait_for(job.run(), 30)
    assert (ahead, report.scanned, report.moved) == (2, 2, 2)
    assert (await Redrive(transport, dlq, Selection()).run()).scanned == 0


class _CancelAfterFirstSend:
    """A producer that cancels ``task`` once the broker acknowledged its first send."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self.task: asyncio.Task[Report] | None = None

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Send, then cancel the run: it stops at its next wait, the pause of its rate cap."""
        out = await self._producer.send_many(topic, records)
        assert self.task is not None
        self.task.cancel()
        return out

    async def close(self) -> None:
        """Close the real producer."""
        await self._producer.close()


async def test_a_stopped_redrive_resumes_after_what_it_sent(
    transport: Transport, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run cancelled after its first record, in the middle of a batch, does not send it again."""
    routes = await _fill_dlq(transport, f"rd_{unique}")
    stopper = _CancelAfterFirstSend(transport.producer())
    with monkeypatch.context() as patch:
        patch.setattr(transport, "producer", lambda: stopper)
        job = Redrive(transport, routes.dead_letter_topic, Selection(), rate_per_s=1000)
        stopper.task = asyncio.create_task(job.run())
        with pytest.raises(asyncio.CancelledError):
            await stopper.task
    rest = await Redrive(transport, routes.dead_letter_topic, Selection(), rate_per_s=1000).run()
    info = (await transport.admin().list_topics())[routes.topic]
    assert (job.report.moved, rest.moved, info.message_count) == (1, 4, 5)


class _CancelDuringFirstSend:
    """A producer that cancels ``task`` while its first send is on its way to the broker."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self.task: asyncio.Task[Report] | None = None

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Cancel the run the first time, then send: the stop comes before the broker answers."""
        if self.task is not None:
            self.task.cancel()
            self.task = None
        return await self._producer.send_many(topic, records)

    async def close(self) -> None:
        """Close the real producer."""
        await self._producer.close()


async def test_a_redrive_stopped_during_a_send_settles_what_the_broker_took(
    transport: Transport, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop while a record is on its way waits for the broker: it is committed, not resent."""
    routes = await _fill_dlq(transport, f"rd_{unique}")
    stopper = _CancelDuringFirstSend(transport.producer())
    with monkeypatch.context() as patch:
        patch.setattr(transport, "producer", lambda: stopper)
        job = Redrive(transport, routes.dead_letter_topic, Selection(), rate_per_s=1000)
        stopper.task = task = asyncio.create_task(job.run())
        with pytest.raises(asyncio.CancelledError):
            await task
    rest = await Redrive(transport, routes.dead_letter_topic, Selection(), rate_per_s=1000).run()
    info = (await transport.admin().list_topics())[routes.topic]
    assert (job.report.moved, rest.moved, info.message_count) == (1, 4, 5)


async def test_a_dry_run_counts_only_what_the_redrive_has_still_ahead(
    transport: Transport, unique: str
) -> None:
    """After a partial redrive, a dry run counts what is left, and the redrive then moves it."""
    routes = await _fill_dlq(transport, f"rd_{unique}")
    dlq = routes.dead_letter_topic
    selection = Selection(tenant="globex")
    partial = await Redrive(transport, dlq, selection, limit=2).run()
    assert partial.moved == 2
    real = Redrive(transport, dlq, selection)
    dry = Redrive(transport, dlq, selection, dry_run=True)
    assert await dry.total() == await real.total()
    counted = await dry.run()
    assert (counted.selected, counted.moved) == (1, 0)
    dry_group = f"{group_name(dlq, None, selection)}.dry"
    assert all(p.committed is None for p in await transport.admin().group_lag(dry_group, dlq))
    assert (await real.run()).moved == 1


class _ExpireAtFirstPoll:
    """A consumer that makes records of the DLQ disappear just before its first poll.

    The run has read the partitions' ends by then: the records expire in the middle of it.
    """

    def __init__(self, consumer: Consumer, expire: Callable[[], Awaitable[None]]) -> None:
        self._consumer = consumer
        self._expire: Callable[[], Awaitable[None]] | None = expire

    async def poll(self, max_messages: int = 500, timeout_s: float = 1.0) -> list[Message]:
        """Expire the records once, then poll the real consumer."""
        if self._expire is not None:
            expire, self._expire = self._expire, None
            await expire()
        return await self._consumer.poll(max_messages, timeout_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


async def test_dead_letters_expiring_during_a_run_are_not_waited_for(
    transport: Transport, settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records trimmed after the run read the ends, all or the first of them, do not hold it."""
    routes = await _fill_dlq(transport, f"rd_{unique}")
    dlq = routes.dead_letter_topic
    gone, cut = await transport.admin().group_lag(f"nobody-{unique}", dlq)
    assert (gone.end, cut.end) == (3, 3)

    async def expire() -> None:
        await expire_below(transport, settings, gone.tp, gone.end)
        await expire_below(transport, settings, cut.tp, 1)

    consumer = transport.consumer
    with monkeypatch.context() as patch:
        patch.setattr(
            transport, "consumer", lambda *a, **kw: _ExpireAtFirstPoll(consumer(*a, **kw), expire)
        )
        job = Redrive(transport, dlq, Selection())
        assert await job.total() == 6
        report = await asyncio.wait_for(job.run(), 60)
    assert (report.scanned, report.moved) == (2, 2)
    assert (await Redrive(transport, dlq, Selection()).run()).scanned == 0


async def test_a_dry_run_left_behind_by_a_killed_one_counts_all_that_is_ahead(
    transport: Transport, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dry run that died without deleting its group does not make the next one count less."""
    _, dlq, headers = await dead_letter_lane(transport, unique, 2)
    await produce(transport, dlq, [Record(b"v%d" % i, b"one-key", headers) for i in range(300)])
    admin = transport.admin()
    with monkeypatch.context() as patch:  # as if killed: its group is not deleted
        patch.setattr(type(admin), "delete_group", _keep_group)
        killed = await Redrive(transport, dlq, Selection(), dry_run=True, limit=250).run()
    assert killed.selected == 250
    assert (await Redrive(transport, dlq, Selection(), limit=10).run()).moved == 10
    dry = await asyncio.wait_for(Redrive(transport, dlq, Selection(), dry_run=True).run(), 60)
    assert (dry.scanned, dry.selected) == (290, 290)
    lags = await transport.admin().group_lag(group_name(dlq, None, Selection()), dlq)
    assert sum(p.committed or 0 for p in lags) == 10  # the dry runs moved not its position
    assert (await Redrive(transport, dlq, Selection()).run()).moved == 290


async def _keep_group(*_: object) -> None:
    """A ``delete_group`` that deletes nothing."""


class _Closing:
    """An admin client that notes whether it was closed."""

    def __init__(self, admin: Admin, made: list[_Closing]) -> None:
        self._admin = admin
        self.closed = False
        made.append(self)

    async def close(self) -> None:
        """Close the real client and note it."""
        self.closed = True
        await self._admin.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._admin, name)


async def test_the_admin_clients_of_a_redrive_are_closed(
    transport: Transport, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admin clients that the total and the run open are closed when they are done."""
    routes = await _fill_dlq(transport, f"rd_{unique}")
    made: list[_Closing] = []
    admin = transport.admin
    with monkeypatch.context() as patch:
        patch.setattr(transport, "admin", lambda: _Closing(admin(), made))
        for dry_run in (True, False):
            job = Redrive(transport, routes.dead_letter_topic, Selection(), dry_run=dry_run)
            await job.total()
            await job.run()
    assert len(made) >= 4  # and on Kafka the one deleting the dry run's group of its own
    assert all(client.closed for client in made)


class _PollTogether:
    """A reader whose first poll waits until every reader of the test has polled once."""

    def __init__(
        self, consumer: Reader, polled: list[_PollTogether], all_in: asyncio.Event
    ) -> None:
        self._consumer = consumer
        self._polled = polled
        self._all_in = all_in
        self._first = True

    async def poll(self, max_messages: int = 500, timeout_s: float = 1.0) -> list[Message]:
        """Poll; the first time, wait for the others' first poll before returning."""
        messages = await self._consumer.poll(max_messages, timeout_s)
        if self._first:
            self._first = False
            self._polled.append(self)
            if len(self._polled) == 2:
                self._all_in.set()
            await self._all_in.wait()
        return messages

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


async def test_two_dry_runs_at_once_each_count_everything(
    transport: Transport, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two dry runs of one redrive at the same time each count every dead letter, and both end."""
    _, dlq, headers = await dead_letter_lane(transport, unique, 2)
    await produce(transport, dlq, [Record(b"v%d" % i, b"k%d" % i, headers) for i in range(1000)])
    polled: list[_PollTogether] = []
    all_in = asyncio.Event()
    reader = transport.reader
    with monkeypatch.context() as patch:
        patch.setattr(
            transport, "reader", lambda *a, **kw: _PollTogether(reader(*a, **kw), polled, all_in)
        )
        first, second = (Redrive(transport, dlq, Selection(), dry_run=True) for _ in range(2))
        reports = await asyncio.wait_for(asyncio.gather(first.run(), second.run()), 60)
    assert [(r.scanned, r.selected) for r in reports] == [(1000, 1000), (1000, 1000)]


async def test_dead_letters_whose_origin_cannot_take_them_stay_and_the_rest_move(
    transport: Transport, unique: str
) -> None:
    """An origin naming the DLQ itself, a missing topic or an invalid name leaves it in the DLQ."""
    spec = lane_spec(f"rd_{unique}", 2)
    await declare(transport, spec)
    dlq = spec.dead_letter
    origins = [spec.name, dlq, f"gone_{unique}", "no topic\N{SNOWMAN}", spec.name]
    records = [
        Record(b"v%d" % i, b"one-key", {h.ORIGIN_TOPIC: origin.encode(), h.DEAD_REASON: b"fatal"})
        for i, origin in enumerate(origins)
    ]
    await produce(transport, dlq, records)
    report = await asyncio.wait_for(Redrive(transport, dlq, Selection()).run(), 60)
    assert (report.scanned, report.moved, report.no_origin) == (5, 2, 3)
    counts = await transport.admin().list_topics([spec.name, dlq])
    assert (counts[spec.name].message_count, counts[dlq].message_count) == (2, 5)


async def test_a_target_that_cannot_take_the_dead_letters_is_refused_first(
    transport: Transport, unique: str
) -> None:
    """--to the DLQ itself or a topic that does not exist is a ConfigError; nothing is moved."""
    routes = await _fill_dlq(transport, f"rd_{unique}")
    dlq = routes.dead_letter_topic
    for to in (dlq, f"gone_{unique}"):
        with pytest.raises(ConfigError, match=f"--to '{to}'"):
            await asyncio.wait_for(Redrive(transport, dlq, Selection(), to=to).run(), 60)
    assert (await Redrive(transport, dlq, Selection(), dry_run=True).run()).scanned == 6


async def test_a_redrive_stopped_by_sigterm_commits_what_it_sent(
    transport: Transport, unique: str, tmp_path: Path
) -> None:
    """`pipeline redrive` stopped by SIGTERM commits what it sent: the next run sends the rest."""
    spec = lane_spec(f"rd_{unique}", 2)
    await declare(transport, spec)
    dlq = spec.dead_letter
    (tmp_path / "lane.yaml").write_text(f"name: {spec.name}\npartitions: 2\n")
    headers = {h.ORIGIN_TOPIC: spec.name.encode(), h.DEAD_REASON: b"fatal"}
    await produce(transport, dlq, [Record(b"v%d" % i, b"k%d" % i, headers) for i in range(200)])
    delete_group_after(transport, group_name(dlq, None, Selection.typed_as()), [dlq])
    command = [sys.executable, "-m", "pipeline", "redrive", dlq, "-t", transport.name]
    env = {**os.environ, "PIPELINE_TOPICS_DIR": str(tmp_path)}
    admin = transport.admin()
    pipe = asyncio.subprocess.PIPE
    first = await asyncio.create_subprocess_exec(
        *command, "--rate", "40", env=env, stdout=pipe, stderr=pipe
    )
    stderr = await stopped_once_it_sent(first, admin, spec.name, signal.SIGTERM, "the redrive")
    assert first.returncode == 143
    assert b"Traceback" not in stderr, stderr
    assert b"run the same command again to resume" in stderr
    rest = await asyncio.create_subprocess_exec(*command, env=env, stdout=pipe, stderr=pipe)
    _, stderr = await asyncio.wait_for(rest.communicate(), 90)
    assert rest.returncode == 0, stderr
    assert (await admin.list_topics([spec.name]))[spec.name].message_count == 200


async def test_a_redrive_stopped_by_ctrl_c_says_how_far_it_got(
    transport: Transport, unique: str, tmp_path: Path
) -> None:
    """`pipeline redrive` stopped by Ctrl-C says what it moved and how to resume (exit 130)."""
    spec = lane_spec(f"rd_{unique}", 2)
    await declare(transport, spec)
    dlq = spec.dead_letter
    (tmp_path / "lane.yaml").write_text(f"name: {spec.name}\npartitions: 2\n")
    headers = {h.ORIGIN_TOPIC: spec.name.encode(), h.DEAD_REASON: b"fatal"}
    await produce(transport, dlq, [Record(b"v%d" % i, b"k%d" % i, headers) for i in range(200)])
    delete_group_after(transport, group_name(dlq, None, Selection.typed_as()), [dlq])
    command = [sys.executable, "-m", "pipeline", "redrive", dlq, "-t", transport.name]
    env = {**os.environ, "PIPELINE_TOPICS_DIR": str(tmp_path)}
    admin = transport.admin()
    pipe = asyncio.subprocess.PIPE
    first = await asyncio.create_subprocess_exec(
        *command, "--rate", "40", env=env, stdout=pipe, stderr=pipe
    )
    stderr = await stopped_once_it_sent(first, admin, spec.name, signal.SIGINT, "the redrive")
    assert first.returncode == 130
    assert b"Traceback" not in stderr, stderr
    assert b"stopped by Ctrl-C after moving" in stderr, stderr
    assert b"run the same command again to resume" in stderr


def test_a_key_or_tenant_typed_with_bytes_not_utf8_matches_those_bytes() -> None:
    """`--key`/`--tenant` bytes that are not UTF-8 (argv carries them escaped) match, no crash."""
    typed = b"a\xffb".decode(errors="surrogateescape")  # how Python hands `$'a\xffb'` over
    selection = Selection.typed_as(key=typed, tenant=typed)
    same = Message("t.dlq", 0, 1, b"a\xffb", b"v", {h.TENANT: b"a\xffb"})
    other = Message("t.dlq", 0, 2, b"ab", b"v", {h.TENANT: b"a\xffb"})
    assert (selection.matches(same), selection.matches(other)) == (True, False)


async def test_a_killed_dry_run_leaves_no_group_on_the_redis_dlq(
    settings: Settings, redis: Redis, unique: str, tmp_path: Path
) -> None:
    """A `pipeline redrive --dry-run` killed (SIGKILL) midway on Redis leaves no group behind."""
    transport = create_transport(settings, "redis")
    try:
        spec, dlq, headers = await dead_letter_lane(transport, unique, 2)
        records = [Record(b"v%d" % i, b"k%d" % i, headers) for i in range(20_000)]
        await produce(transport, dlq, records)
    finally:
        await transport.close()
    (tmp_path / "lane.yaml").write_text(f"name: {spec.name}\npartitions: 2\n")
    name = f"dry-{unique}"
    env = {
        **os.environ,
        "PIPELINE_TOPICS_DIR": str(tmp_path),
        "PIPELINE_REDIS__URL": f"{settings.redis.url}?client_name={name}",
    }
    command = [sys.executable, "-m", "pipeline", "redrive", dlq, "-t", "redis", "--dry-run"]
    pipe = asyncio.subprocess.PIPE
    dry = await asyncio.create_subprocess_exec(*command, env=env, stdout=pipe, stderr=pipe)
    try:
        deadline = time.monotonic() + 60
        while not any(  # killed once it reads the DLQ, far from its end
            c.get("name") == name and c.get("cmd") in ("xread", "xreadgroup")
            for c in await redis.client_list()
        ):
            assert dry.returncode is None, await dry.communicate()
            assert time.monotonic() < deadline, "the dry run read nothing in 60 s"
            await asyncio.sleep(0.01)
    finally:
        dry.kill()
        await asyncio.wait_for(dry.communicate(), 60)
    streams = [f"{{{settings.redis.key_prefix}:{dlq}:{p}}}:s" for p in range(2)]
    left = [g["name"] for stream in streams for g in await redis.xinfo_groups(stream)]
    assert left == []
    assert await redis.keys(f"*pipeline-redrive.{dlq}.*") == []


async def test_a_target_typed_with_bytes_not_utf8_is_refused_as_no_such_topic(
    transport: Transport, unique: str
) -> None:
    """`--to` holding bytes that are not UTF-8 is the ConfigError of a missing topic, no crash."""
    routes = await _fill_dlq(transport, f"rd_{unique}")
    typed = b"a\xffb".decode(errors="surrogateescape")  # how Python hands `$'a\xffb'` over
    for dry_run in (True, False):
        job = Redrive(transport, routes.dead_letter_topic, Selection(), to=typed, dry_run=dry_run)
        assert await job.total() == 6
        with pytest.raises(ConfigError, match="--to"):
            await asyncio.wait_for(job.run(), 60)

"""Run an App's handlers through the real consumer runtime, in memory, on a virtual clock.

::

    async with TestApp(app) as t:
        await t.send("messages", MessageReceived(conversation_id="c1", text="hi"), key="c1",
                     tenant="acme")
        await t.drain()
        assert [r.outcome for r in t.runs("messages")] == ["handled"]

:class:`TestApp` wires what ``pipeline consume`` wires (:func:`pipeline.runtime.run.serve`) with
in-process stand-ins for the services: a :class:`~pipeline.runtime.member.Member` of the App
on a :class:`~pipeline.testing.MemoryTransport` whose topics are created from the App's
declarations, with parking, ``ctx.once``, the debouncer and throttles on
:func:`~pipeline.testing.redis.fake_redis` (the project's own Lua), and a
:class:`~pipeline.testing.clock.VirtualClock`, so retry tiers, debounce windows and deadlines
pass without waiting. Handlers are registered unchanged on a copy of the App that records each
call (:class:`~pipeline.testing.recorder.Run`).

Lanes that declare ``offload:`` offload here too: :meth:`TestApp.send` writes a payload above
the lane's threshold to its store and produces the reference, and the member resolves it as in
production. ``TestApp(app, payloads=tmp_path)`` puts every offloading lane's store in that
directory instead of the declared one (an ``s3://`` store then needs no S3 service).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from pydantic import BaseModel
from redis.asyncio import Redis

from pipeline import headers as h
from pipeline.admission.debounce import Debouncer
from pipeline.admission.throttle import Throttle
from pipeline.config import Settings, load_settings
from pipeline.envelope import Delivered, Message, TopicPartition
from pipeline.errors import ConfigError
from pipeline.offload.writer import Offloader, OffloadingProducer, topic_policies
from pipeline.runtime.app import App
from pipeline.runtime.member import Member
from pipeline.runtime.stats import Stats
from pipeline.testing.clock import VirtualClock
from pipeline.testing.memory import MemoryTransport
from pipeline.testing.recorder import Recorder, Run
from pipeline.testing.records import DeadLettered, messages_on
from pipeline.testing.redis import fake_redis
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Producer

State = Literal["new", "running", "stopped"]
"""Where a :class:`TestApp` is: before, inside or after its ``async with`` block."""
_STEP_S = 1.0
"""How often :meth:`TestApp.drain` looks whether everything settled (virtual seconds)."""
COMMIT_INTERVAL_MS = 5_000
"""The longest commit interval (virtual) of the default settings: an idle tick costs real time
in a test, and commits only decide what a crash would redeliver, which a TestApp never has. The
member's liveness (the ``ctx.once`` lease, the guard's leases) stays the environment's, as
``pipeline consume`` runs it, so the interval is at most half of it (:func:`default_settings`)."""


def _stored_in(spec: TopicSpec, payloads: Path | None) -> TopicSpec:
    """``spec`` with its offload store moved to a directory under ``payloads`` (if both exist)."""
    if payloads is None or spec.offload is None:
        return spec
    store = f"file://{payloads.resolve()}/{spec.lane}"
    return spec.model_copy(update={"offload": spec.offload.model_copy(update={"store": store})})


def default_settings() -> Settings:
    """The environment's settings, with fewer idle commits and no pressure governor.

    Commits every :data:`COMMIT_INTERVAL_MS` at most, and at most every half of
    ``runtime.liveness_ms`` (the runtime renews its liveness on each commit tick). The liveness
    itself is left as ``pipeline consume`` has it: it is the lease a second delivery of an
    event waits out in ``ctx.once`` before it retries (5 s by default), which a test sees.
    """
    liveness_ms = load_settings().runtime.liveness_ms
    return load_settings(
        runtime={
            "commit_interval_ms": min(COMMIT_INTERVAL_MS, liveness_ms // 2),
            "liveness_ms": liveness_ms,
            # The pressure governor reads the host's CPU and memory pressure: a test's
            # concurrency must not depend on how busy the machine running it is.
            "pressure": {"enabled": False},
        }
    )


def encode_value(event: Any) -> bytes:
    """A message value: a pydantic model or a dict as JSON, text as UTF-8, bytes unchanged."""
    if isinstance(event, BaseModel):
        return event.model_dump_json().encode()
    if isinstance(event, bytes):
        return event
    if isinstance(event, str):
        return event.encode()
    return json.dumps(event).encode()


class TestApp:
    """One member of an App on in-memory services; see the module docstring."""

    __test__ = False  # a harness, not a pytest test class

    def __init__(
        self,
        app: App,
        *,
        group: str = "test",
        lanes: Sequence[str] | None = None,
        settings: Settings | None = None,
        throttle_limits: Mapping[str, int] | None = None,
        clock: VirtualClock | None = None,
        payloads: Path | None = None,
    ) -> None:
        """Prepare the run; ``async with`` starts and stops it.

        Args:
            app: the App under test (left unchanged).
            group: the consumer group name.
            lanes: the lanes to run (default: every lane with a handler).
            settings: runtime, throttle and Redis-prefix settings (default:
                :func:`default_settings`, the environment's with fewer idle commits and no
                pressure governor).
            throttle_limits: limits of throttle keys, e.g. ``{"org:acme": 2}``; other keys have
                ``settings.throttle.default_limit``.
            clock: the virtual clock (default: one starting at the real time now).
            payloads: a directory standing in for the store of every lane that declares
                ``offload:`` (``file://<payloads>/<lane>``); default: the declared stores.
        """
        self.settings = settings or default_settings()
        self.clock = clock or VirtualClock()
        self.recorder = Recorder()
        self.transport = MemoryTransport(max_message_bytes=self.settings.max_message_bytes)
        self.redis: Redis = fake_redis()
        self.app = self._recording_copy(app, payloads)
        self._lane_names = list(lanes or sorted(self.app.lanes))
        self._check_lanes(throttle_limits or {})
        self._group = group
        self._throttle_limits = dict(throttle_limits or {})
        self._state: State = "new"
        self._throttle: Throttle | None = None
        self._member: Member | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._producer: Producer = self.transport.producer()
        policies = topic_policies([lane.spec for lane in self.app.lanes.values()])
        if policies:  # large payloads of offloading lanes go to their stores, as in production
            self._producer = OffloadingProducer(self._producer, Offloader(policies))

    def _check_lanes(self, throttle_limits: Mapping[str, int]) -> None:
        """Refuse, now and in one line, lanes the App has no handler for and unused limits."""
        known = ", ".join(sorted(self.app.lanes)) or "none"
        unknown = [name for name in self._lane_names if name not in self.app.lanes]
        if unknown:
            raise ConfigError(
                f"no handler registered for lane(s) {', '.join(unknown)} (the App's lanes: {known})"
            )
        self.app.topics(self._lane_names)  # an App with no handler: its own clear error
        chosen = [self.app.lanes[name] for name in self._lane_names]
        if throttle_limits and not any(lane.spec.throttle for lane in chosen):
            raise ConfigError(
                f"throttle_limits given, but no lane of this TestApp declares `throttle:` (lanes:"
                f" {', '.join(self._lane_names)}): declare it in the lane's file in topics/, or"
                " leave throttle_limits out"
            )

    def _recording_copy(self, app: App, payloads: Path | None) -> App:
        """A new App with the same declarations whose handlers record their calls."""
        specs = [_stored_in(lane.spec, payloads) for lane in app.lanes.values()]
        copy = App(specs, retryable=app.retryable)
        copy.avro = app.avro
        for name, lane in app.lanes.items():
            cpu = lane.cpu_ref is not None  # a process-pool handler runs unrecorded
            handler = lane.handler if cpu else self.recorder.wrap(name, lane.handler)
            copy.handler(name, cpu=cpu, time_limit_s=lane.time_limit_s)(handler)
        return copy

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Start the clock, create the topics, start the member and wait for its partitions."""
        if self._state != "new":
            raise ConfigError(
                "a TestApp runs once: make a new TestApp(app) for each `async with` (its topics,"
                " fake Redis and records belong to that run)"
            )
        self._state = "running"
        self.clock.start()
        try:
            await self._start()
        except BaseException:
            await self._close()
            raise
        return self

    async def _start(self) -> None:
        admin = self.transport.admin()
        for lane in self.app.lanes.values():
            for config in lane.spec.topic_configs(0):
                await admin.create_topic(config)
        chosen = [self.app.lanes[name] for name in self._lane_names]
        if any(lane.spec.throttle for lane in chosen):
            self._throttle = Throttle.from_settings(self.redis, self.settings)
            await self._throttle.start()
            for key, limit in self._throttle_limits.items():
                await self._throttle.set_limit(key, limit)
        self._member = Member(
            self.app,
            self.transport,
            self._group,
            self.settings.runtime,
            lane_names=self._lane_names,
            redis=self.redis,
            redis_prefix=self.settings.redis.key_prefix,
            throttle=self._throttle,
        )
        self._task = asyncio.create_task(self._member.run(self._stop))
        partitions = sum(
            len(admin_topic.message_counts)
            for admin_topic in (await admin.list_topics(self.app.topics(self._lane_names))).values()
        )
        await self._until(lambda: len(self.member.assignment) >= partitions, 60, "join its group")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the member gracefully, then the throttle, fake Redis and the clock."""
        await self._close()

    async def _close(self) -> None:
        self._state = "stopped"
        self._stop.set()
        try:
            if self._task is not None:
                await self._task
        finally:
            if self._throttle is not None:
                await self._throttle.close()
            await self.redis.aclose()
            await self.transport.close()
            self.clock.stop()

    @property
    def member(self) -> Member:
        """The running member."""
        if self._member is None:
            raise ConfigError("the TestApp is not running: use `async with TestApp(app) as t`")
        return self._member

    def _check_running(self) -> None:
        """Refuse to drive a TestApp outside its ``async with`` block, saying which side."""
        if self._state == "new":
            raise ConfigError("the TestApp is not running: use `async with TestApp(app) as t`")
        if self._state == "stopped":
            raise ConfigError(
                "the TestApp has stopped (its `async with` block ended): send, advance and"
                " drain inside the block; what ran (runs, dead_letters, stats) stays readable"
            )

    # -- driving --------------------------------------------------------------------------------

    async def send(
        self,
        lane: str,
        event: Any,
        *,
        key: str | bytes | None = None,
        tenant: str | None = None,
        event_id: str | None = None,
        headers: Mapping[str, bytes] | None = None,
    ) -> Delivered:
        """Produce ``event`` to ``lane``'s topic as the ingress would (key, tenant, event id).

        ``lane`` may also name a topic of the App (a retry tier, a dead-letter topic) or one
        the test created; anything else is a :class:`ConfigError` naming the lanes.
        """
        self._check_running()
        topic = self.app.lanes[lane].spec.name if lane in self.app.lanes else lane
        if topic not in self.transport.broker.topics:
            known = ", ".join(sorted(self.app.lanes)) or "none"
            raise ConfigError(f"no lane or topic {lane!r} in this TestApp (lanes: {known})")
        out = dict(headers or {})
        if tenant is not None:
            out[h.TENANT] = tenant.encode()
        if event_id is not None:
            out[h.EVENT_ID] = event_id.encode()
        raw_key = key.encode() if isinstance(key, str) else key
        return await self._producer.send(topic, encode_value(event), key=raw_key, headers=out)

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass, running everything that falls due."""
        self._check_running()
        await asyncio.sleep(seconds)
        self._raise_if_failed()

    async def drain(self, max_s: float = 3600.0) -> None:
        """Run until all work settled: handled, retried to the end, dead-lettered or turned.

        Settled means: every message of the member's topics (main and retry tiers) committed,
        no handler call running, and no debounced turn pending in Redis. Fails after ``max_s``
        virtual seconds.
        """
        self._check_running()
        await self._until_async(self._settled, max_s, "settle")

    async def _settled(self) -> bool:
        if self.recorder.running():
            return False
        group = self.transport.broker.groups[self._group]
        for name in self.app.topics(self._lane_names):
            for p, log in enumerate(self.transport.broker.topic(name).partitions):
                position = group.committed.get(TopicPartition(name, p))
                if len(log) > (position.offset if position is not None else 0):
                    return False
        for name in self._lane_names:
            spec = self.app.lanes[name].spec
            if spec.debounce is None:
                continue
            debouncer = Debouncer(self.redis, self.settings.redis.key_prefix, name, spec.debounce)
            if await debouncer.next_due_ms() is not None:
                return False
        return True

    async def _until(self, done: Callable[[], bool], max_s: float, what: str) -> None:
        async def check() -> bool:
            return done()

        await self._until_async(check, max_s, what)

    async def _until_async(self, done: Callable[[], Any], max_s: float, what: str) -> None:
        deadline = time.monotonic() + max_s
        while not await done():
            self._raise_if_failed()
            if time.monotonic() > deadline:
                raise AssertionError(f"the member did not {what} within {max_s} virtual seconds")
            await asyncio.sleep(_STEP_S)

    def _raise_if_failed(self) -> None:
        if self._task is not None and self._task.done():
            error = self._task.exception()
            if error is not None:
                raise error
            raise AssertionError("the member stopped on its own")

    # -- what happened --------------------------------------------------------------------------

    def runs(self, lane: str, where: Callable[[Run], bool] | None = None) -> list[Run]:
        """Every handler call of ``lane`` so far, in start order (those ``where`` accepts)."""
        self._spec(lane)  # a misspelt lane is an error, not an empty list
        return self.recorder.of(lane, where)

    def handled(self, lane: str) -> list[Any]:
        """The events (of a debounced lane: the turns) whose handler call returned."""
        return [r.event for r in self.runs(lane) if r.outcome == "handled"]

    def messages(self, topic: str) -> list[Message]:
        """Every message on ``topic`` (any topic: a lane's, or one a handler produced to)."""
        return messages_on(self.transport.broker, topic)

    def retried(self, lane: str) -> list[Message]:
        """Messages sent to ``lane``'s retry tiers, in order (headers say attempt and due time)."""
        return messages_on(self.transport.broker, *self._spec(lane).retry_topic_names())

    def dead_letters(self, lane: str) -> list[DeadLettered]:
        """Messages on ``lane``'s dead-letter topic, with reason, error and origin."""
        return [DeadLettered.of(m) for m in self.messages(self._spec(lane).dead_letter)]

    def _spec(self, lane: str) -> TopicSpec:
        """The declaration of ``lane``, which must have a handler in the App and be run."""
        if lane not in self.app.lanes:
            known = ", ".join(sorted(self.app.lanes)) or "none"
            raise ConfigError(f"no lane {lane!r} in this TestApp (lanes: {known})")
        if lane not in self._lane_names:
            raise ConfigError(
                f"lane {lane!r} is not run by this TestApp (lanes={self._lane_names!r}): nothing"
                " of it runs, retries or is dead-lettered; add it to lanes= to test it"
            )
        return self.app.lanes[lane].spec

    def peak_concurrency(self, lane: str, *, tenant: str | None = None) -> int:
        """The most handler calls of ``lane`` (of ``tenant``, if given) that overlapped."""
        self._spec(lane)
        if tenant is None:
            return self.recorder.peak_concurrency(lane)
        return self.recorder.peak_concurrency(lane, lambda r: r.tenant == tenant)

    @property
    def stats(self) -> Stats:
        """The member's counters (handled, retried, dead-lettered, turns, ...)."""
        return self.member.stats

"""Helpers for runtime tests: declare lanes on the real broker and run members in the loop."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.helpers import consume_until as polled_until
from pydantic import BaseModel
from redis.asyncio import Redis
from support import IDLE_APP, delete_after_test, delete_group_after

from pipeline.admission.throttle import Throttle
from pipeline.config import RuntimeSettings
from pipeline.envelope import Message, Record, TopicPartition
from pipeline.observability.facades import RuntimeMetrics
from pipeline.retry.policy import default_retryable
from pipeline.retry.router import RetryRouter
from pipeline.runtime import App, Context
from pipeline.runtime.app import Lane
from pipeline.runtime.chain import Chain
from pipeline.runtime.guard import RunGuard
from pipeline.runtime.handling import HandlerStage
from pipeline.runtime.isolation import Isolation
from pipeline.runtime.member import Member
from pipeline.runtime.redirect import Redirector
from pipeline.runtime.stats import Stats
from pipeline.runtime.throttle_gate import ThrottleGate
from pipeline.runtime.work import Work
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Admin, PartitionLag, Transport

FAST = RuntimeSettings(commit_interval_ms=100, shutdown_grace_s=5.0)
QUIET = {"key": "conversation_id", "quiet_s": 3, "max_wait_s": 20, "max_batch": 50}
"""A debounce of conversations quiet long enough that a burst read together is one turn on a
loaded host: at 0.3 s, a stall of the member between two of its records let the first ones' turn
fall due alone."""


class Said(BaseModel):
    """One message of a conversation."""

    conversation_id: str
    n: int


def said(conversation: str, n: int) -> Record:
    """A message of ``conversation`` numbered ``n``, keyed by its conversation."""
    body = Said(conversation_id=conversation, n=n).model_dump_json().encode()
    return Record(body, conversation.encode())


def lane_spec(name: str, partitions: int = 3, **fields: Any) -> TopicSpec:
    """A lane declaration as a topics/*.yaml file would give it."""
    return TopicSpec.model_validate({"name": name, "partitions": partitions, **fields})


def vision_lane(name: str, max_attempts: int) -> TopicSpec:
    """A one-partition lane throttled on ``org:{tenant}`` and on an adaptive ``dep:vision`` key.

    The adaptive key's limit moves between 1 and 8 (cooldown 1 h); a message is retried every
    200 ms, ``max_attempts`` attempts at most.
    """
    return lane_spec(
        name,
        1,
        ordered=False,
        retry={"tiers": ["200ms"], "max_attempts": max_attempts},
        throttle={
            "keys": ["org:{tenant}", "dep:vision"],
            "adaptive": {"dep:vision": {"min": 1, "max": 8, "cooldown": "1h"}},
        },
    )


def idle_lane(name: str, partitions: int = 1, **fields: Any) -> Lane:
    """A lane of an App of its own, declared with ``fields``, whose handler is never called."""
    app = App([lane_spec(name, partitions, **fields)])

    @app.handler(name)
    async def handle(event: bytes, ctx: Context) -> None:
        """Never called."""

    return app.lanes[name]


def held_app(spec: TopicSpec) -> tuple[App, asyncio.Event, asyncio.Event]:
    """An App whose handler of ``spec``'s lane holds each run: the app, ``started``, ``release``.

    Each run sets ``started``, then waits until ``release`` is set.
    """
    app = App([spec])
    started, release = asyncio.Event(), asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        started.set()
        await release.wait()

    return app, started, release


def first_run_held(spec: TopicSpec) -> tuple[App, list[int], asyncio.Event]:
    """An App whose handler of ``spec``'s lane holds its first run: the app, ``ran``, ``release``.

    Each run appends its message's offset to ``ran``; the first then waits until ``release`` is
    set, the others end at once.
    """
    app = App([spec])
    release = asyncio.Event()
    ran: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        ran.append(ctx.message.offset)
        if len(ran) == 1:
            await release.wait()

    return app, ran, release


def flaky_head(spec: TopicSpec, failures: int) -> tuple[App, dict[bytes, list[bytes]], list[int]]:
    """An App whose handler of ``spec``'s lane fails the first ``failures`` attempts of ``a1``.

    Returns the app, the events each key completed (in the order they did) and the attempts
    ``a1`` ran; each failing one raises ``RuntimeError("flaky dependency")``.
    """
    app = App([spec])
    completed: dict[bytes, list[bytes]] = defaultdict(list)
    attempts: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"a1":
            attempts.append(ctx.attempt)
            if ctx.attempt <= failures:
                raise RuntimeError("flaky dependency")
        completed[ctx.message.key or b""].append(event)

    return app, completed, attempts


async def declare(transport: Transport, *specs: TopicSpec) -> None:
    """Create the lanes' topics (main, retry tiers, dead letter); deleted when the test ends."""
    delete_after_test(transport, [name for spec in specs for name in spec.topic_names()])
    await apply(transport.admin(), list(specs), 100_000, dry_run=False)


async def produce(transport: Transport, topic: str, records: Sequence[Record]) -> None:
    """Send ``records`` to ``topic`` with a producer of their own, closed once they are sent."""
    producer = transport.producer()
    try:
        await producer.send_many(topic, list(records))
    finally:
        await producer.close()


@asynccontextmanager
async def running(member: Member) -> AsyncIterator[Member]:
    """Run ``member`` in the background; stop it gracefully on exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(member.run(stop))
    try:
        yield member
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def ran_until(
    app: App,
    transport: Transport,
    redis: Redis,
    unique: str,
    done: Callable[[Member], bool],
    timeout_s: float = 60.0,
) -> Member:
    """A member of ``app`` run until ``done(member)`` holds, within ``timeout_s``; then stopped.

    Group ``g-UNIQUE``, Redis prefix ``UNIQUE``, settings :data:`FAST`; its stats are kept. Its
    group is left on the broker: the caller deletes it (``member.group``) once done reading.
    """
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=unique)
    async with running(member):
        await eventually(lambda: done(member), timeout_s)
    return member


async def the_dead_letter(transport: Transport, spec: TopicSpec, unique: str) -> Message:
    """The one message on ``spec``'s dead-letter topic, read (and committed) by ``dlq-UNIQUE``.

    Fails if the first poll that finds any finds more than one.
    """
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    try:
        (dead,) = await polled_until(dlq, lambda r: len(r) >= 1)
    finally:
        await dlq.close()
    return dead


async def handled_by_a_member(
    transport: Transport,
    redis: Redis,
    unique: str,
    spec: TopicSpec,
    sends: Mapping[str, Sequence[Record]],
    count: int,
    *,
    metrics: RuntimeMetrics | None = None,
    timeout_s: float = 60.0,
) -> list[bytes]:
    """The events a member of ``spec``'s lane handled, in order, of ``sends`` (records by topic).

    ``spec`` is declared and each topic's records sent; a member of group ``g-UNIQUE`` (Redis
    prefix ``tUNIQUE``, ``metrics`` if given) runs until ``count`` messages were handled or
    skipped as duplicates, within ``timeout_s``.
    """
    await declare(transport, spec)
    app = App([spec])
    handled: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        handled.append(event)

    for topic, records in sends.items():
        await produce(transport, topic, records)
    member = Member(
        app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}", metrics=metrics
    )
    async with running(member):
        await eventually(lambda: len(handled) + member.stats.duplicates >= count, timeout_s)
    return handled


def partition_0(lane: Lane) -> TopicPartition:
    """Partition 0 of ``lane``'s main topic."""
    return TopicPartition(lane.spec.name, 0)


async def join(guard: RunGuard, lane: Lane, messages: list[Message]) -> None:
    """Partition 0 is assigned to ``guard``'s member (nothing committed) and ``messages`` polled."""
    await guard.assigned([partition_0(lane)], {})
    await guard.extend(messages)


class CountingAdmin:
    """The real admin client, its lag reads counted (the broker is asked only when needed)."""

    def __init__(self, admin: Admin) -> None:
        """Count the calls made through ``admin``."""
        self._admin = admin
        self.calls = 0

    async def group_lag(self, group: str, topic: str) -> list[PartitionLag]:
        """The real reading, counted."""
        self.calls += 1
        return await self._admin.group_lag(group, topic)


@dataclass
class ThrottledChain:
    """A started chain admitting through a throttle (:func:`throttled_chain`) and its parts."""

    chain: Chain
    gate: ThrottleGate[Work]
    handler: HandlerStage
    settled: list[tuple[int, str | None]]
    """Each run's offset and outcome, in the order they settled."""


@asynccontextmanager
async def throttled_chain(
    app: App, throttle: Throttle, producer: object, max_concurrency: int
) -> AsyncIterator[ThrottledChain]:
    """The chain of ``app``'s lanes admitting through ``throttle``, its key lanes started.

    One CPU worker, ``max_concurrency`` runs at once; its router sends through ``producer``
    (the test's stand-in for the broker), its guard keeps no claims and stops nothing. Its key
    lanes and gate are closed when the block ends.
    """
    lanes = list(app.lanes.values())
    stats = Stats()
    routing = Redirector(RetryRouter(producer), stats, default_retryable, lanes)  # type: ignore[arg-type]
    handler = HandlerStage(app, routing, stats, lanes, cpu_workers=1, throttled=True)
    settled: list[tuple[int, str | None]] = []

    def settle(work: Work, outcome: str | None, _: float) -> None:
        settled.append((work.offset, outcome))

    guard = RunGuard({}, routing, stats, Isolation(5.0), handler, lambda *_: None)
    chain = Chain(
        app,
        max_concurrency=max_concurrency,
        guard=guard,
        handler=handler,
        settle=settle,
        throttle=throttle,
    )
    gate = chain.gate
    assert gate is not None
    chain.lanes.start()
    try:
        yield ThrottledChain(chain, gate, handler, settled)
    finally:
        await chain.lanes.close(5)
        await gate.close()


async def consume_process(
    transport: Transport,
    spec: TopicSpec,
    app: str,
    group: str,
    record: Record,
    env: dict[str, str],
    stderr: int,
) -> asyncio.subprocess.Process:
    """`pipeline consume <app>` (a ``module:attribute`` below tests/) started in a process.

    ``spec`` is declared and ``record`` sent to it first; the group is deleted when the test
    ends. ``env`` is the process's whole environment; ``stderr`` is where its log goes.
    """
    await declare(transport, spec)
    delete_group_after(transport, group, spec.topic_names())
    await produce(transport, spec.name, [record])
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "pipeline", "consume", app, "--group", group),
        *("-t", transport.name),
        cwd=str(Path(__file__).parents[1]),
        env=env,
        stderr=stderr,
    )


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting to be reaped does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


async def eventually(predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait until ``predicate()`` holds (re-checked every 20 ms); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met after {timeout_s}s")
        await asyncio.sleep(0.02)


class RecordedFailures:
    """Stands in for the member's router: records the failures a stopped run would route."""

    def __init__(self) -> None:
        """None yet."""
        self.failures: list[BaseException] = []

    async def failure(self, *args: object) -> str:
        """Record the error (the last argument); the run counts as retried."""
        error = args[-1]
        assert isinstance(error, BaseException)
        self.failures.append(error)
        return "retried"


def write_idle_app(directory: Path, lane: str) -> None:
    """``directory/topics/LANE.yaml`` (one partition, ordered, a 1 s retry tier) and its app.

    The app is ``directory/LANE.py`` (``LANE:app`` run from ``directory``), its handler idle.
    """
    (directory / "topics").mkdir()
    (directory / "topics" / f"{lane}.yaml").write_text(
        f"name: {lane}\npartitions: 1\nordered: true\nretry:\n  tiers: [1s]\n"
    )
    (directory / f"{lane}.py").write_text(IDLE_APP.format(lane=lane))


async def consume_until_logged(tmp_path: Path, lane: str, redis_url: str, marker: str) -> list[str]:
    """The log lines of `pipeline consume` on the Redis transport, stopped once one has ``marker``.

    The app (``tmp_path/LANE.py``) has one ordered lane with a retry tier and an idle handler;
    the member is sent SIGTERM once a line holds ``marker``, and the lines it logs until it
    ended are returned too. A member that ends without that line fails the test.
    """
    write_idle_app(tmp_path, lane)
    env = {
        **os.environ,
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_url,
        "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
        "PIPELINE_MEMBERSHIP__SLOT_DIR": str(tmp_path / "slots"),
    }
    lines, _ = await consume_until(tmp_path, f"{lane}:app", "g", env, marker)
    return lines


async def consume(
    cwd: Path, app: str, group: str, env: Mapping[str, str]
) -> asyncio.subprocess.Process:
    """`pipeline consume APP -g GROUP` started in ``cwd`` with ``env``; its log on a pipe.

    The caller kills it if it is still running at the end (:func:`consuming` does).
    """
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "pipeline", "consume", app, "-g", group),
        cwd=str(cwd),
        env=dict(env),
        stderr=asyncio.subprocess.PIPE,
    )


@asynccontextmanager
async def consuming(
    cwd: Path, app: str, group: str, env: Mapping[str, str]
) -> AsyncIterator[asyncio.subprocess.Process]:
    """:func:`consume` for a block: killed (and reaped) at its end if still running then."""
    proc = await consume(cwd, app, group, env)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def next_line(stream: asyncio.StreamReader, lines: list[str], needle: str) -> str:
    """Read ``stream`` into ``lines`` until a line holds ``needle``; that line.

    A stream that ends without that line fails the test, showing what it held.
    """
    while True:
        raw = await asyncio.wait_for(stream.readline(), 60)
        assert raw, "".join(lines)  # the member ended without that line
        lines.append(raw.decode())
        if needle in lines[-1]:
            return lines[-1]


async def logged_until(proc: asyncio.subprocess.Process, lines: list[str], needle: str) -> str:
    """:func:`next_line` of ``proc``'s log (its stderr, on a pipe)."""
    assert proc.stderr is not None
    return await next_line(proc.stderr, lines, needle)


async def consume_until(
    cwd: Path, app: str, group: str, env: Mapping[str, str], marker: str
) -> tuple[list[str], int | None]:
    """`pipeline consume APP -g GROUP` in ``cwd``, stopped (SIGTERM) once a line has ``marker``.

    Returns the lines it logged until it ended, and its exit code. A member that ends without
    that line fails the test.
    """
    lines: list[str] = []
    async with consuming(cwd, app, group, env) as proc:
        await logged_until(proc, lines, marker)
        proc.send_signal(signal.SIGTERM)
        _, rest = await asyncio.wait_for(proc.communicate(), 60)
        lines += rest.decode().splitlines(keepends=True)
    return lines, proc.returncode


def private_member_env(
    tmp_path: Path, kafka: str, redis_url: str, prefix: str, metrics_port: int | None = None
) -> dict[str, str]:
    """The environment of a Kafka member using the Redis at ``redis_url`` under ``prefix``.

    Topics and the app are in ``tmp_path`` (:func:`write_idle_app`); with ``metrics_port``, its
    ``/metrics`` is served on 127.0.0.1 there.
    """
    env = {
        **os.environ,
        "PIPELINE_TRANSPORT": "kafka",
        "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": kafka,
        "PIPELINE_REDIS__URL": redis_url,
        "PIPELINE_REDIS__KEY_PREFIX": prefix,
        "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
        "PIPELINE_MEMBERSHIP__SLOT_DIR": str(tmp_path / "slots"),
    }
    if metrics_port is not None:
        env["PIPELINE_RUNTIME__METRICS_HOST"] = "127.0.0.1"
        env["PIPELINE_RUNTIME__METRICS_PORT"] = str(metrics_port)
    return env


def the_line(lines: Sequence[str], text: str) -> str:
    """The one line of ``lines`` holding ``text``; fails, showing them all, unless exactly one."""
    holding = [line for line in lines if text in line]
    assert len(holding) == 1, "".join(lines)
    return holding[0]

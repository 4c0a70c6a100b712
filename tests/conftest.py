"""Shared fixtures: real services found by URL, skipped locally when absent, required in CI."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.exceptions import RedisError
from skewed_hosts import skewed_clocks
from support import (
    IN_CI,
    delete_declared,
    delete_stubborn_groups,
    has_declared,
    reachable,
    recording_groups,
    require_service,
    test_settings,
)

from pipeline.config import Settings
from pipeline.log_repeats import RepeatFilter
from pipeline.transport import create_transport
from pipeline.transport.kafka.transport import KafkaTransport
from pipeline.transport.protocol import Transport
from pipeline.transport.redis_streams.transport import RedisStreamsTransport


@pytest.fixture(scope="session")
def settings() -> Settings:
    """Test settings (see :func:`test_settings`)."""
    return test_settings()


@pytest.fixture
def redis_service(settings: Settings) -> str:
    """The Redis URL, once Redis answers."""
    url = urlparse(settings.redis.url)
    require_service("redis", url.hostname or "127.0.0.1", url.port or 6379)
    return settings.redis.url


@pytest.fixture
async def streams(settings: Settings, redis_service: str) -> AsyncIterator[Transport]:
    """The real Redis Streams transport, closed after the test."""
    del redis_service  # Redis answers (or the test is skipped; under CI=true, failed)
    transport = create_transport(settings, "redis")
    yield transport
    await transport.close()


@pytest.fixture
def caplog_repeats(caplog: pytest.LogCaptureFixture) -> Iterator[RepeatFilter]:
    """A :class:`RepeatFilter` on pytest's capture handler, removed after the test.

    ``configure_logging`` puts one on every handler. The capture handler is the session's: a
    filter left on it held back a later test's lines.
    """
    repeats = RepeatFilter()
    caplog.handler.addFilter(repeats)
    yield repeats
    caplog.handler.removeFilter(repeats)


@pytest.fixture
def skewable() -> Iterator[None]:
    """``time.time`` runs as far off as the host of the code that reads it (``skewed_hosts``)."""
    with skewed_clocks():
        yield


@pytest.fixture
def kafka_service(settings: Settings) -> str:
    """The Kafka bootstrap servers, once the broker answers."""
    host, _, port = settings.kafka.bootstrap_servers.split(",")[0].rpartition(":")
    require_service("kafka", host, int(port))
    return settings.kafka.bootstrap_servers


@pytest.fixture
def postgres_service(settings: Settings) -> str:
    """The PostgreSQL URL, once the server answers."""
    url = urlparse(settings.postgres.url)
    require_service("postgres", url.hostname or "127.0.0.1", url.port or 5432)
    return settings.postgres.url


@pytest.fixture
async def kafka(settings: Settings, kafka_service: str) -> AsyncIterator[Transport]:
    """The real Kafka transport, closed after the test."""
    del kafka_service  # started (or the test skipped) by its fixture
    made = create_transport(settings, "kafka")
    yield made
    await made.close()


@pytest.fixture(params=["kafka", "redis"])
async def transport(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[Transport]:
    """Each real transport in turn, for contract tests."""
    request.getfixturevalue(f"{request.param}_service")
    t = create_transport(settings, request.param)
    yield t
    await t.close()


@pytest.fixture
def unique() -> Iterator[str]:
    """A short unique suffix for topic, group and key names.

    After the test, pass or fail, the keys of the shared Redis whose names hold it are deleted.
    """
    value = uuid.uuid4().hex[:10]
    _MINTED.add(value)
    yield value
    _delete_keys_holding(value)


_MINTED: set[str] = set()
"""Every value :func:`unique` gave in this process: the tests' own prefixes hold one."""


def _delete_keys_holding(value: str) -> None:
    """Delete the shared Redis's keys whose names hold ``value`` (if that Redis answers)."""
    url = test_settings().redis.url
    parsed = urlparse(url)
    if not reachable(parsed.hostname or "127.0.0.1", parsed.port or 6379):
        return
    with SyncRedis.from_url(url) as client, contextlib.suppress(RedisError):
        keys = list(client.scan_iter(match=f"*{value}*", count=1000))
        for start in range(0, len(keys), 500):
            client.unlink(*keys[start : start + 500])


@pytest.fixture
async def redis(redis_service: str) -> AsyncIterator[Redis]:
    """An asyncio client of the test Redis (tests isolate their keys with ``unique``)."""
    client = Redis.from_url(redis_service)
    yield client
    await client.aclose()


@pytest.fixture(scope="session", autouse=True)
def _record_groups() -> Iterator[None]:
    """Have every consumer group a real transport joins in this process deleted after its test."""
    with pytest.MonkeyPatch.context() as patch:
        for cls in (KafkaTransport, RedisStreamsTransport):
            patch.setattr(cls, "consumer", recording_groups(cls.consumer))
        yield


@pytest.fixture(autouse=True)
def _delete_declared_topics() -> Iterator[None]:
    """Delete the groups and topics the test made or registered (``support``), pass or fail."""
    yield
    if has_declared():
        asyncio.run(delete_declared())


# --- Scheduling: under ``-n --dist loadfile`` the longest files start first ---

SLOW_FILES = (
    "tests/faults/test_faults.py",
    "tests/faults/test_crashloop.py",
    "tests/demo/test_demo.py",
    "tests/topics/test_asyncapi.py",
    "tests/topics/test_lane_drained.py",
)
"""The files of 40 s or more (``--durations``): handed out late, one alone held the run's end."""


def pytest_configure(config: pytest.Config) -> None:
    """Have xdist hand out files in collection order (``pytest_collection_modifyitems`` below).

    Its own order ("loadscope reorder", on by default) sorts files by their number of tests, so
    a file of two 2-minute tests started after hundreds of quick ones and ended the run alone.
    """
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the files: :data:`SLOW_FILES` first, then by number of tests, most first.

    The second key is xdist's own order, which the hook above turns off; the sort is stable,
    so each file keeps the order of its own tests.
    """
    counts = Counter(_file_of(item) for item in items)

    def rank(item: pytest.Item) -> tuple[int, int]:
        path = _file_of(item)
        slow = SLOW_FILES.index(path) if path in SLOW_FILES else len(SLOW_FILES)
        return slow, -counts[path]

    items.sort(key=rank)


def _file_of(item: pytest.Item) -> str:
    """The test file of ``item``, as xdist's loadfile scheduler names its unit of work."""
    return item.nodeid.split("::", 1)[0]


# --- Leftovers: the suite deletes what it creates (asserted once, at the end of the run) ---

_LEFT_AT_START = pytest.StashKey[dict[str, frozenset[str]]]()
_STATE_MARKER = re.compile(r"\{(?P<prefix>[^}]*):state\}:marker")
"""A key prefix's Redis state marker (pipeline/runtime/state_loss.py): it lives as long as its
Redis by design, so the run deletes those of its tests' prefixes (:func:`_delete_state_markers`)."""
_REDIS_GROUP_KEY = re.compile(r"\{(?P<prefix>.*):g:(?P<group>.*)\}:(?:pos|members|owners)")


def _left_now() -> dict[str, frozenset[str]]:
    """The topics and consumer groups on the shared Kafka and Redis, per service that answered.

    Kafka's are ``kafka:NAME`` and ``kafka group:NAME``. Redis Streams topics are fields of a
    ``<prefix>:topics`` hash, one per key prefix, so every such hash is read: ``redis:HASH/NAME``;
    a Redis group is the ``{<prefix>:g:<group>}:*`` keys holding its positions and members:
    ``redis group:PREFIX/GROUP``; every key of that Redis is ``redis key:NAME`` (a test's keys
    are deleted after it by ``unique``). A service that does not answer is left out.
    """
    settings = test_settings()
    found: dict[str, frozenset[str]] = {}
    host, _, port = settings.kafka.bootstrap_servers.split(",")[0].rpartition(":")
    if reachable(host, int(port)):
        admin = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})
        with contextlib.suppress(KafkaException):  # a broker that stops answering counts as absent
            topics = admin.list_topics(timeout=10).topics
            found["kafka"] = frozenset(f"kafka:{t}" for t in topics if not t.startswith("__"))
            groups = admin.list_consumer_groups(request_timeout=10).result().valid
            found["kafka groups"] = frozenset(f"kafka group:{g.group_id}" for g in groups)
    url = urlparse(settings.redis.url)
    if reachable(url.hostname or "127.0.0.1", url.port or 6379):
        with SyncRedis.from_url(settings.redis.url) as client, contextlib.suppress(RedisError):
            names: set[str] = set()
            for key in client.scan_iter(match="*:topics", _type="hash", count=1000):
                hash_name = key.decode(errors="replace")  # other tests' names may be any bytes
                names.update(
                    f"redis:{hash_name}/{f.decode(errors='replace')}" for f in client.hkeys(key)
                )
            for key in client.scan_iter(match="{*:g:*}:*", count=1000):
                if match := _REDIS_GROUP_KEY.fullmatch(key.decode(errors="replace")):
                    names.add(f"redis group:{match['prefix']}/{match['group']}")
            found["redis"] = frozenset(names)
            found["redis keys"] = frozenset(
                f"redis key:{key.decode(errors='replace')}" for key in client.scan_iter(count=1000)
            )
    return found


def _is_worker(config: pytest.Config) -> bool:
    """Whether this process is a pytest-xdist worker (``make test`` runs the suite with ``-n``).

    Under ``-n`` the controlling process runs no test: it starts before the workers and ends
    after them, so the leftover check below is its to make, once, over the whole run.
    """
    return hasattr(config, "workerinput")


_STUBBORN_IN_WORKERS: list[str] = []
_MINTED_IN_WORKERS: list[str] = []
"""The values :func:`unique` gave in the workers (their tests' prefixes hold them)."""


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Note the topics and groups that exist before any test runs: they are not this run's."""
    if not _is_worker(session.config):
        session.config.stash[_LEFT_AT_START] = _left_now()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """A worker ended: keep the groups it could not delete, for the report below."""
    output = getattr(node, "workeroutput", {})
    _STUBBORN_IN_WORKERS.extend(output.get("stubborn_groups", []))
    _MINTED_IN_WORKERS.extend(output.get("minted", []))


def _delete_state_markers(minted: Iterable[str], before: dict[str, frozenset[str]]) -> None:
    """Delete the Redis state markers of the key prefixes this run's tests used, and no other.

    A marker (``{PREFIX:state}:marker``, pipeline/runtime/state_loss.py) lives as long as its
    Redis by design, so a test's member leaves one behind. A test's prefix holds a value
    :func:`unique` gave (``t<unique>``, ``fx-<unique>``, ``lost_<unique>``, ...), or is the
    test settings' default (:data:`~pipeline.config.RedisSettings.key_prefix`, for members run
    without a prefix of their own), whose marker is deleted only when it was not there at the
    run's start. A marker of any other prefix is someone else's: a member still running under
    it (``make demo``, another checkout's run) would take its loss for Redis losing its data
    and say, CRITICAL, that its held followers and buffers are gone.
    """
    values = frozenset(minted)
    default = test_settings().redis.key_prefix
    with SyncRedis.from_url(test_settings().redis.url) as client, contextlib.suppress(RedisError):
        for key in client.scan_iter(match="*:state}:marker", count=1000):
            name = key.decode(errors="replace")
            if (found := _STATE_MARKER.fullmatch(name)) is None:
                continue
            prefix = found["prefix"]
            if any(value in prefix for value in values) or (
                prefix == default and f"redis key:{name}" not in before.get("redis keys", ())
            ):
                client.delete(key)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run (under CI=true; report it locally) if it left topics, groups or keys behind.

    Groups whose static members still held their slots when their test ended are deleted
    first, once their sessions have expired (by the process whose tests joined them). Locally
    the brokers are shared with other people's runs, whose topics and groups may exist for a
    moment when this one ends, so a local run reports what it finds and CI, alone on its
    brokers, fails.
    """
    busy = asyncio.run(delete_stubborn_groups())
    if _is_worker(session.config):
        session.config.workeroutput["stubborn_groups"] = busy
        session.config.workeroutput["minted"] = sorted(_MINTED)
        return
    busy += _STUBBORN_IN_WORKERS
    before = session.config.stash.get(_LEFT_AT_START, {})
    if not before or session.config.option.collectonly:
        return
    _delete_state_markers([*_MINTED, *_MINTED_IN_WORKERS], before)
    after = _left_now()
    left = frozenset().union(*(after[s] - before[s] for s in before.keys() & after.keys()))
    if not left:
        return
    keys = sorted(n for n in left if " key:" in n)
    groups = sorted(n for n in left if " group:" in n)
    topics = sorted(left.difference(keys, groups))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for kind, names in (("topics", topics), ("consumer groups", groups), ("Redis keys", keys)):
        if not names or reporter is None:
            continue
        shown = ", ".join(names[:40]) + (" ..." if len(names) > 40 else "")
        reporter.ensure_newline()
        reporter.write_sep("=", f"leftover {kind}", red=True)
        reporter.write_line(f"the run left {len(names)} {kind} on the shared services: {shown}")
        if kind == "consumer groups" and busy:
            reporter.write_line(f"still with members after waiting: {', '.join(busy)}")
    if IN_CI or os.environ.get("PIPELINE_TEST_LEFTOVERS") == "fail":
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- The fault suite's figures, printed once at the end (from every worker's reports) ---

_FAULT_SCENARIOS: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the figures a fault scenario attached to its report (``tests/faults/conftest.py``)."""
    _FAULT_SCENARIOS.extend(v for k, v in report.user_properties if k == "fault_scenario")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print each fault scenario's figures (recovery time, dead letters, peaks) after the run."""
    if not _FAULT_SCENARIOS:
        return
    terminalreporter.section("fault scenarios")
    for result in _FAULT_SCENARIOS:
        terminalreporter.write_line(
            f"{result['scenario']:<28} {result['transport']:<6} "
            f"accepted {result['accepted']:>4}  applied {result['applied']:>4}  "
            f"dead {result['dead']}  repeated runs {result['repeated_runs']}  "
            f"recovery {result['recovery_s']} s  "
            f"restarts {result['member_restarts']}  crashes {result['crashes']}  "
            f"rss {result['max_rss_mb']} MB  keys {result['max_redis_keys']}  "
            f"wall {result['wall_s']} s"
        )

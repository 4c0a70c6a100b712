"""Helpers for tests, importable by name from any test module (``from support import ...``).

Test modules must not import ``conftest``: several directories have one, and which of them the
name ``conftest`` means depends on collection order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlparse

import pytest
import yaml

from pipeline.admission.throttle import Permit, Throttle
from pipeline.config import Settings, load_settings
from pipeline.observability import stacks
from pipeline.observability.server import MetricsServer, serve_metrics

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from pipeline.envelope import Message
    from pipeline.transport.protocol import Admin, Transport

IN_CI = os.environ.get("CI", "").lower() == "true"
ROOT = Path(__file__).parents[1]


BROKER_DOWN = [
    (
        "kafka",
        {"PIPELINE_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1"},
        ["127.0.0.1:1", "PIPELINE_KAFKA__BOOTSTRAP_SERVERS"],
    ),
    (
        "redis",
        {"PIPELINE_REDIS__URL": "redis://127.0.0.1:1/0"},
        ["redis://127.0.0.1:1/0", "PIPELINE_REDIS__URL"],
    ),
]
"""A transport, the environment that points it at a closed port, what the error must name."""

# The source of an app of one lane whose handler does nothing, for `pipeline consume` runs that
# stop before a member handles anything; IDLE_APP.format(lane=...) is the module's text.
IDLE_APP = '''
from pipeline.runtime import App, Context

app = App()


@app.handler("{lane}")
async def handle(event: bytes, ctx: Context) -> None:
    """Nothing: the member never gets to run it."""
'''


def run_pipeline(
    *args: str,
    env: dict[str, str],
    cwd: str | os.PathLike[str] | None = None,
    timeout_s: float = 90,
) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline ARGS`` as a user would, with exactly ``env``, in ``cwd``; never raises.

    ``timeout_s`` bounds the run (as ``subprocess.run``'s timeout).
    """
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd=cwd,
        check=False,
    )


def kafka_topics_list(bootstrap: str) -> subprocess.CompletedProcess[str]:
    """``pipeline topics list -t kafka`` with ``PIPELINE_KAFKA__BOOTSTRAP_SERVERS=bootstrap``.

    This process's environment otherwise; within 120 s (a bound, not a wait).
    """
    env = {**os.environ, "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": bootstrap}
    return run_pipeline("topics", "list", "-t", "kafka", env=env, timeout_s=120)


def cli_environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment without its PIPELINE_ variables, plus ``extra``.

    The topics are the project's, the ingress's sources file (none) and log in ``tmp_path``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    sources = tmp_path / "sources.yaml"
    sources.write_text("sources: {}\n", encoding="utf-8")
    return env | {
        "PIPELINE_TOPICS_DIR": str(ROOT / "topics"),
        "PIPELINE_INGRESS__SOURCES_FILE": str(sources),
        "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "ingress.db"),
        **extra,
    }


def reachable(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port`` within a second."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip (locally) or fail (under CI=true) when a service does not answer."""
    if reachable(host, port):
        return
    message = f"{name} is not reachable on {host}:{port}; start it with `make services`"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def test_settings(**overrides: object) -> Settings:
    """Settings for tests: the environment's service URLs with fast group timings."""
    base = load_settings()
    kafka = {
        "bootstrap_servers": base.kafka.bootstrap_servers,
        "session_timeout_ms": 3000,
        "request_timeout_ms": 5000,
    }
    redis = {"url": base.redis.url, "heartbeat_ms": 100, "lease_ms": 1500}
    return load_settings(kafka=kafka, redis=redis, **overrides)


test_settings.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


_declared: list[tuple[Settings, str, tuple[str, ...]]] = []
_groups: list[tuple[Settings, str, str, tuple[str, ...]]] = []
_consumers: list[Any] = []  # made by the current test, closed (if still open) after it
_CLOSE_LIMIT_S = 10.0
"""The longest wait for a consumer a failed test left open to leave its group."""
_stubborn: list[tuple[Settings, str, str, tuple[str, ...]]] = []  # groups busy at teardown


def delete_after_test(transport: object, names: Iterable[str]) -> None:
    """Have the topics ``names`` on ``transport``'s broker deleted when the current test ends.

    The autouse fixture of ``tests/conftest.py`` deletes them after the test, passed or failed,
    through a fresh transport built from the same settings (the test's own may be closed by
    then).
    """
    settings: Settings | None = getattr(transport, "_settings", None)
    if settings is None:  # an in-memory transport: nothing outlives the test
        return
    delete_topics_after_test(settings, transport.name, names)  # type: ignore[attr-defined]


def delete_topics_after_test(settings: Settings, transport: str, names: Iterable[str]) -> None:
    """:func:`delete_after_test` for topics another process made (``pipeline topics apply``)."""
    _declared.append((settings, transport, tuple(names)))


def delete_group_after_test(
    settings: Settings, transport: str, group: str, topics: Iterable[str] = ()
) -> None:
    """Have consumer group ``group`` deleted when the current test ends, before its topics.

    Every ``consumer()`` of a real transport made in the test process registers its group (see
    :func:`recording_groups`); a group joined by another process (``pipeline consume``) is
    registered with this. ``topics`` are those the group read: on Redis its consumer groups
    live on their streams.
    """
    _groups.append((settings, transport, group, tuple(topics)))


def delete_group_after(transport: object, group: str, topics: Iterable[str]) -> None:
    """:func:`delete_group_after_test` for a group that processes join on ``transport``'s broker."""
    settings: Settings | None = getattr(transport, "_settings", None)
    if settings is not None:  # an in-memory transport: nothing outlives the test
        delete_group_after_test(settings, transport.name, group, topics)  # type: ignore[attr-defined]


def recording_groups(consumer: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a transport class's ``consumer`` so that every group it joins is deleted after the test.

    The wrapper only records the group and the consumer; the consumer is the transport's own.
    One that a failed test left open is closed before its group is deleted, as a member that
    stays in the group keeps Kafka from deleting it.
    """

    @functools.wraps(consumer)
    def record(self: Any, group: str, topics: Sequence[str], **kwargs: Any) -> Any:
        made = consumer(self, group, topics, **kwargs)  # a consumer never made joins nothing
        delete_group_after_test(self._settings, self.name, group, topics)
        _consumers.append(made)
        return made

    return record


_Group = tuple[Settings, str, str, tuple[str, ...]]


def _distinct(groups: Iterable[_Group]) -> list[_Group]:
    """Each group once (settings compared by identity: they hold unhashable dicts)."""
    seen: dict[tuple[int, str, str], _Group] = {}
    for entry in groups:
        settings, name, group, topics = entry
        key = (id(settings), name, group)
        if key in seen:  # the same group read more topics: delete it from all of them
            seen[key] = (settings, name, group, tuple(dict.fromkeys((*seen[key][3], *topics))))
        else:
            seen[key] = entry
    return list(seen.values())


def _answers(settings: Settings, transport: str) -> bool:
    """Whether the broker ``transport`` of ``settings`` accepts connections."""
    if transport == "kafka":
        host, _, port = settings.kafka.bootstrap_servers.split(",")[0].rpartition(":")
        return reachable(host, int(port))
    url = urlparse(settings.redis.url)
    return reachable(url.hostname or "127.0.0.1", url.port or 6379)


async def _delete_groups(groups: list[_Group]) -> list[_Group]:
    """Delete ``groups``; those that still have members are returned, other failures ignored."""
    from pipeline.errors import GroupNotEmpty, PipelineError  # noqa: PLC0415 - keeps this module light
    from pipeline.transport import create_transport  # noqa: PLC0415

    busy = []
    transports: dict[tuple[int, str], tuple[Transport, Admin]] = {}
    try:
        for settings, name, group, topics in groups:
            key = (id(settings), name)
            if not _answers(settings, name):
                continue  # a test's unreachable broker: it holds no group
            try:
                if key not in transports:
                    transport = create_transport(settings, name)
                    try:
                        transports[key] = (transport, transport.admin())
                    except PipelineError:
                        await transport.close()
                        raise
                await transports[key][1].delete_group(group, topics)
            except GroupNotEmpty:
                busy.append((settings, name, group, topics))
            except PipelineError:
                pass  # the broker is gone or the settings cannot make a client: the
                # end-of-run check reports what is left
    finally:
        for transport, admin in transports.values():
            await admin.close()
            await transport.close()
    return busy


async def delete_declared() -> None:
    """Delete the groups, then the topics, registered for deletion; missing ones are fine.

    A Kafka group whose member has not left yet (a static member keeps its slot until its
    session expires) is kept for :func:`delete_stubborn_groups` at the end of the run.
    """
    from pipeline.errors import PipelineError  # noqa: PLC0415
    from pipeline.transport import create_transport  # noqa: PLC0415

    groups = _distinct(_groups)
    topics = list(_declared)
    consumers = list(_consumers)
    _groups.clear()
    _declared.clear()
    _consumers.clear()
    for consumer in consumers:  # closing a closed one does nothing
        with contextlib.suppress(Exception):  # its loop or broker may be gone: nothing to leave
            await asyncio.wait_for(consumer.close(), _CLOSE_LIMIT_S)
    _stubborn.extend(await _delete_groups(groups))
    for settings, name, names in topics:
        transport = create_transport(settings, name)
        admin = transport.admin()
        try:
            for topic in names:
                with contextlib.suppress(PipelineError):
                    await admin.delete_topic(topic)
        finally:
            await transport.close()


async def delete_stubborn_groups(patience_s: float = 60.0) -> list[str]:
    """Delete the groups that still had members when their test ended; the names left over.

    A static member holds its slot until its session expires (seconds under the test settings,
    the broker's session timeout at most), so the groups are asked again, once a second, until
    ``patience_s`` has passed.
    """
    deadline = time.monotonic() + patience_s
    pending = _distinct(_stubborn)
    _stubborn.clear()
    while pending:
        pending = await _delete_groups(pending)
        if not pending or time.monotonic() > deadline:
            break
        await asyncio.sleep(1.0)  # a member's session is still running out
    return [f"{name}:{group}" for _, name, group, _ in pending]


def has_declared() -> bool:
    """Whether a test registered topics or groups to delete."""
    return bool(_declared or _groups)


class StackDumps:
    """Reads stack dumps (``kill -USR1``) line by line; fails at a dump not written in one piece.

    Lines outside a dump (a process's log) are passed over. ``whole`` counts each process's
    complete dumps (from its header to ``--- end of stacks ---``).
    """

    HEADER = re.compile(r"--- stacks of process (\d+): threads ---")
    END = stacks.END

    def __init__(self) -> None:
        """No dump read yet."""
        self.whole: Counter[int] = Counter()
        self._inside: int | None = None

    def read(self, line: str) -> None:
        """One line of the stream the dumps were written to."""
        line = line.rstrip("\n")
        header = self.HEADER.fullmatch(line)
        if header:
            assert self._inside is None, f"a dump began inside process {self._inside}'s: {line!r}"
            self._inside = int(header[1])
            return
        assert "--- stacks of process" not in line, f"a dump began mid-line: {line!r}"
        if line == self.END and self._inside is not None:
            self.whole[self._inside] += 1
            self._inside = None

    @property
    def between(self) -> bool:
        """Whether the last line read ended a dump (or none began)."""
        return self._inside is None


class TcpRelay:
    """A TCP relay from ``listen`` to ``target`` on loopback, for the life of a ``with`` block.

    Lets a test make one address go from refusing connections to answering like a real service
    (and back, on exit: its listening socket and every relayed connection are closed).
    """

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        """Relay connections to ``listen`` to ``target`` once entered."""
        self._listen = listen
        self._target = target
        self._server = socket.socket()
        self._sockets: list[socket.socket] = [self._server]
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> Self:
        """Start listening and relaying."""
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(self._listen)
        self._server.listen()
        self._start(self._accept)
        return self

    def __exit__(self, *_: object) -> None:
        """Stop: close every socket, wait for the threads."""
        with self._lock:
            self._closed = True
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            _close(sock)
        for thread in threads:
            thread.join(5)

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:  # closed on exit
                return
            try:
                upstream = socket.create_connection(self._target)
            except OSError:  # the target is down: the test fails on what its client says
                _close(client)
                continue
            with self._lock:
                if self._closed:  # accepted while the relay was being closed
                    _close(client)
                    _close(upstream)
                    return
                self._sockets += [client, upstream]
                self._start(self._pump, client, upstream)
                self._start(self._pump, upstream, client)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def _close(sock: socket.socket) -> None:
    """Shut ``sock`` down both ways (waking a thread blocked on it) and close it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


async def pass_expiries(redis: Redis, match: str, duration_ms: int) -> None:
    """Age the keys matching ``match`` by ``duration_ms``: each whose expiry falls within is gone.

    What Redis's clock would do to them over an outage that long, in no time; keys without an
    expiry are left as they are.
    """
    async for key in redis.scan_iter(match=match):
        left = await redis.pttl(key)
        if left < 0:
            continue  # no expiry (-1), or gone meanwhile (-2)
        if left <= duration_ms:
            await redis.delete(key)
        else:
            await redis.pexpire(key, left - duration_ms)


class LosesFirstCancel:
    """A task body that loses its first cancellation and goes on, then ends at the next one.

    As a loop over redis-py calls does on Python 3.11: ``asyncio.wait_for`` returns the result
    instead of raising when the cancellation lands as the reply arrives (CPython issue 86296).
    """

    def __init__(self) -> None:
        """Nothing lost yet."""
        self.absorbed = 0
        """Cancellations lost so far (at most one)."""
        self.running = asyncio.Event()
        """Set once the body runs."""

    async def run(self) -> None:
        """Wait for ever, losing the first cancellation."""
        while True:
            try:
                self.running.set()
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if self.absorbed or current is None:
                    raise
                self.absorbed += 1
                current.uncancel()  # lost, as in wait_for racing a reply


async def signalled_tail(
    topic: str, transport_name: str, env: dict[str, str], stop: int, within_s: float
) -> tuple[int, bytes]:
    """Run ``pipeline tail TOPIC --from-beginning``, send ``stop`` once it printed a message.

    Returns its exit code and stderr; a tail not gone ``within_s`` after the signal fails the
    test (and is killed).
    """
    command = [sys.executable, "-m", "pipeline", "tail", topic, "--from-beginning"]
    pipe = asyncio.subprocess.PIPE
    tail = await asyncio.create_subprocess_exec(
        *command, "-t", transport_name, env=env, stdout=pipe, stderr=pipe
    )
    assert tail.stdout is not None
    stderr = b""
    try:
        printed = await asyncio.wait_for(tail.stdout.readline(), 60)
        assert printed.startswith(f"{topic}[".encode()), await tail.communicate()
        tail.send_signal(stop)
        _, stderr = await asyncio.wait_for(tail.communicate(), within_s)  # a hang fails here
    finally:
        if tail.returncode is None:
            tail.kill()
            _, stderr = await tail.communicate()
    assert tail.returncode is not None
    return tail.returncode, stderr


async def reader_groups_of(settings: Settings, client_id: str, stderr: bytes) -> set[str]:
    """The groups on the broker that a tail of ``client_id`` joined (named in its log or not)."""
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415 - only the tail tests use it

    named = {g.decode() for g in re.findall(rb"pipeline-reader-\w+", stderr)}
    client = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})
    listed = await asyncio.to_thread(
        lambda: client.list_consumer_groups(request_timeout=10).result()
    )
    readers = [g.group_id for g in listed.valid if g.group_id.startswith("pipeline-reader-")]
    if not readers:
        return set()
    described = client.describe_consumer_groups(readers, request_timeout=10)
    joined = set()
    for group, future in described.items():
        members = (await asyncio.wrap_future(future)).members
        if group in named or any(m.client_id.startswith(f"{client_id}-") for m in members):
            joined.add(group)
    return joined


@functools.cache
def rendered_k8s() -> tuple[dict[str, Any], ...]:
    """Every document `kubectl kustomize deploy/k8s` prints."""
    if shutil.which("kubectl") is None:
        message = "kubectl is needed to render deploy/k8s (apt-get install kubectl)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    done = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "deploy" / "k8s")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def k8s_of_kind(kind: str) -> list[dict[str, Any]]:
    """The documents of one kind `kubectl kustomize deploy/k8s` prints."""
    return [doc for doc in rendered_k8s() if doc["kind"] == kind]


def promtool_binary() -> Path:
    """The cached promtool (deploy/local/promtool.sh); skip when it is not built."""
    where = subprocess.run(
        ["bash", str(ROOT / "deploy" / "local" / "promtool.sh"), "path"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(where).is_file():
        pytest.skip("promtool is not built (make promtool builds it once, several minutes)")
    return Path(where)


async def stopped_once_it_sent(
    proc: asyncio.subprocess.Process, admin: Admin, topic: str, stop: signal.Signals, what: str
) -> bytes:
    """Send ``proc`` ``stop`` once ``topic`` holds a message; its stderr, once it ended.

    ``proc`` (its stdout and stderr piped) must not end first, nor take more than 60 s; ``what``
    names it in the failure ("the replay").
    """
    try:
        deadline = time.monotonic() + 60
        while (await admin.list_topics([topic]))[topic].message_count == 0:
            assert proc.returncode is None, await proc.communicate()
            assert time.monotonic() < deadline, f"{what} sent nothing in 60 s"
            await asyncio.sleep(0.05)
    finally:
        proc.send_signal(stop)
        _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    return stderr


@contextlib.asynccontextmanager
async def serving_metrics(server: MetricsServer) -> AsyncIterator[int]:
    """:func:`serve_metrics` of ``server`` in this process on a free loopback port: the port.

    Stopped at the end.
    """
    stop = asyncio.Event()
    bound: asyncio.Future[tuple[str, int]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve_metrics(server, "127.0.0.1", 0, stop, lambda h, p: bound.set_result((h, p)))
    )
    try:
        _, port = await asyncio.wait_for(bound, 10)
        yield port
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@contextlib.asynccontextmanager
async def started_throttle(redis_url: str, **options: Any) -> AsyncIterator[Throttle]:
    """A started :class:`Throttle` on a client of its own (``options`` as it takes them).

    Closed, and its client with it, when the block ends; its keys are the test's to delete
    (a namespace or prefix holding the test's ``unique`` suffix is deleted by that fixture).
    """
    from redis.asyncio import Redis  # noqa: PLC0415 - a name for annotations above

    client = Redis.from_url(redis_url)
    throttle = Throttle(client, **options)
    await throttle.start()
    try:
        yield throttle
    finally:
        await throttle.close()
        await client.aclose()


@contextlib.asynccontextmanager
async def all_admitted(throttle: Throttle, key: str, most: int) -> AsyncIterator[list[Permit]]:
    """The permits ``try_acquire`` grants on ``key`` until it refuses (at most ``most``).

    Released again when the block ends, whatever it asserted.
    """
    permits: list[Permit] = []
    try:
        for _ in range(most):
            permit = await throttle.try_acquire([key])
            if permit is None:
                break
            permits.append(permit)
        yield permits
    finally:
        for permit in permits:
            await throttle.release(permit)


def own_throttle(default_limit: int) -> object:
    """A fixture named ``throttle``, bound to that name at a test module's top level.

    Each test taking ``throttle`` gets a started :class:`Throttle` (:func:`started_throttle`)
    in a namespace of its own (``UNIQUE``, keys under the prefix ``tUNIQUE``), ``default_limit``
    slots a key unless the test sets another limit.
    """

    @pytest.fixture(name="throttle")
    async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
        async with started_throttle(
            redis_service, prefix=f"t{unique}", namespace=unique, default_limit=default_limit
        ) as limiter:
            yield limiter

    return throttle


async def held_messages(transport: Transport, topic: str, bound_s: float = 60.0) -> list[Message]:
    """Every message ``topic`` holds, read by a reader in no group (within ``bound_s``)."""
    counts = (await transport.admin().list_topics([topic]))[topic].message_counts
    reader = transport.reader([topic], start_at="earliest")
    got: list[Message] = []
    try:
        deadline = time.monotonic() + bound_s
        while len(got) < sum(counts):
            assert time.monotonic() < deadline, got
            got += await reader.poll(100, 0.2)
    finally:
        await reader.close()
    return got

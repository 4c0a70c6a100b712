"""Wiring: settings in, a running ingress (app, log store, producer, sweeper) out.

:func:`build_ingress` reads the topic declarations and the sources file first, so every
configuration problem stops the process before it listens. :class:`Ingress` owns the
collaborators' lifecycle; :func:`serve` runs it on uvicorn (uvloop, httptools).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

import uvicorn
from redis.asyncio import Redis

from pipeline.admission.debounce.held import BufferedEvents
from pipeline.capacity.feed import CapacityFeed
from pipeline.config import IngressSettings, RedisSettings, Settings
from pipeline.errors import ConfigError
from pipeline.heap import freeze_startup, heap_trim, keep_trimmed
from pipeline.ingress.app import IngressApp
from pipeline.ingress.backlog import GroupLagBacklog
from pipeline.ingress.dispatch import Dispatcher
from pipeline.ingress.exit_bound import exit_by
from pipeline.ingress.http import ingress_protocol
from pipeline.ingress.schemas import LaneSchemas
from pipeline.ingress.settings import load_sources
from pipeline.ingress.source import (
    HEADROOM_BYTES,
    Source,
    build_sources,
    check_topic_limits,
    limits_not_checked,
)
from pipeline.ingress.sweeper import Sweeper
from pipeline.logstore import LogStore, LogStoreError
from pipeline.logstore.create import create_log_store
from pipeline.observability import stacks
from pipeline.observability.facades import LogCommitMetrics, OffloadMetrics
from pipeline.observability.metrics import Metrics
from pipeline.observability.server import MetricsServer, serve_metrics
from pipeline.observability.wiring import (
    ingress_sources,
    sweeper_heartbeat,
    waits_in_members_redis,
)
from pipeline.offload.rows import offload_row
from pipeline.offload.writer import Offloader, OffloadingProducer, topic_policies
from pipeline.quiet_stop import QuietStop
from pipeline.reachability import require_listenable
from pipeline.registry.client.http import RegistryClient
from pipeline.topics.spec import TopicSpec, load_specs
from pipeline.transport import create_transport
from pipeline.transport.protocol import Admin, Producer, Transport

log = logging.getLogger(__name__)

DRAIN_S = 10.0
"""The longest each step of a stop gets: uvicorn's graceful shutdown (answering the requests in
flight), the sweeper's batch in hand, the queued events (see :func:`step_s`)."""


WRITE_PROBE_S = 1.0
"""How often an ingress whose log store failed an insert tries a write, to turn ready again."""


def probe_bytes(sources: Mapping[str, Source], max_message_bytes: int) -> int:
    """The body of the write that turns an unready ingress ready: the largest its rows carry.

    A source's body is at most its ``max_body_bytes``; where that passes the message size, its
    topics offload, and the row keeps a body of at most the inline bound (the message size less
    :data:`~pipeline.ingress.source.HEADROOM_BYTES`) and a reference for the rest. A smaller
    probe commits on a nearly full volume where the next webhook of ordinary size does not:
    readiness would come back each second, and go with that webhook.
    """
    inline = max_message_bytes - HEADROOM_BYTES
    return max((min(s.max_body_bytes, inline) for s in sources.values()), default=0)


def step_s(ingress: IngressSettings) -> float:
    """What each of a stop's three steps gets at most: a third of what closing leaves.

    Of ``ingress.stop_within_s`` (the bound after a stop signal, under the ``--workers``
    supervisor's and Kubernetes' grace), :attr:`IngressSettings.CLOSE_RESERVE_S` is kept for
    closing the log store and the transport; uvicorn's graceful shutdown, the sweeper's batch in
    hand and the queued events get a third each of the rest, at most :data:`DRAIN_S` (10 s of
    the default 35 s bound); the producer's flush gets what they leave.
    """
    return min(DRAIN_S, (ingress.stop_within_s - IngressSettings.CLOSE_RESERVE_S) / 3)


def lane_topics(specs: Sequence[TopicSpec]) -> dict[str, list[str]]:
    """The main topics of each lane."""
    lanes: dict[str, list[str]] = defaultdict(list)
    for spec in specs:
        lanes[spec.lane].append(spec.name)
    return dict(lanes)


def lane_delays_s(specs: Sequence[TopicSpec]) -> dict[str, float]:
    """The longest each lane's events wait by design, in seconds: its retries and batch SLA.

    The retries are the tiers its failed deliveries go through (``max_attempts - 1`` of them,
    the last tier repeated; every one the longest with a retry budget, which may send there).
    """
    delays_s: dict[str, float] = {}
    for spec in specs:
        tiers_ms = spec.retry.tiers_ms
        retries = spec.retry.max_attempts - 1
        if not tiers_ms:
            retries_ms = 0
        elif spec.retry.budget is not None:
            retries_ms = retries * tiers_ms[-1]
        else:
            retries_ms = sum(tiers_ms[min(n, len(tiers_ms) - 1)] for n in range(retries))
        batch_ms = spec.batch.sla_ms if spec.batch is not None else 0
        delay_s = (retries_ms + batch_ms) / 1000
        delays_s[spec.lane] = max(delays_s.get(spec.lane, 0.0), delay_s)
    return delays_s


def lane_windows_s(specs: Sequence[TopicSpec]) -> dict[str, float]:
    """The longest each debounced lane's events wait for their turn, in seconds: ``max_wait_s``.

    A recorded event's offset is committed while its turn is still to come, so that wait shows
    in no lag: the sweeper counts it in the lane's patience instead.
    """
    windows_s: dict[str, float] = {}
    for spec in specs:
        if spec.debounce is not None:
            windows_s[spec.lane] = max(windows_s.get(spec.lane, 0.0), spec.debounce.max_wait_s)
    return windows_s


def build_sweeper(
    store: LogStore,
    producer: Producer,
    admin: Admin,
    specs: Sequence[TopicSpec],
    ingress: IngressSettings,
    *,
    clock: Callable[[], float] = time.time,
    redis: RedisSettings | None = None,
) -> Sweeper:
    """A sweeper over ``store`` that reads lane backlogs with ``admin``, on ``clock``.

    With ``redis`` (the members' settings), the sweeper asks the debouncer there which events
    of the debounced lanes still wait for their turn, and leaves their rows; close it
    (:meth:`Sweeper.close`) to close that client.
    """
    lanes = lane_topics(specs)
    s = ingress.sweeper
    # A copy waiting in a retry tier is late, not lost: the tiers count towards the backlog.
    queued: dict[str, list[str]] = defaultdict(list)
    for spec in specs:
        queued[spec.lane] += [spec.name, *spec.retry_topic_names()]
    backlog = GroupLagBacklog(admin, queued, s.lane_groups, s.backlog_threshold)
    windows_s = lane_windows_s(specs)
    buffered = None
    if redis is not None and windows_s:
        client = Redis.from_url(
            redis.url,
            socket_timeout=redis.socket_timeout_s,
            socket_connect_timeout=redis.socket_timeout_s,
        )
        buffered = BufferedEvents(client, redis.key_prefix, windows_s)
    return Sweeper(
        store,
        producer,
        backlog,
        lanes,
        s,
        clock=clock,
        lane_delays_s=lane_delays_s(specs),
        lane_windows_s=windows_s,
        buffered=buffered,
    )


@dataclass
class Ingress:
    """A configured ingress; :meth:`start` and :meth:`stop` run on the server's event loop."""

    settings: Settings
    ingress: IngressSettings
    specs: list[TopicSpec]
    sources: dict[str, Source]
    store: LogStore
    transport: Transport
    producer: Producer | None = None
    dispatcher: Dispatcher | None = None
    sweeper: Sweeper | None = None
    capacity: CapacityFeed | None = None
    limits_checked: bool = False
    """The topics' size limits were checked already (by :meth:`preflight`, in the supervisor), or
    skipped with their line (the broker down: :meth:`broker_down`); not asked at the start."""
    snapshot_served: bool = True
    """Something serves this process's metrics snapshot. A worker of ``--workers`` without a
    metrics port of its own has none to serve it (its ``/metrics`` answers 404): its snapshot's
    sources are neither built nor refreshed, so it asks the broker for no lag and the log for
    no backlog, and with the broker down logs no timeout of its own."""
    app: IngressApp = field(init=False)
    observer: MetricsServer = field(init=False)
    _stop: asyncio.Event | None = None
    _sweeping: asyncio.Task[None] | None = None
    _members_redis: Redis | None = None
    _unwritable: asyncio.Task[None] | None = None
    _stopping: bool = False

    def __post_init__(self) -> None:
        """Create the ASGI app; its lifespan events start and stop this ingress."""
        self.app = IngressApp(
            self.sources,
            self.store,
            None,
            lifespan=self.start,
            shutdown=self.stop,
            body_timeout_s=self.ingress.body_timeout_s,
        )
        self.observer = MetricsServer(Metrics(), interval_s=self.ingress.metrics_interval_s)
        self.app.observer = self.observer
        policies = topic_policies(self.specs)
        self.offloader: Offloader | None = None
        if policies:  # lanes with offload: large bodies go to their payload store
            self.offloader = Offloader(policies, observer=OffloadMetrics(self.observer.metrics))
            self.app.offload = functools.partial(offload_row, self.offloader)

    async def start(self) -> None:
        """Check the topics' size limits, open everything and start the sweeper task.

        The log store, the producer and the dispatcher are opened; a source whose body cap is
        above a topic's message limit stops the start (ConfigError).
        """
        if not self.limits_checked:
            await check_topic_limits(self.sources, self.transport.admin())
        await self.store.open()
        self.store.observe_commits(LogCommitMetrics(self.observer.metrics).committed)
        self.producer = self.transport.producer()
        if self.settings.capacity.record:  # arrivals per lane, counted per batch (capacity.md)
            self.capacity = CapacityFeed(self.settings, self.specs)
            self.producer = self.capacity.wrap(self.producer)
        self.dispatcher = Dispatcher(
            self.producer,
            self.store,
            queue_max=self.ingress.produce_queue_max,
            queue_max_bytes=self.ingress.produce_queue_max_bytes,
            batch_max=self.ingress.produce_batch_max,
        )
        self.app.dispatcher = self.dispatcher
        subjects = {s.lane: s.schema_subject for s in self.specs if s.schema_subject}
        if subjects:
            client = RegistryClient.from_settings(self.settings.registry)
            self.app.schemas = LaneSchemas(client, subjects)
            await self.app.schemas.start()
        if self.ingress.sweeper.enabled:
            # The sweeper produces rows again, perhaps long after their payloads were written.
            swept = (
                self.producer
                if self.offloader is None
                else OffloadingProducer(self.producer, self.offloader)
            )
            self.sweeper = build_sweeper(
                self.store,
                swept,
                self.transport.admin(),
                self.specs,
                self.ingress,
                redis=self.settings.redis,
            )
            self._stop = asyncio.Event()
            self._sweeping = asyncio.create_task(self.sweeper.run(self._stop))
            self.sweeper.on_sweep = sweeper_heartbeat(self.observer.metrics)
        if self.snapshot_served:
            self._start_snapshot()
        self.observer.ready = True
        self.app.log_failed = self._log_failed
        if not self.sources:  # a placeholder (deploy/k8s/base) or a file not filled in yet
            log.warning(
                "%s declares no sources: every POST /hooks/{source} is answered 404; add one"
                " (deploy/local/sources.example.yaml documents every field)",
                self.ingress.sources_file,
            )

    def _start_snapshot(self) -> None:
        """Build the metrics snapshot's sources and start refreshing it."""
        if waits_in_members_redis(self.specs):
            # Debounced turns and held followers wait in the members' Redis: reported here too,
            # should they all die.
            redis = self.settings.redis
            self._members_redis = Redis.from_url(
                redis.url,
                socket_timeout=redis.socket_timeout_s,
                socket_connect_timeout=redis.socket_timeout_s,
            )
        self.observer.sources = ingress_sources(
            self.observer.metrics,
            self.app,
            self.store,
            self.transport.admin(),
            self.specs,
            self.ingress.sweeper.lane_groups,
            redis=self._members_redis,
            redis_prefix=self.settings.redis.key_prefix,
        )
        if self.capacity is not None:
            self.observer.sources.append(self.capacity.source(self.observer.metrics))
        self.observer.start()

    def broker_down(self, reason: str) -> None:
        """The start's probe found the broker down (``reason``): its limits are not asked.

        Asked again, the broker would have a second bound (10 s) waited out before the ingress
        serves. The line says the check was skipped, as :func:`check_topic_limits` says of a
        broker that does not answer it: a body too large for its topic is reported when it is
        produced, as it was then.
        """
        limits_not_checked(reason)
        self.limits_checked = True

    async def preflight(self) -> None:
        """Check what :meth:`start` would refuse, then close: the log store, the topic limits.

        The limits are not asked of a broker the start's probe found down (:meth:`broker_down`).

        ``ingress serve --workers N`` runs it before it starts a worker, so that a log database
        that is down or refuses the ingress is one line from the supervisor, not one per worker.
        Nothing is left open; this ingress is not started.

        Raises:
            PipelineError: the log store cannot be opened, or a source's body cap is above a
                topic's message limit (ConfigError).
        """
        try:
            await self.store.open()
            if not self.limits_checked:
                await check_topic_limits(self.sources, self.transport.admin())
                self.limits_checked = True
        finally:
            with contextlib.suppress(Exception):  # the check's own error is the one to report
                await self.store.close()
            await self.transport.close()

    def unready(self) -> None:
        """Answer ``/readyz`` 503 from now on (a stop signal came: take no new traffic)."""
        self._stopping = True
        self.observer.ready = False

    def _log_failed(self, _exc: LogStoreError) -> None:
        """An insert failed: ``/readyz`` 503 until a write probe commits again."""
        if self._unwritable is not None or self._stopping:
            return
        self.observer.ready = False
        self._unwritable = asyncio.create_task(self._until_writable())

    async def _until_writable(self) -> None:
        """Try a write every :data:`WRITE_PROBE_S` until one commits, then turn ready again.

        The write carries a body of :func:`probe_bytes`: the room of the largest row, not of a
        small one (deleted in the same transaction, it keeps nothing).
        """
        size = probe_bytes(self.sources, self.settings.max_message_bytes)
        log.error(
            "ingress unready (/readyz 503) until its log store %s can write again (the error "
            "above says why); a write of a %d-byte body (the largest a source stores) is tried "
            "every %g s",
            self.store,
            size,
            WRITE_PROBE_S,
        )
        since = time.monotonic()
        while True:
            await asyncio.sleep(WRITE_PROBE_S)
            with contextlib.suppress(LogStoreError):
                await self.store.probe_write(size)
                break
        self._unwritable = None
        if not self._stopping:
            self.observer.ready = True
            log.warning(
                "the log store %s writes again after %.1f s: ingress ready (/readyz 200)",
                self.store,
                time.monotonic() - since,
            )

    async def stop(self, deadline: float | None = None) -> None:
        """Stop the sweeper, let queued events go, then close everything, by ``deadline``.

        ``deadline`` (``time.monotonic()``) defaults to what ``ingress.stop_within_s`` leaves
        after uvicorn's graceful shutdown. The sweeper's batch in hand and the queued events get
        :func:`step_s` each at most, the producer's flush what is left but
        ``IngressSettings.CLOSE_RESERVE_S``; a broker that does not answer then costs no more.
        Events not produced stay ``received`` for a sweeper; their count is logged in one line.
        """
        drain_s = step_s(self.ingress)
        if deadline is None:
            deadline = time.monotonic() + self.ingress.stop_within_s - drain_s
        reserve_s = IngressSettings.CLOSE_RESERVE_S

        def left_s(most_s: float = float("inf")) -> float:
            return max(0.0, min(most_s, deadline - time.monotonic() - reserve_s))

        await self._close_observer()
        if self.app.schemas is not None:
            await self.app.schemas.close()
        if self._stop is not None and self._sweeping is not None:
            self._stop.set()
            await asyncio.wait([self._sweeping], timeout=left_s(drain_s))
            self._sweeping.cancel()  # a batch the broker does not take: its lease runs out
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeping
        if self.sweeper is not None:
            with contextlib.suppress(Exception):  # only a client of its own to release
                await self.sweeper.close()
        unproduced = 0
        if self.dispatcher is not None:
            waiting, produced = self.dispatcher.waiting, self.dispatcher.counters.produced
            await self.dispatcher.close(left_s(drain_s))
            unproduced = waiting - (self.dispatcher.counters.produced - produced)
        if self.producer is not None:
            # Unacknowledged events stay 'received'; a flush cut short at the deadline is counted
            # in ``unproduced`` already.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(left_s()):
                    await self.producer.close()
        await self._settle_offloads(left_s())
        if unproduced > 0:
            log.warning(
                "ingress stopped with %d events left unproduced; they stay 'received' in the "
                "log for a sweeper (the next ingress's, or `pipeline sweep`)",
                unproduced,
            )
        try:
            try:
                if self.capacity is not None:
                    await self.capacity.close()
            finally:
                await self.store.close()
        finally:  # the transport's clients are released whatever the store's close says
            await self.transport.close()

    async def _close_observer(self) -> None:
        """Turn unready for good, stop refreshing ``/metrics`` and release its Redis client."""
        self._stopping = True
        self.observer.ready = False
        if self._unwritable is not None:  # no longer tries writes to turn ready again
            self._unwritable.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._unwritable
        await self.observer.close()
        if self._members_redis is not None:
            with contextlib.suppress(Exception):  # only a client of its own to release
                await self._members_redis.aclose()

    async def _settle_offloads(self, within_s: float) -> None:
        """Wait up to ``within_s`` for the looks after rewrites of old payloads (see the purge)."""
        if self.offloader is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within_s):
                    await self.offloader.settle()


def build_ingress(settings: Settings, ingress: IngressSettings) -> Ingress:
    """Read topics and sources and build the ingress (ConfigError on any problem)."""
    specs = load_specs(settings.topics_dir, settings.max_message_bytes)
    configs = load_sources(ingress.sources_file, {spec.name for spec in specs})
    sources = build_sources(
        configs,
        specs,
        admission=ingress.admission,
        max_message_bytes=settings.max_message_bytes,
    )
    _check_unfinished_bound(ingress, sources)
    max_connections(ingress)  # a bound above the open-file limit stops the start here
    return Ingress(
        settings=settings,
        ingress=ingress,
        specs=specs,
        sources=sources,
        store=create_log_store(settings, ingress),
        transport=create_transport(settings),
    )


def _check_unfinished_bound(ingress: IngressSettings, sources: Mapping[str, Source]) -> None:
    """ConfigError unless one whole request of every source fits the unfinished-bytes bound.

    Below it, every body of that source arriving in more than one read would be refused 503,
    the server idle or not, and its sender would retry for ever.
    """
    if not sources:
        return
    name = max(sources, key=lambda each: sources[each].max_body_bytes)
    body = sources[name].max_body_bytes
    need = body + ingress.max_head_bytes
    if ingress.max_unfinished_bytes < need:
        raise ConfigError(
            f"PIPELINE_INGRESS__MAX_UNFINISHED_BYTES={ingress.max_unfinished_bytes} is below one"
            f" request of source {name} (max_body_bytes {body} + PIPELINE_INGRESS__MAX_HEAD_BYTES"
            f" {ingress.max_head_bytes}): its bodies arriving in more than one read would all be"
            f" refused; raise it to at least {need}, better a few times that"
        )


FD_RESERVE = 128
"""Descriptors kept from client connections for the log store, the broker, the metrics port,
the sweeper and the logs (an ingress at rest holds about 25)."""
CONNECTIONS_CAP = 16_384
"""The most client connections one process holds by default, whatever its open-file limit.

The bound's default follows the open-file limit, which each command raises to the hard limit
(:mod:`pipeline.descriptors`; systemd's is 524288): memory runs out long before descriptors
would. An idle connection costs the ingress about 5.3 KiB of resident memory (measured: 10,000
idle connections added 52 MiB), plus the kernel's socket memory and up to
``PIPELINE_INGRESS__MAX_UNFINISHED_BYTES`` of unfinished requests over all of them: at the cap
about 85 MiB of the process, at 524288 connections about 2.7 GiB. A larger
``PIPELINE_INGRESS__MAX_CONNECTIONS`` is taken, up to the open-file limit less the reserve."""


def max_connections(ingress: IngressSettings) -> int:
    """How many client connections one process holds: the setting, else a default.

    The default is the open-file limit less :data:`FD_RESERVE`, at most
    :data:`CONNECTIONS_CAP` (the cap alone when the limit is unlimited); a setting may go past
    the cap, up to the limit less the reserve.

    Raises:
        ConfigError: the open-file limit leaves no descriptor for connections once
            :data:`FD_RESERVE` are kept, or ``max_connections`` leaves less than the reserve: a
            flood of connections could then take the descriptors the log store and the broker
            need.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = None if soft == resource.RLIM_INFINITY else soft - FD_RESERVE
    if room is not None and room < 1:
        raise ConfigError(
            f"the open-file limit ({soft}) leaves no descriptor for client connections once"
            f" {FD_RESERVE} are kept for the log store and the broker; raise it (ulimit -n)"
        )
    if ingress.max_connections is None:
        return CONNECTIONS_CAP if room is None else min(room, CONNECTIONS_CAP)
    if room is not None and ingress.max_connections > room:
        raise ConfigError(
            f"PIPELINE_INGRESS__MAX_CONNECTIONS={ingress.max_connections} leaves less than"
            f" {FD_RESERVE} of the open-file limit ({soft}) for the log store and the broker;"
            f" lower it to at most {room} or raise the limit (ulimit -n)"
        )
    return ingress.max_connections


def _log_connection_bound(ingress: IngressSettings, bound: int) -> None:
    """One info line at start: the connection bound, and the open-file limits it came from."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    log.info(
        "ingress: at most %d client connections (%s; open-file limit %s, hard %s)",
        bound,
        "PIPELINE_INGRESS__MAX_CONNECTIONS"
        if ingress.max_connections is not None
        else f"default: the open-file limit less {FD_RESERVE}, at most {CONNECTIONS_CAP}",
        "unlimited" if soft == resource.RLIM_INFINITY else soft,
        "unlimited" if hard == resource.RLIM_INFINITY else hard,
    )


PORT_VARIABLE = "PIPELINE_INGRESS__PORT (or --port)"
HOST_VARIABLE = "PIPELINE_INGRESS__HOST (or --host)"


def require_free_port(
    host: str, port: int, variable: str, *, host_variable: str = HOST_VARIABLE
) -> None:
    """Fail with one line, before anything starts, when ``host:port`` cannot be listened on.

    ``variable`` and ``host_variable`` name the settings of the port and of the address.
    """
    require_listenable(host, port, variable=variable, host_variable=host_variable)


class _Server(QuietStop):
    """uvicorn's server, which does not raise the stop signal again once it has served.

    uvicorn raises a SIGTERM or SIGINT it caught once more when :meth:`serve` ends, so that
    the process dies of it: a SIGTERM then killed the ingress before :func:`serve` stopped
    ``built`` (its queued events unproduced, the produced ones unmarked, the log store left
    open). The ingress stops itself and exits 0 instead.
    """

    signalled_at: float | None = None
    """When (``time.monotonic()``) the first stop signal came; None before."""
    on_signal: Callable[[], None] | None = None
    """Told of the first stop signal (the ingress turns unready at once)."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Note when the first stop signal came (the grace runs from it), then stop serving."""
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
            if self.on_signal is not None:
                self.on_signal()
        super().handle_exit(sig, frame)


def http_server(built: Ingress, host: str, port: int, *, lifespan: bool = True) -> uvicorn.Server:
    """The uvicorn server of ``built`` (the ingress's own HTTP layer), not started.

    With ``lifespan`` the server starts and stops ``built`` itself; without, the caller does.
    """
    bound = max_connections(built.ingress)
    _log_connection_bound(built.ingress, bound)
    config = uvicorn.Config(
        built.app,
        host=host,
        port=port,
        loop="none",
        http=ingress_protocol(
            built.app, built.ingress.max_head_bytes, built.ingress.max_unfinished_bytes, bound
        ),
        lifespan="on" if lifespan else "off",
        proxy_headers=False,  # nothing reads the client address: one ASGI layer less
        access_log=False,
        log_level="warning",
        log_config=None,  # its loggers propagate: the process's format, trace and worker fields
        timeout_graceful_shutdown=max(1, int(step_s(built.ingress))),  # whole seconds
    )
    return _Server(config)


async def serve(
    built: Ingress,
    host: str,
    port: int,
    on_ready: Callable[[str, int], None] | None = None,
    *,
    sock: socket.socket | None = None,
) -> None:
    """Serve ``built`` on uvicorn until interrupted; ``on_ready(host, port)`` once listening.

    ``sock``, when given, is a socket already listening on ``host:port`` (a worker of
    :mod:`pipeline.ingress.workers`); otherwise uvicorn binds ``host:port`` itself.

    The ingress starts here, before uvicorn, rather than in uvicorn's lifespan: a start that
    fails (a log database that refuses the password, a broker that is down) then raises its
    own one-line error to the command instead of uvicorn's traceback and "startup failed".

    Raises:
        ConfigError: ``port`` (or the metrics port) is held by another process.
        PipelineError: the ingress cannot start (log store, broker or topic limits).
    """
    if sock is None:
        require_free_port(host, port, PORT_VARIABLE)
    if built.ingress.metrics_port:
        require_free_port(
            built.ingress.metrics_host,
            built.ingress.metrics_port,
            "PIPELINE_INGRESS__METRICS_PORT",
            host_variable="PIPELINE_INGRESS__METRICS_HOST",
        )
    try:
        await built.start()
    except BaseException:
        with contextlib.suppress(Exception):  # the start's own error is the one to report
            await built.stop()  # what it opened before it failed is closed
        raise
    loop = asyncio.get_running_loop()
    stacks.install(loop)  # kill -USR1: every thread's and task's stack on stderr
    server = http_server(built, host, port, lifespan=False)
    if isinstance(server, _Server):
        server.on_signal = built.unready
    # The metrics port serves until the stop has ended: /readyz 503 and /healthz 200 meanwhile.
    stop_metrics = asyncio.Event()
    metrics = await _serve_metrics_apart(built, stop_metrics)
    # Once the requests stop, the C heap they freed goes back to the system (pipeline/heap.py).
    answered = built.app.counters
    trimming = asyncio.create_task(
        keep_trimmed(lambda: sum(answered.values()), stop_metrics, heap_trim())
    )
    try:
        await _serve_started(server, on_ready, sock)
    finally:
        trimming.cancel()
        stacks.remove(loop)
        signalled_at = getattr(server, "signalled_at", None)  # the grace runs from the signal
        deadline = None if signalled_at is None else signalled_at + built.ingress.stop_within_s
        if deadline is not None:
            exit_by(deadline, "PIPELINE_INGRESS__STOP_WITHIN_S")  # whatever holds the exit
        try:
            await built.stop(deadline)
        finally:
            stop_metrics.set()
            if metrics is not None:
                await metrics


async def _serve_started(
    server: uvicorn.Server,
    on_ready: Callable[[str, int], None] | None,
    sock: socket.socket | None,
) -> None:
    """Serve an ingress that :meth:`Ingress.start` has started on ``server``, until interrupted."""

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.01)
        bound_host, bound_port = server.servers[0].sockets[0].getsockname()[:2]
        freeze_startup()  # listening: full collections skip the start-up objects from now on
        if on_ready is not None:
            on_ready(bound_host, bound_port)

    announcing = asyncio.create_task(announce())
    try:
        await server.serve(sockets=None if sock is None else [sock])
    finally:
        announcing.cancel()


async def _serve_metrics_apart(built: Ingress, stop: asyncio.Event) -> asyncio.Task[None] | None:
    """Serve the observer on ``metrics_port`` until ``stop`` (None when it has no own port).

    The webhook app then no longer answers ``/metrics``, ``/healthz`` or ``/readyz``, so the
    webhook port can be public while metrics stay inside the cluster.

    Raises:
        OSError: the metrics port cannot be bound.
    """
    if built.ingress.metrics_port is None:
        return None
    built.app.observer = None
    listening = asyncio.Event()
    task = asyncio.create_task(
        serve_metrics(
            built.observer,
            built.ingress.metrics_host,
            built.ingress.metrics_port,
            stop,
            lambda _host, _port: listening.set(),
        )
    )
    waiting = asyncio.create_task(listening.wait())
    await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if task.done():
        task.result()  # raises why it could not listen
    return task

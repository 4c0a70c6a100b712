"""Run an App as a group member until SIGTERM or SIGINT, then shut down gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from pipeline.admission.fleet import FleetLimits
from pipeline.admission.throttle import Throttle
from pipeline.capacity.feed import CapacityFeed
from pipeline.config import Settings
from pipeline.errors import ConfigError, PipelineError, UnknownTopic
from pipeline.heap import freeze_startup, heap_trim, keep_trimmed
from pipeline.logstore.create import create_log_store
from pipeline.observability import stacks
from pipeline.observability.deletion_cost import DeletionCost, pod_from_environment
from pipeline.observability.server import MetricsServer, metrics_socket, serve_metrics
from pipeline.observability.wiring import MemberTelemetry, member_telemetry
from pipeline.reachability import safe_url
from pipeline.redis_channel import channel_of, open_channel
from pipeline.registry.client.http import RegistryClient
from pipeline.registry.client.serde import AvroDeserializer
from pipeline.retry.rename_long_keys import rename_long_parked
from pipeline.runtime.app import App, Lane
from pipeline.runtime.eviction import (
    holding_lanes,
    kept_only_in_redis,
    warn_if_evicting,
    warn_stranded,
)
from pipeline.runtime.member import Member
from pipeline.runtime.persistence import warn_if_not_persisting
from pipeline.runtime.progress import DeadLetterWarnings, ParkedKeysSource, Progress
from pipeline.runtime.state_loss import StateLostCounter, StateWatch, mark_present
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport
from pipeline.transport.protocol import Admin

MEMBER_CONNECTIONS = 100
"""Connections in the pool of a member's Redis client (redis-py's default pool size)."""


def load_app(target: str) -> App:
    """Import ``module:attribute`` (the current directory is importable) and return the App.

    Raises:
        ConfigError: ``target`` is no ``MODULE:APP``, its module cannot be imported (missing, or
            raising as it runs: the error's class and first line; a file path in its place gets
            the dotted module to type), or its attribute is missing or no App (the module's
            Apps are named). A pipeline error the module raises (an undeclared lane) is raised
            as it is.
    """
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"expected MODULE:APP, e.g. consumers.messages:app (got {target!r})")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    path_like = "/" in module_name or "\\" in module_name or module_name.startswith(".")
    if path_like:  # never importable: say so before trying
        raise ConfigError(_path_given(module_name, attribute))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if module_name.endswith(".py") and getattr(exc, "name", None) == module_name:
            raise ConfigError(_path_given(module_name, attribute)) from exc
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from exc
    except PipelineError:
        raise
    except Exception as exc:  # the module's own code failed: say what, in one line
        first = next(iter(str(exc).strip().splitlines()), "")
        reason = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        raise ConfigError(f"cannot import {module_name!r}: {reason}") from exc
    return _app_of(module, target)


def _app_of(module: ModuleType, target: str) -> App:
    """The App ``target``'s attribute names in ``module``; else an error naming its Apps."""
    module_name, _, attribute = target.partition(":")
    app = getattr(module, attribute, None)
    if isinstance(app, App):
        return app
    if hasattr(module, attribute):
        problem = f"{target!r} is not a pipeline App (got {type(app).__name__})"
    else:
        problem = f"module {module_name!r} has no attribute {attribute!r}"
    apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
    if not apps:
        raise ConfigError(f"{problem}, and it defines no pipeline App: name the module that does")
    label = "its App" if len(apps) == 1 else "its Apps"
    raise ConfigError(f"{problem}; {label}: " + ", ".join(f"`{module_name}:{a}`" for a in apps))


def _path_given(module_name: str, attribute: str) -> str:
    """The error for a file path given as MODULE (``consumers/messages.py``): the dotted form.

    A path under the current directory becomes its dotted module (the current directory is
    importable); any other is named by its file, to be run from its directory.
    """
    path = Path(module_name.replace("\\", "/").removesuffix(".py"))
    where = ""
    if path.is_absolute():
        try:
            path = path.relative_to(Path.cwd())
        except ValueError:
            path, where = Path(path.name), f" (run from {path.parent})"
    dotted = ".".join(part for part in path.parts if part not in {"", "."})
    return (
        f"cannot import {module_name!r}: MODULE:APP takes a dotted module, not a file path;"
        f" use `{dotted}:{attribute}`{where}"
    )


def _address(settings: Settings, transport: str) -> str:
    """Where the broker is, without a password, for the start line."""
    if transport == "kafka":
        return settings.kafka.bootstrap_servers
    url = urlsplit(settings.redis.url)
    return safe_url(url._replace(netloc=url.netloc.rsplit("@", 1)[-1]).geturl())


async def _ready_when_polling(member: Member, server: MetricsServer, stop: asyncio.Event) -> None:
    """``/readyz`` turns ready once the member is in its group and fetching, unready at ``stop``."""
    await member.polling.wait()
    if not stop.is_set():
        server.ready = True
    await stop.wait()
    server.ready = False


def _endpoint(
    server: MetricsServer, settings: Settings, listening: socket.socket | None
) -> tuple[asyncio.Task[None] | None, asyncio.Event]:
    """Serve ``server`` on ``listening`` (None: no metrics port) until the event returned is set.

    Set once the member has left, not at the stop signal: through the drain ``/healthz`` stays
    200, ``/readyz`` answers 503 and ``/metrics`` shows the drain.
    """
    left = asyncio.Event()
    port = settings.runtime.metrics_port
    if listening is None or port is None:
        return None, left
    serving = serve_metrics(server, settings.runtime.metrics_host, port, left, sock=listening)
    return asyncio.create_task(serving), left


async def _admission(
    redis: Redis, settings: Settings, lanes: Sequence[Lane]
) -> tuple[Throttle | None, FleetLimits | None]:
    """The started throttle when a lane is throttled, and the dynamic limits if enabled."""
    if not any(lane.spec.throttle for lane in lanes):
        return None, None
    throttle = Throttle.from_settings(redis, settings)
    await throttle.start()
    if not settings.throttle.dynamic.enabled:
        return throttle, None
    return throttle, FleetLimits.from_settings(redis, settings, throttle)


def _service_times(
    settings: Settings, specs: Sequence[TopicSpec], telemetry: MemberTelemetry
) -> tuple[CapacityFeed | None, MetricsServer | None]:
    """With capacity recording on, the member's handler times feed the lanes' service time.

    The service time is read from the member's registry at each refresh of its ``/metrics``
    sources. Without a metrics port nothing refreshes them: the recording then gets a refresher
    of its own, started here and returned to be closed, that refreshes only it, at the same
    interval.
    """
    if not settings.capacity.record:
        return None, None
    capacity = CapacityFeed(settings, specs)
    source = capacity.service_source(telemetry.metrics)
    if settings.runtime.metrics_port is not None:
        telemetry.server.sources.append(source)
        return capacity, None
    recorder = MetricsServer(
        telemetry.metrics, [source], interval_s=settings.runtime.metrics_interval_s
    )
    recorder.start()
    return capacity, recorder


def redis_client(settings: Settings) -> Redis:
    """The member's Redis client as ``pipeline consume`` configures it, without its channel.

    Its pool holds :data:`MEMBER_CONNECTIONS` connections, and a call finding them all taken
    waits for one, at most ``socket_timeout_s``, then fails with ``ConnectionError`` ("No
    connection available."), as a call Redis does not answer fails after it. redis-py's
    default pool refuses such a call at once ("Too many connections"), which the guard,
    parking, ``ctx.once``, debouncing and the throttle take for Redis down: without a function
    channel (TLS, a Unix socket) every call takes a connection, and 300 handlers of a lane with
    ``ctx.once`` started at once had 200 of them fail (dead-lettered, or run twice).
    """
    # One quick retry: admission, parking and debouncing fail open when Redis is down, so a
    # call must fail fast rather than hold a message through seconds of client backoff.
    timeout_s = settings.redis.socket_timeout_s
    pool = BlockingConnectionPool.from_url(
        settings.redis.url,
        max_connections=MEMBER_CONNECTIONS,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), 1),
    )
    return Redis.from_pool(pool)  # closing the client closes its pool


async def _last_look(watch: StateWatch | None) -> None:
    """One more look at the marker as the member ends because its topics are gone.

    An end caused by a Redis that lost its data (its topics gone under the member on Redis
    Streams) is said before the exit line; a look that fails says no more than any failed look
    (a refusal's one warning). Not made at other ends: with Redis out of reach a look takes up
    to twice its socket timeout, which a SIGTERM'd member's exit cannot spare.
    """
    if watch is not None:
        with contextlib.suppress(Exception):
            await watch.check()


async def _run_member(
    member: Member,
    stop: asyncio.Event,
    hurry: asyncio.Event,
    watch: StateWatch | None,
    reporting: asyncio.Task[None],
) -> int:
    """:meth:`Member.run`, then its abandoned runs; its topics gone, a last look first.

    The watch's own looks (in ``reporting``) end before it, so a loss is said once.
    """
    try:
        await member.run(stop, hurry)
    except UnknownTopic:
        reporting.cancel()
        await asyncio.wait({reporting})  # its look, if one was under way, ends first
        await _last_look(watch)
        raise
    return member.abandoned


async def _prepare_redis_state(
    redis: Redis, settings: Settings, group: str, lanes: list[Lane], admin: Callable[[], Admin]
) -> StateWatch | None:
    """Ready the Redis state of ``lanes`` before consuming, saying what it may lose.

    One line each for held followers and buffers Redis may evict, lose or no member releases.
    Also moves keys an earlier release parked under the long names of message keys over 768
    bytes to their current names (:mod:`pipeline.retry.rename_long_keys`), before consuming.

    Returns the started watch for a Redis that loses its data while the member runs, when
    ``lanes`` keep messages only there (:mod:`pipeline.runtime.state_loss`); ``admin`` makes the
    client that tells it whether the group consumed before, when the marker is missing at start.
    """
    url = settings.redis.url
    await warn_if_evicting(redis, url, lanes)
    await warn_if_not_persisting(redis, url, lanes)
    await warn_stranded(redis, settings.redis.key_prefix, lanes)
    await rename_long_parked(
        redis, settings.redis.key_prefix, [x.spec.lane for x in holding_lanes(lanes)]
    )
    if not kept_only_in_redis(lanes):  # nothing to watch; the marker still says "not lost"
        await mark_present(redis, url, settings.redis.key_prefix, group)
        return None
    watch = StateWatch(
        redis,
        url,
        settings.redis.key_prefix,
        group,
        lanes,
        marks_processed=settings.runtime.mark_processed,
        topics_in_redis=settings.transport == "redis",  # its streams use the same Redis URL
        admin=admin(),  # made only here: a Kafka admin client is threads and a connection
    )
    await watch.start()
    return watch


async def _report(
    progress: Progress,
    polling: asyncio.Event,
    stop: asyncio.Event,
    watch: StateWatch | None,
    telemetry: MemberTelemetry,
) -> None:
    """The start and progress lines until ``stop``; beside them, the watch of the member's Redis."""
    if watch is None:
        await progress.run(polling, stop)
        return
    watch.counter = StateLostCounter(telemetry.metrics, watch.group)
    await asyncio.gather(progress.run(polling, stop), watch.run(stop))


def _redis(settings: Settings) -> Redis:
    """The member's Redis client, with a function channel bound to it for the Lua calls."""
    redis = redis_client(settings)
    open_channel(redis)  # pipelined on a connection of its own (pipeline/redis_channel.py)
    return redis


async def _close_redis(redis: Redis) -> None:
    channel = channel_of(redis)
    if channel is not None:
        await channel.aclose()
    await redis.aclose()


def _serving_heap(member: Member, stop: asyncio.Event) -> asyncio.Task[int]:
    """The heap of a member about to serve: start-up objects frozen, trims started till ``stop``.

    The clients are built: full collections skip them from now on. Once a drain ends, the C
    heap it freed goes back to the system (:mod:`pipeline.heap`).
    """
    freeze_startup()

    def delivered() -> int:  # what the member did with messages: a count that moves as it works
        return sum(vars(member.stats).values())

    return asyncio.create_task(keep_trimmed(delivered, stop, heap_trim()))


def _stop_signals(loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Event, asyncio.Event]:
    """SIGTERM or SIGINT sets the first event (drain); another sets the second (stop now)."""
    stop, hurry = asyncio.Event(), asyncio.Event()

    def stopping() -> None:
        (hurry if stop.is_set() else stop).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping)
    return stop, hurry


def _require_log_database(settings: Settings) -> None:
    """Refuse to mark rows processed in an SQLite log database that does not exist.

    Opening it would create an empty one (and its directory), where a mistyped path would
    mark nothing for as long as the member runs; only ``pipeline ingress serve`` creates it.

    Raises:
        ConfigError: one line naming the path and both settings.
    """
    ingress = settings.ingress
    path = ingress.sqlite_path
    if settings.runtime.mark_processed and ingress.log_store == "sqlite" and not path.is_file():
        raise ConfigError(
            f"no log database at {path.absolute()} (PIPELINE_INGRESS__SQLITE_PATH), where "
            "PIPELINE_RUNTIME__MARK_PROCESSED=true marks handled rows: point it at the "
            "ingress's database (only `pipeline ingress serve` creates one; start it first) "
            "or turn marking off"
        )


async def serve(
    app: App, settings: Settings, group: str, *, lanes: Sequence[str] | None = None
) -> int:
    """Run one member of ``group``; SIGTERM or SIGINT starts a graceful shutdown.

    A second SIGTERM or SIGINT during it ends its grace at once: what still runs is cancelled
    and not committed (delivered again), what finished is committed, and the member leaves.

    Returns how many runs were left behind, still going: handlers that ignored their
    cancellation at shutdown (:attr:`Member.abandoned`). The event loop cannot close while they
    run, so the caller exits without waiting for them.
    """
    _require_log_database(settings)
    port = settings.runtime.metrics_port
    listening = (  # before anything is opened: a port it cannot have stops it in one line
        None
        if port is None
        else metrics_socket(
            settings.runtime.metrics_host,
            port,
            "PIPELINE_RUNTIME__METRICS_PORT",
            "PIPELINE_RUNTIME__METRICS_HOST",
        )
    )
    loop = asyncio.get_running_loop()
    stop, hurry = _stop_signals(loop)
    stacks.install(loop)  # kill -USR1: every thread's and task's stack on stderr
    transport = create_transport(settings)
    redis = _redis(settings)
    store = None
    if settings.runtime.mark_processed:
        store = create_log_store(settings, settings.ingress)
        await store.open()
    if app.avro is None:  # Avro values are read through the configured registry
        app.avro = AvroDeserializer(RegistryClient.from_settings(settings.registry))
    chosen = lanes or sorted(app.lanes)
    chosen_lanes = [app.lanes[name] for name in chosen if name in app.lanes]
    watch = await _prepare_redis_state(redis, settings, group, chosen_lanes, transport.admin)
    throttle, fleet = await _admission(redis, settings, chosen_lanes)
    specs = [lane.spec for lane in chosen_lanes]
    telemetry = member_telemetry(
        transport.admin(),
        specs,
        group,
        interval_s=settings.runtime.metrics_interval_s,
        redis=redis,
        redis_prefix=settings.redis.key_prefix,
    )
    capacity, recorder = _service_times(settings, specs, telemetry)
    dlqs = {lane.name: lane.spec.dead_letter for lane in chosen_lanes}
    runtime_metrics = DeadLetterWarnings(telemetry.metrics, dlqs)
    pod = pod_from_environment()  # in Kubernetes: long work protects this Pod from scale-in
    member = Member(
        app,
        transport,
        group,
        settings.runtime,
        lane_names=lanes,
        redis=redis,
        redis_prefix=settings.redis.key_prefix,
        instance=settings.membership.instance,  # its lane lease hold, taken over on a restart
        processed=store,
        throttle=throttle,
        metrics=runtime_metrics,
        turn_metrics=telemetry.debounce,
        admission_metrics=telemetry.admission,
        fleet=fleet,
        deletion_cost=DeletionCost(pod) if pod is not None else None,
    )
    telemetry.server.sources.append(ParkedKeysSource(member, runtime_metrics))
    endpoint, left = _endpoint(telemetry.server, settings, listening)
    ready = asyncio.create_task(_ready_when_polling(member, telemetry.server, stop))
    progress = Progress(
        group=group,
        lanes=[lane.name for lane in chosen_lanes],
        topics=[lane.spec.name for lane in chosen_lanes],
        transport=transport.name,
        address=_address(settings, transport.name),
        admin=transport.admin(),
        stats=member.stats,
        assignment=lambda: member.assignment,
    )
    reporting = asyncio.create_task(_report(progress, member.polling, stop, watch, telemetry))
    trimming = _serving_heap(member, stop)
    try:
        return await _run_member(member, stop, hurry, watch, reporting)
    finally:
        for task in (ready, reporting, trimming):
            task.cancel()
        stop.set()
        left.set()
        if endpoint is not None:
            await endpoint
        if throttle is not None:
            await throttle.close()
        for closing in (recorder, store, capacity):
            if closing is not None:
                await closing.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        stacks.remove(loop)
        await transport.close()
        await _close_redis(redis)

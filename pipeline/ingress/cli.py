"""Command line of the ingress: ``ingress serve``, and ``sweep``, ``replay``, ``purge``.

Two Typer apps: :data:`app` holds ``serve`` (registered as ``pipeline ingress``), and
:data:`ops_app` holds the operational commands that sit at the top level (``pipeline sweep``,
``pipeline replay``, ``pipeline purge``; merged with ``app.add_typer(ops_app)``, no name).
Settings come from the environment (``PIPELINE_*``, ``PIPELINE_INGRESS__*``). Errors print one
line to stderr and exit non-zero: 1 for a failed operation, 2 for bad input or configuration.

The service, the log stores, the transports and the settings are imported when a command runs,
not when ``pipeline`` registers the commands.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipeline import tracing
from pipeline.cli_support import (
    HELP_MARKUP,
    TransportOpt,
    err,
    require_window,
    run_command,
    until_stopped,
    utc_time,
)
from pipeline.errors import BrokerUnavailable, ConfigError
from pipeline.log_repeats import logging_from_environment
from pipeline.logstore import LogStore, RowState, Selection
from pipeline.startup import start_standalone
from pipeline.transport import create_transport

if TYPE_CHECKING:
    from pipeline.config import IngressSettings, Settings
    from pipeline.ingress.replay import ReplaySummary
    from pipeline.ingress.service import Ingress
    from pipeline.ingress.sweeper import Sweeper
    from pipeline.ingress.workers import WorkerArgs

T = TypeVar("T")

app = typer.Typer(help="Webhook ingress.", no_args_is_help=True, pretty_exceptions_enable=False)
ops_app = typer.Typer(help="Ingress log operations.", pretty_exceptions_enable=False)
out = Console(soft_wrap=True, emoji=False)

_MAX_PORT = 65_535
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*s)?\s*$")


def _ingress_from_environment() -> IngressSettings:
    """``PIPELINE_INGRESS__*`` read on their own, for root settings without an ``ingress``."""
    from pydantic import Field  # noqa: PLC0415 - see the module doc
    from pydantic_settings import BaseSettings, SettingsConfigDict  # noqa: PLC0415

    from pipeline.config import ENV_PREFIX, IngressSettings  # noqa: PLC0415

    class _IngressEnv(BaseSettings):
        """Reads ``PIPELINE_INGRESS__*`` until the root settings carry an ``ingress`` section."""

        model_config = SettingsConfigDict(
            env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="ignore"
        )
        ingress: IngressSettings = Field(default_factory=IngressSettings)

    return _IngressEnv().ingress


def _settings(transport: str | None) -> tuple[Settings, IngressSettings]:
    from pipeline.config import IngressSettings, load_settings  # noqa: PLC0415 - see module doc

    settings = load_settings(**({"transport": transport} if transport else {}))
    tracing.use_system(settings.transport)
    ingress = getattr(settings, "ingress", None)
    if not isinstance(ingress, IngressSettings):
        try:
            ingress = _ingress_from_environment()
        except ValueError as exc:
            raise ConfigError(f"invalid PIPELINE_INGRESS__* settings: {exc}") from None
    return settings, ingress


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop (see :func:`pipeline.cli_support.run_command`)."""
    import uvloop  # noqa: PLC0415 - see the module doc

    return run_command(coro, loop_factory=uvloop.new_event_loop)


def worker_settings(
    transport: str | None, sources: Path | None
) -> tuple[Settings, IngressSettings]:
    """The settings ``ingress serve`` runs with: the environment, then ``--sources``."""
    settings, ingress = _settings(transport)
    if sources is not None:
        ingress = ingress.model_copy(update={"sources_file": sources})
    return settings, ingress


def _ready(bound_host: str, bound_port: int) -> None:
    print(f"ingress listening on http://{bound_host}:{bound_port}", flush=True)  # noqa: T201


@app.command("serve")
def serve_command(
    host: Annotated[str | None, typer.Option(help="Bind address (default: settings).")] = None,
    port: Annotated[int | None, typer.Option(help="Port; 0 picks a free one.")] = None,
    sources: Annotated[Path | None, typer.Option(help="Sources file (default: settings).")] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=1, help="Processes on the port (SO_REUSEPORT); above 1 needs the PostgreSQL log."
        ),
    ] = 1,
    transport: TransportOpt = None,
) -> None:
    """Serve POST /hooks/{source} (and Meta's GET handshake) until interrupted."""
    if workers > 1:
        raise typer.Exit(serve_workers(workers, host, port, sources, transport))
    from pipeline.ingress.service import build_ingress, serve  # noqa: PLC0415 - see module doc

    async def main() -> None:
        _check_host_option(host)
        _check_port_option(port)
        settings, ingress = worker_settings(transport, sources)
        built = build_ingress(settings, ingress)
        await _check_before_serving(settings, built)
        await serve(built, host or ingress.host, ingress.port if port is None else port, _ready)

    _run(main())


def _check_host_option(host: str | None) -> None:
    """Refuse a ``--host`` that is not UTF-8 text: no address or name of this machine is."""
    if host is None:
        return
    try:
        host.encode()
    except UnicodeEncodeError:  # argv bytes that are not UTF-8 come as lone surrogates
        typed = host.encode(errors="surrogateescape").decode(errors="backslashreplace")
        raise ConfigError(
            f"--host '{typed}' is not UTF-8 text, so it is no address or name of this machine;"
            " give one of its addresses (127.0.0.1, or 0.0.0.0 for all) or its name"
        ) from None


def _check_port_option(port: int | None) -> None:
    """Refuse a ``--port`` no socket can have (one line naming it), as the setting is refused."""
    if port is not None and not 0 <= port <= _MAX_PORT:
        raise ConfigError(f"--port: expected 0 to {_MAX_PORT} (0 picks a free port), got {port}")


def serve_workers(
    count: int, host: str | None, port: int | None, sources: Path | None, transport: str | None
) -> int:
    """Check everything a worker would refuse, hold the port, then supervise ``count`` workers.

    The checks are a single ingress's: settings, sources and ports (exit 2), then the log
    database and the topics' limits (:meth:`~pipeline.ingress.service.Ingress.preflight`), each
    failure one line from this process before any worker starts.
    """
    from pipeline.ingress.service import (  # noqa: PLC0415 - see the module doc
        PORT_VARIABLE,
        build_ingress,
        require_free_port,
    )
    from pipeline.ingress.workers import (  # noqa: PLC0415
        Supervisor,
        WorkerArgs,
        refuse_sqlite,
        reuse_port_socket,
    )

    async def check() -> WorkerArgs:
        _check_host_option(host)
        _check_port_option(port)
        settings, ingress = worker_settings(transport, sources)
        refuse_sqlite(count, ingress.log_store)
        built = build_ingress(settings, ingress)  # topics and sources, as each worker reads them
        # Without SO_REUSEPORT, so that workers of another command on this port also count.
        require_free_port(
            host or ingress.host, ingress.port if port is None else port, PORT_VARIABLE
        )
        if ingress.metrics_port:
            for index in range(count):
                require_free_port(
                    ingress.metrics_host,
                    ingress.metrics_port + index,
                    f"PIPELINE_INGRESS__METRICS_PORT (worker {index} uses it plus {index})",
                    host_variable="PIPELINE_INGRESS__METRICS_HOST",
                )
        await _check_before_serving(settings, built)
        await built.preflight()  # the log database, the topics' limits: before any worker
        return WorkerArgs(
            host or ingress.host,
            ingress.port if port is None else port,
            sources,
            transport,
            *logging_from_environment(),
            limits_checked=built.limits_checked,
        )

    args = _run(check())
    try:
        held = reuse_port_socket(args.host, args.port)
    except ConfigError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    with held:
        bound_port = held.getsockname()[1]
        supervisor = Supervisor(count, replace(args, port=bound_port), _ready)
        return supervisor.run()


@ops_app.command("sweep")
def sweep_command(
    loop: Annotated[bool, typer.Option("--loop", help="Keep sweeping every interval.")] = False,
    transport: TransportOpt = None,
) -> None:
    """Produce rows the queue lost, replay unprocessed ones, abandon those past the limit.

    One sweep needs the log database to exist and the broker to answer, or it stops first with
    one line. ``--loop`` runs beside the ingress as its sweeper does: it may start first (and
    create the database), and a broker that is down only fails its sweeps until it is back.
    """
    from pipeline.ingress.service import build_sweeper  # noqa: PLC0415 - see the module doc
    from pipeline.logstore.create import create_log_store  # noqa: PLC0415
    from pipeline.offload.writer import with_offload  # noqa: PLC0415
    from pipeline.topics.spec import load_specs  # noqa: PLC0415

    async def main() -> None:
        settings, ingress = _settings(transport)
        specs = load_specs(settings.topics_dir, settings.max_message_bytes)
        if not loop:
            _require_log_database(ingress)
            await _reach_broker(settings)  # in seconds, one line, before any row is claimed
        store = create_log_store(settings, ingress)
        broker = create_transport(settings)
        await store.open()
        producer = with_offload(
            broker.producer(), settings.topics_dir, settings.max_message_bytes
        )  # refs kept young
        sweeper = build_sweeper(  # asks the debouncer which rows' events wait their turn
            store, producer, broker.admin(), specs, ingress, redis=settings.redis
        )
        try:
            if loop:
                await _sweep_forever(sweeper, ingress)
            report = await sweeper.sweep_once()
            out.print(
                f"produced {report.produced}, replayed {report.replayed}, "
                f"abandoned {report.abandoned}, failed {report.failed}; patient lanes: "
                f"{', '.join(report.patient_lanes) or 'none'}",
                highlight=False,
            )
            if report.failed:
                raise typer.Exit(1)
        finally:
            await sweeper.close()
            await producer.close()
            await store.close()
            await broker.close()

    _run(main())


def _require_log_database(ingress: IngressSettings) -> None:
    """Refuse an SQLite log database that does not exist: only ``ingress serve`` creates one.

    An operator command given a mistyped path would otherwise create an empty database and its
    directory, then report nothing to do.
    """
    path = ingress.sqlite_path
    if ingress.log_store == "sqlite" and not path.is_file():
        raise ConfigError(
            f"no log database at {path.absolute()} (PIPELINE_INGRESS__SQLITE_PATH): point it at "
            "the ingress's database; only `pipeline ingress serve` creates one"
        )


async def _reach_broker(settings: Settings) -> None:
    """Raise BrokerUnavailable (one line: the broker, its address, the fix) unless it answers."""
    # pipeline.cli registers these commands: imported here, when the command runs.
    from pipeline.cli.status_checks import reach_broker  # noqa: PLC0415

    await reach_broker(settings)


async def _check_before_serving(settings: Settings, built: Ingress) -> None:
    """What ``ingress serve`` checks before it serves, with or without workers.

    The lanes' payload stores take their credentials (exit 2 now, not a 503 per payload), and
    the broker does not refuse the login (:func:`refuse_a_refused_login`); a broker that does
    not answer has its bound waited out once: its topic limits are not asked again
    (:meth:`~pipeline.ingress.service.Ingress.broker_down`).
    """
    from pipeline.offload.writer import check_lane_stores  # noqa: PLC0415 - see the module doc

    await check_lane_stores(built.specs)
    down = await refuse_a_refused_login(settings)
    if down is not None:
        built.broker_down(str(down))


async def refuse_a_refused_login(settings: Settings) -> BrokerUnavailable | None:
    """Stop the start (ConfigError: exit 2) when the broker refuses this ingress's login or TLS.

    The broker is asked once, within the status probe's bound. One that does not answer is no
    reason to stop: the ingress serves into its durable log and the sweeper produces once it
    answers. A refused password does not heal by waiting: the ingress would accept webhooks it
    never produces. The line names the service, its address (password hidden) and the setting.

    Returns:
        The probe's error when the broker did not answer (the start asks it nothing more, see
        :meth:`~pipeline.ingress.service.Ingress.broker_down`), None when it answered.
    """
    from pipeline.cli.status_checks import BrokerRefused  # noqa: PLC0415 - see _reach_broker

    try:
        await _reach_broker(settings)
    except BrokerRefused as exc:  # a Redis's refusal, in its answer: found by the probe
        raise ConfigError(str(exc)) from None
    except BrokerUnavailable as exc:
        # A Kafka broker's refused login is asked of it (up to 3 s).
        line = None if exc.diagnose is None else await asyncio.to_thread(exc.diagnose)
        if line is not None:
            raise ConfigError(line) from None
        return exc
    return None


async def _sweep_forever(sweeper: Sweeper, ingress: IngressSettings) -> None:
    """Sweep every interval until the process is stopped.

    With ``PIPELINE_INGRESS__METRICS_PORT`` set, ``/metrics`` is served with the sweeper's
    heartbeat, so that ``PipelineSweeperSilent`` sees a sweeper that runs on its own.
    """
    from pipeline.ingress.service import require_free_port  # noqa: PLC0415 - see module doc
    from pipeline.observability.metrics import Metrics  # noqa: PLC0415
    from pipeline.observability.server import MetricsServer, serve_metrics  # noqa: PLC0415
    from pipeline.observability.wiring import sweeper_heartbeat  # noqa: PLC0415

    stop = asyncio.Event()
    serving = None
    port = ingress.metrics_port
    if port is not None:
        require_free_port(
            ingress.metrics_host,
            port,
            "PIPELINE_INGRESS__METRICS_PORT",
            host_variable="PIPELINE_INGRESS__METRICS_HOST",
        )
        server = MetricsServer(Metrics(), interval_s=ingress.metrics_interval_s)
        sweeper.on_sweep = sweeper_heartbeat(server.metrics)
        server.ready = True
        serving = asyncio.create_task(serve_metrics(server, ingress.metrics_host, port, stop))
    try:
        await sweeper.run(stop)
    finally:
        stop.set()
        if serving is not None:
            await serving


def _when(value: str | None, option: str, *, now_ms: int | None = None) -> int | None:
    """Milliseconds since the epoch from ISO 8601 or a duration ago (``2h``, ``7d``).

    A duration counts back from ``now_ms`` (default: now). An ISO time must say its zone
    (``Z``, ``+02:00``): one without is refused, as ``pipeline redrive`` refuses it, rather than
    read as UTC or as this machine's local time.
    """
    if value is None:
        return None
    from pipeline.topics.spec import parse_duration_ms  # noqa: PLC0415 - see the module doc

    try:
        return _ago_ms(parse_duration_ms(value), now_ms=now_ms)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(
            f"{option}: expected ISO 8601 (2026-11-29T10:00:00Z) or a duration ago (2h), "
            f"got {value!r}"
        ) from None
    if moment.tzinfo is None:
        raise ConfigError(
            f"{option}: give the time zone, e.g. {moment.isoformat()}+00:00 for UTC (got {value!r})"
        )
    return int(moment.timestamp() * 1000)


def _states(state: list[RowState] | None, *, include_processed: bool) -> tuple[RowState, ...]:
    """The ``--state`` options; without any, every state but processed (unless included)."""
    if state:
        return tuple(state)
    if include_processed:
        return ()
    return tuple(s for s in RowState if s is not RowState.PROCESSED)


def _window(since: str | None, until: str | None) -> tuple[int | None, int | None]:
    """``--since`` and ``--until`` in ms since the epoch, ages counted back from one instant.

    Raises:
        ConfigError: either is no time, or the window selects nothing (``--since 1h --until
            2h``, a ``--since`` after now): the line of :func:`require_window`, exit 2 before
            any row is read.
    """
    now_ms = _now_ms()
    since_ms = _when(since, "--since", now_ms=now_ms)
    until_ms = _when(until, "--until", now_ms=now_ms)
    try:
        require_window(since, until, since_ms, until_ms, now_ms)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return since_ms, until_ms


def _ago_ms(duration_ms: int, *, now_ms: int | None = None) -> int:
    """The time ``duration_ms`` before ``now_ms`` (default: now) in ms since the epoch.

    An age reaching past 1970 is 1970: no row is older than that, and a store's integer column
    cannot take what lies far before it.
    """
    if now_ms is None:
        now_ms = _now_ms()
    return max(0, now_ms - duration_ms)


def _now_ms() -> int:
    """Now in ms since the epoch."""
    return int(datetime.now(UTC).timestamp() * 1000)


def _rate(value: str | None) -> float | None:
    if value is None:
        return None
    match = _RATE.match(value)
    if match is None or float(match[1]) <= 0:
        raise ConfigError(f"--rate: expected a positive rate such as 100/s, got {value!r}")
    return float(match[1])


def _stored_text(value: str, option: str) -> str:
    """``value`` if a log row can hold it; else ConfigError naming ``option`` (exit 2).

    The log keeps sources, tenants and row ids as UTF-8 text (the ingress refuses a request
    whose tenant is not). Command-line bytes that are not UTF-8 come as lone surrogates
    (``surrogateescape``): no row could match them, and the database driver would fail on them.
    """
    try:
        value.encode()
    except UnicodeEncodeError:
        typed = value.encode(errors="surrogateescape").decode(errors="backslashreplace")
        raise ConfigError(
            f"{option} '{typed}' is not UTF-8 text, which every row of the log holds, so no row"
            " could match it; type it in UTF-8 (check the terminal's locale)"
        ) from None
    return value


def _memory_ms(value: str) -> int:
    """``--idempotency-memory`` in milliseconds (ConfigError naming the option otherwise)."""
    from pipeline.topics.spec import parse_duration_ms  # noqa: PLC0415 - see the module doc

    try:
        return parse_duration_ms(value)
    except ValueError as exc:
        raise ConfigError(f"--idempotency-memory: {exc}") from None


@ops_app.command("replay")
def replay_command(
    source: Annotated[str | None, typer.Option(help="Only this source.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant.")] = None,
    since: Annotated[
        str | None, typer.Option(help="Received at/after (ISO 8601 with a zone, or 2h).")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Received before (ISO 8601 with a zone, or 2h).")
    ] = None,
    state: Annotated[list[RowState] | None, typer.Option(help="Only rows in this state.")] = None,
    row_id: Annotated[list[str] | None, typer.Option("--id", help="Only this row id.")] = None,
    rate: Annotated[str | None, typer.Option(help="Most rows per second, e.g. 100/s.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count only.")] = False,
    include_processed: Annotated[
        bool,
        typer.Option("--include-processed", help="Without --state, replay processed rows too."),
    ] = False,
    memory: Annotated[
        str,
        typer.Option(
            "--idempotency-memory",
            help="How long consumers remember event ids (ctx.once); older rows need --force.",
        ),
    ] = "14d",
    force: Annotated[
        bool, typer.Option("--force", help="Replay rows older than the idempotency memory.")
    ] = False,
    transport: TransportOpt = None,
) -> None:
    """Produce the selected log rows again, with their original key and event id.

    Without ``--state``, rows already processed are skipped (``--include-processed`` takes them
    too). Rows received longer ago than the consumers' idempotency memory would run their side
    effects again: they are refused unless ``--force`` is given.
    """
    from pipeline.cli_progress import progress  # noqa: PLC0415 - see the module doc
    from pipeline.ingress.replay import replay  # noqa: PLC0415
    from pipeline.logstore.create import create_log_store  # noqa: PLC0415
    from pipeline.offload.writer import with_offload  # noqa: PLC0415

    again = _Again("the same command replays its selection again")

    async def main() -> ReplaySummary:
        nonlocal again
        settings, ingress = _settings(transport)
        since_ms, until_ms = _window(since, until)
        selection = Selection(
            source=None if source is None else _stored_text(source, "--source"),
            tenant=None if tenant is None else _stored_text(tenant, "--tenant"),
            since_ms=since_ms,
            until_ms=until_ms,
            states=_states(state, include_processed=include_processed),
            ids=tuple(_stored_text(each, "--id") for each in row_id or ()),
        )
        per_s = _rate(rate)
        forgotten_ms = _ago_ms(_memory_ms(memory))
        again = _Again.of(selection, since=since, until=until)
        if not dry_run and again.window:  # kept in the job's log should it be killed (-9)
            err.print(f"replaying rows received {again.window}", highlight=False)
        _require_log_database(ingress)
        if not dry_run:
            await _reach_broker(settings)  # in seconds, one line, before any row is read
        store = create_log_store(settings, ingress)
        await store.open()
        try:
            await _refuse_forgotten(store, selection, forgotten_ms, memory, force=force or dry_run)
        except ConfigError:
            await store.close()
            raise
        broker = None if dry_run else create_transport(settings)
        producer = (  # a row's reference is kept young enough for the payload purge
            with_offload(broker.producer(), settings.topics_dir, settings.max_message_bytes)
            if broker is not None
            else None
        )
        handled = total = 0
        try:
            total = sum((await store.count_by_state(selection)).values())
            with progress("replay", total, console=err, disable=dry_run or not total) as bar:

                def advance(n: int) -> None:
                    nonlocal handled
                    handled += n
                    bar(n)

                return await until_stopped(
                    replay(
                        store,
                        producer,
                        selection,
                        rate_per_s=per_s,
                        dry_run=dry_run,
                        progress=advance,
                    ),
                    lambda by: (
                        f"replay stopped by {by} after {handled} of {total} rows; {again.text};"
                        " consumers drop repeats by event id"
                    ),
                )
        finally:
            if producer is not None:
                await producer.close()
            if broker is not None:
                await broker.close()
            await store.close()

    summary = _run(main())
    _print_summary(summary)
    if summary.failed or summary.stopped is not None:
        _say_failures(summary, again)
        raise typer.Exit(1)


def _say_failures(summary: ReplaySummary, again: _Again) -> None:
    """One line per topic and error of the rows not replayed, then how to replay them."""
    stopped = None if summary.stopped is None else type(summary.stopped).__name__
    for (topic, error), (count, text) in sorted(summary.failures.items()):
        if error != stopped:  # the last line says it
            err.print(
                f"[red]error:[/red] {count} rows to {escape(topic)} failed: {error}:"
                f" {escape(text)}",
                highlight=False,
            )
    if summary.stopped is not None:
        err.print(
            f"[red]error:[/red] replay stopped after {summary.handled} of {summary.total} rows:"
            f" {escape(str(summary.stopped))}; the rest were not attempted; once the broker is"
            f" back, {escape(again.text)}",
            highlight=False,
        )
    else:
        err.print(
            f"[red]error:[/red] {sum(summary.failed.values())} of {summary.total} rows were not"
            f" replayed (above); once they can be, {escape(again.text)}",
            highlight=False,
        )


@dataclass(frozen=True, slots=True)
class _Again:
    """How to replay a selection again: the same command, or its ages as the times they meant.

    An age (``--since 2h``) resolves against the clock of each run, so the same command run
    again later selects another window, without the rows that have aged out of it since: those
    a stopped replay had not reached yet would be passed over without a word.
    """

    text: str
    window: str = ""  # "since ... until ..." when an age was given, else empty

    @classmethod
    def of(cls, selection: Selection, *, since: str | None, until: str | None) -> _Again:
        """The hint for ``selection``, which ``since`` and ``until`` (as typed) resolved to."""
        pinned = [
            (option, typed, ms)
            for option, typed, ms in (
                ("--since", since, selection.since_ms),
                ("--until", until, selection.until_ms),
            )
            if typed is not None and ms is not None and _is_age(typed)
        ]
        if not pinned:
            return cls("the same command replays its selection again")
        options = " ".join(f"{option} {utc_time(ms)}" for option, _, ms in pinned)
        meant = ", ".join(f"{option} {typed}" for option, typed, _ in pinned)
        window = " ".join(
            f"{word} {utc_time(ms)}"
            for word, ms in (("since", selection.since_ms), ("before", selection.until_ms))
            if ms is not None
        )
        return cls(
            f"run it again with {options} (what {meant} meant when it began) to replay its"
            " selection again: the same command would select a later window, passing over the"
            " rows that aged out of it",
            window,
        )


def _is_age(value: str) -> bool:
    """Whether ``value`` is a duration ago (``2h``), not a time."""
    from pipeline.topics.spec import parse_duration_ms  # noqa: PLC0415 - see the module doc

    try:
        parse_duration_ms(value)
    except ValueError:
        return False
    return True


async def _refuse_forgotten(
    store: LogStore, selection: Selection, forgotten_ms: int, memory: str, *, force: bool
) -> None:
    """Refuse (or, forced, warn about) rows older than the consumers' idempotency memory."""
    until_ms = forgotten_ms if selection.until_ms is None else min(selection.until_ms, forgotten_ms)
    old = sum((await store.count_by_state(replace(selection, until_ms=until_ms))).values())
    if not old:
        return
    what = (
        f"{old} selected rows were received more than {memory} ago, beyond the consumers' "
        "idempotency memory: their side effects would run again"
    )
    if not force:
        raise ConfigError(f"{what}; narrow --since, or pass --force to replay them anyway")
    err.print(f"[yellow]warning:[/yellow] {what}", highlight=False)


def _print_summary(summary: ReplaySummary) -> None:
    table = Table(title="dry run: rows matched" if summary.dry_run else "replay")
    table.add_column("state")
    table.add_column("rows", justify="right")
    for state in RowState:
        if summary.matched.get(state):
            table.add_row(str(state), str(summary.matched[state]))
    table.add_row("total", str(summary.total), style="bold")
    out.print(table)
    if not summary.dry_run:
        topics = ", ".join(f"{t}: {n}" for t, n in sorted(summary.by_topic.items())) or "none"
        failed = ", ".join(f"{e}: {n}" for e, n in summary.failed.most_common()) or "none"
        out.print(f"replayed {summary.replayed} ({topics}); failed: {failed}", highlight=False)


@ops_app.command("purge")
def purge_command(
    older_than: Annotated[
        str, typer.Option(help="Received before this: an age (30d) or ISO 8601 with a zone.")
    ] = "30d",
    state: Annotated[
        list[RowState] | None, typer.Option(help="States to purge (default: processed, abandoned).")
    ] = None,
) -> None:
    """Delete old log rows that are finished (retention)."""
    from pipeline.logstore.create import create_log_store  # noqa: PLC0415 - see the module doc

    async def main() -> int:
        settings, ingress = _settings(None)
        chosen = set(state or (RowState.PROCESSED, RowState.ABANDONED))
        unfinished = chosen - {RowState.PROCESSED, RowState.ABANDONED}
        if unfinished:
            err.print(
                f"[yellow]warning:[/yellow] purging {', '.join(sorted(unfinished))} rows deletes "
                "events that may never have been handled",
                highlight=False,
            )
        cutoff = _when(older_than, "--older-than")
        if cutoff is None:  # pragma: no cover - older_than always has a value
            raise ConfigError("--older-than is required")
        _require_log_database(ingress)
        store = create_log_store(settings, ingress)
        await store.open()
        try:
            return await store.purge(cutoff, chosen)
        finally:
            await store.close()

    deleted = _run(main())
    out.print(f"purged {deleted} rows", highlight=False)


def main() -> None:  # pragma: no cover - for `python -m pipeline.ingress.cli`
    """Run the ingress commands on their own (before they are registered in pipeline.cli).

    Logging first, as ``pipeline``'s, so a refused raise of the open-file limit is a formatted
    line, logged by the long-running commands only (``ingress serve``, ``sweep --loop``).
    """
    start_standalone(sys.argv[1:])
    tracing.configure(os.environ, service="pipeline-ingress")
    root = typer.Typer(
        no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=HELP_MARKUP
    )
    root.add_typer(app, name="ingress")
    root.add_typer(ops_app)
    root(sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    main()

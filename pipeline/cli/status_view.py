"""``pipeline status [--json] [--group G]``: one screen with a line per lane and group.

Lanes come from ``topics/*.yaml``; the group of each lane from ``--group`` (every lane), else
``PIPELINE_INGRESS__SWEEPER__LANE_GROUPS``, else a group named after the lane. A group the broker
does not have shows no figures (its lag would count every message held) but a line saying so,
with the groups that read the lane (:mod:`pipeline.cli.status_groups`). The ingress log is
read when it is configured and reachable (SQLite: only when its file exists, so a status never
creates one).

What the report reads (the log store, the transports, the throttles) is imported when
:func:`gather` runs, not when the command is registered.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from pipeline.cli_support import TransportOpt, run_command
from pipeline.errors import ConfigError, PipelineError
from pipeline.transport import create_transport

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from redis.asyncio import Redis

    from pipeline.cli.status import LaneStatus, Status
    from pipeline.config import Settings
    from pipeline.logstore import LogStore
    from pipeline.observability.lanes import LaneWatch
    from pipeline.topics.spec import TopicSpec

__all__ = ["gather", "render", "status_command"]

_PIPE_WIDTH = 200


def _age(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    if seconds < 60:  # noqa: PLR2004 - one minute
        return f"{seconds:.1f}s"
    if seconds < 3600:  # noqa: PLR2004 - one hour
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _oldest(lane: LaneStatus) -> str:
    """The lane's oldest age, red past the paging threshold; marked on a lane of long work."""
    age_s = lane.report.oldest_age_s
    if lane.long_work and age_s > 0:
        return f"{_age(age_s)}*"  # likely a run in progress: alerts.yaml leaves it out too
    if age_s >= 600:  # noqa: PLR2004 - the paging threshold of alerts.yaml
        return f"[red]{_age(age_s)}[/red]"
    return _age(age_s)


def _row(lane: LaneStatus) -> tuple[Text | str, ...]:
    """One lane's cells; names and tenants as they are: rich would read [..] and :..: in them."""
    r = lane.report
    if lane.error:
        return Text(r.lane), Text(r.group), Text(lane.error, "red"), "", "", "", ""
    dead = f"[red]{r.dead_letters}[/red]" if r.dead_letters else "0"
    if lane.no_group:  # its lag would count every message held: no figures but the DLQ's
        return Text(r.lane), Text(r.group), Text("no such group", "yellow"), "-", "-", dead, "-"
    tiers = " ".join(f"{tier}:{depth}" for tier, depth in r.retry_tiers.items()) or "-"
    throttled = ", ".join(f"{t} ({n})" for t, n in lane.throttled) or "-"
    return (
        Text(r.lane),
        Text(r.group),
        str(r.lag),
        _oldest(lane),
        Text(tiers),
        dead,
        Text(throttled),
    )


def _print_no_groups(status: Status, console: Console) -> None:
    """A line for each lane read for a group that does not exist: why no figures, who reads it."""
    for lane in status.lanes:
        if lane.no_group and not lane.error:
            console.print(
                f"[yellow]lane {escape(lane.report.lane)}:[/yellow] {escape(lane.no_group_line())}",
                highlight=False,
                emoji=False,
                soft_wrap=True,
            )


def render(status: Status, console: Console) -> None:
    """Print ``status`` as tables: lanes first, then the ingress log."""
    from pipeline.cancel.status import render_counts  # noqa: PLC0415 - see the module doc

    table = Table(title=f"pipeline status ({status.transport})")
    for column in ("lane", "group", "lag", "oldest", "retry tiers", "DLQ"):
        table.add_column(column, justify="left" if column in {"lane", "group"} else "right")
    table.add_column("throttled tenants")
    for lane in status.lanes:
        table.add_row(*_row(lane))
    console.print(table)
    _print_no_groups(status, console)
    if any(lane.long_work and lane.report.oldest_age_s > 0 for lane in status.lanes):
        console.print(
            "* a lane of long work: its oldest is usually a run still going, not a wait "
            "(a hung run counts in pipeline_hung_handlers_total)",
            highlight=False,
            soft_wrap=True,
        )
    missing = sorted({t for lane in status.lanes for t in lane.report.missing_topics})
    if missing:
        console.print(
            "[yellow]missing topics[/yellow] (run `pipeline topics apply`): "
            f"{escape(', '.join(missing))}",
            highlight=False,
            emoji=False,
            soft_wrap=True,
        )
    if status.log is not None:
        log = status.log
        rows = ", ".join(f"{state} {count}" for state, count in sorted(log.rows.items())) or "none"
        rows = escape(rows)
        abandoned = f"[red]{log.abandoned}[/red]" if log.abandoned else "0"
        console.print(
            f"ingress log: {rows}; abandoned {abandoned}; oldest unproduced "
            f"{_age(log.oldest_unproduced_age_s)}, oldest unprocessed "
            f"{_age(log.oldest_unprocessed_age_s)}",
            highlight=False,
            soft_wrap=True,
        )
    elif status.log_error:
        console.print(
            f"ingress log: [yellow]unavailable[/yellow] ({escape(status.log_error)})",
            highlight=False,
            emoji=False,
            soft_wrap=True,
        )
    if status.cancellations_error:
        console.print(
            "cancelled / hung: [yellow]unavailable[/yellow] "
            f"({escape(status.cancellations_error)})",
            highlight=False,
            emoji=False,
            soft_wrap=True,
        )
    else:
        render_counts(status.cancellations, console)
    if status.throttle_error:
        console.print(
            f"throttled tenants: [yellow]unavailable[/yellow] ({escape(status.throttle_error)})",
            highlight=False,
            emoji=False,
            soft_wrap=True,
        )


def _log_store(settings: Settings) -> LogStore | None:
    from pipeline.logstore.create import create_log_store  # noqa: PLC0415 - see the module doc

    ingress = settings.ingress
    if ingress.log_store == "sqlite" and not ingress.sqlite_path.exists():
        return None
    return create_log_store(settings, ingress)


async def gather(settings: Settings, groups: list[str], *, with_log: bool = True) -> Status:
    """Collect the status the settings describe (what the command prints).

    Raises:
        BrokerUnavailable: the broker did not answer within
            :data:`~pipeline.cli.status_checks.PROBE_TIMEOUT_MS`; the message names its
            address and variable. An unreachable Redis on Kafka only leaves the throttles out.
    """
    from redis.asyncio import Redis  # noqa: PLC0415 - see the module doc

    from pipeline.admission.view import ThrottledTenants  # noqa: PLC0415
    from pipeline.cancel.status import read_counts  # noqa: PLC0415
    from pipeline.cli.status import collect_status  # noqa: PLC0415
    from pipeline.cli.status_checks import reach_broker, reach_redis  # noqa: PLC0415
    from pipeline.topics.spec import load_specs  # noqa: PLC0415

    specs = load_specs(settings.topics_dir, settings.max_message_bytes)
    watches = _watches(settings, specs, groups)
    await reach_broker(settings)
    transport = create_transport(settings)
    store = _log_store(settings) if with_log else None
    log_error = ""
    if store is not None:
        try:
            await store.open()
        except PipelineError as exc:
            store, log_error = None, str(exc)
    redis = Redis.from_url(
        settings.redis.url,
        socket_timeout=settings.redis.socket_timeout_s,
        socket_connect_timeout=settings.redis.socket_timeout_s,
    )
    throttles: ThrottledTenants | None = None
    throttle_error = ""
    try:
        if any(spec.throttle for spec in specs):
            try:
                await reach_redis(settings, redis)
            except PipelineError as exc:
                throttle_error = str(exc)
            else:
                throttles = ThrottledTenants(
                    redis,
                    specs,
                    prefix=settings.redis.key_prefix,
                    namespace=settings.throttle.namespace,
                    default_limit=settings.throttle.default_limit,
                )
        status = await collect_status(
            transport.name, transport.admin(), watches, store=store, throttles=throttles
        )
        long_work = {spec.lane for spec in specs if spec.heartbeat_timeout_ms}
        absent = await _missing_groups(settings, redis, watches)
        status = replace(status, lanes=tuple(_marked(s, long_work, absent) for s in status.lanes))
        counts = await read_counts(redis, settings.redis.key_prefix)
        status = replace(status, cancellations=counts)
        if counts is None:  # why, and where: the one line of an unreachable Redis
            try:
                await reach_redis(settings, redis)
            except PipelineError as exc:
                status = replace(status, cancellations_error=str(exc))
            else:
                status = replace(status, cancellations_error="Redis failed the read; try again")
    finally:
        if store is not None:
            await store.close()
        await transport.close()
        await redis.aclose()
    return replace(status, log_error=log_error or status.log_error, throttle_error=throttle_error)


def _watches(
    settings: Settings, specs: Sequence[TopicSpec], groups: Sequence[str]
) -> list[LaneWatch]:
    """The (lane, group) pairs to read: ``--group``'s for every lane, else each lane's own.

    Raises:
        ConfigError: a blank group (:func:`_named_groups`).
    """
    from pipeline.observability.lanes import lane_watches  # noqa: PLC0415 - see the module doc

    lane_groups = settings.ingress.sweeper.lane_groups
    only = _named_groups(groups, lane_groups)
    return lane_watches(specs, {lane: [g] for lane, g in lane_groups.items()}, only_groups=only)


def _named_groups(groups: Sequence[str], lane_groups: Mapping[str, str]) -> list[str]:
    """``--group``'s groups, each once, in order; every group given checked to have a name.

    A blank group (``-g "$GROUP"`` with the variable unset) would be read as a group of that
    name: on Kafka librdkafka aborts the process on an empty ``group.id``.

    Raises:
        ConfigError: a blank ``--group``, or a lane given a blank group by
            ``PIPELINE_INGRESS__SWEEPER__LANE_GROUPS``.
    """
    for group in groups:
        if not group.strip():
            raise ConfigError(
                f"--group {group!r}: a consumer group needs a name (is the variable that gives it"
                " unset?); give the lane's group, e.g. --group replies"
            )
    if not groups:
        for lane, group in lane_groups.items():
            if not group.strip():
                raise ConfigError(
                    f"PIPELINE_INGRESS__SWEEPER__LANE_GROUPS gives lane {lane!r} the group"
                    f" {group!r}: name the group that consumes it, or leave the lane out"
                    " (its group is then named after it)"
                )
    return list(dict.fromkeys(groups))


def _marked(
    lane: LaneStatus,
    long_work: set[str],
    absent: Mapping[tuple[str, str], tuple[str, ...] | None],
) -> LaneStatus:
    """``lane`` marked as running long work, or read for a group the broker does not have."""
    pair = (lane.report.lane, lane.report.group)
    return replace(
        lane,
        long_work=lane.report.lane in long_work,
        no_group=pair in absent,
        readers=absent.get(pair),
    )


async def _missing_groups(
    settings: Settings, redis: Redis, watches: Sequence[LaneWatch]
) -> Mapping[tuple[str, str], tuple[str, ...] | None]:
    """The watched (lane, group) pairs whose group the broker does not have, and their readers.

    A broker that cannot list its groups leaves every group taken as existing (its figures
    shown as before), so a status never claims a group is missing without the broker's word.
    """
    from redis.exceptions import RedisError  # noqa: PLC0415 - see the module doc

    from pipeline.cli.status_checks import PROBE_TIMEOUT_MS  # noqa: PLC0415
    from pipeline.cli.status_groups import (  # noqa: PLC0415
        GroupDirectory,
        KafkaGroups,
        RedisGroups,
        missing_groups,
    )

    directory: GroupDirectory
    if settings.transport == "kafka":
        directory = KafkaGroups(settings.kafka, PROBE_TIMEOUT_MS / 1000)
    else:
        directory = RedisGroups(redis, settings.redis.key_prefix)
    try:
        return await missing_groups(directory, watches)
    except (PipelineError, RedisError, OSError):
        return {}


def status_command(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False,
    group: Annotated[
        list[str] | None, typer.Option("--group", "-g", help="Consumer group (repeatable).")
    ] = None,
    log: Annotated[bool, typer.Option("--log/--no-log", help="Read the ingress log.")] = True,
    transport: TransportOpt = None,
) -> None:
    """Lag, oldest waiting message, retry tiers, dead letters and abandoned rows per lane.

    Exits 1 with one line naming the address when the broker cannot be reached, and 1 after the
    report when a part of it (a lane, the ingress log, the throttles) could not be read or a
    declared topic is missing on the broker (listed: run `pipeline topics apply`).
    """
    from pipeline.config import load_settings  # noqa: PLC0415 - see the module doc

    settings = load_settings(**({"transport": transport} if transport else {}))
    status = run_command(gather(settings, group or [], with_log=log))
    if as_json:
        typer.echo(json.dumps(status.to_json()))
    else:
        console = Console(emoji=False)  # ":name:" in a tenant or a group is text, not an emoji
        # Off a terminal rich assumes 80 columns and would cut lane names: let lines run long.
        render(status, console if console.is_terminal else Console(width=_PIPE_WIDTH, emoji=False))
    if not status.healthy:
        raise typer.Exit(1)

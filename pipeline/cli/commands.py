"""The ``pipeline`` command line: topics, produce and tail, in the spirit of kcat.

Every command reads settings from the environment (``PIPELINE_*``, see :mod:`pipeline.config`);
``--transport`` overrides ``PIPELINE_TRANSPORT``. Errors print one line to stderr and exit
non-zero, never a traceback: 1 for a failed operation, 2 for bad input or configuration.

A command imports what it runs on (the settings, the transports, the stages) when it runs, so
that ``pipeline --help``, or one command, does not load every other command's stack.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Collection, Coroutine, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from pipeline import headers as h
from pipeline import tracing
from pipeline.admission.cli import app as throttle_app
from pipeline.capacity.cli import capacity_command
from pipeline.cli.cancel import cancel_command
from pipeline.cli.flags import show_flags_as_flags
from pipeline.cli.offload import app as offload_app
from pipeline.cli.status_view import status_command
from pipeline.cli_support import (
    HELP_MARKUP,
    TransportOpt,
    err,
    out_console,
    require_window,
    run_command,
    until_stopped,
    utc_time,
)
from pipeline.envelope import Message, printable
from pipeline.errors import ConfigError, PipelineError, UnknownTopic
from pipeline.ingress.cli import app as ingress_app
from pipeline.ingress.cli import ops_app as ingress_ops_app
from pipeline.registry.cli import app as registry_app
from pipeline.registry.cli import schemas_app
from pipeline.startup import start
from pipeline.transport import create_transport

if TYPE_CHECKING:
    from pydantic import BaseModel

    from pipeline.config import Settings
    from pipeline.redrive.redrive import Report
    from pipeline.runtime import App
    from pipeline.topics.spec import TopicSpec

T = TypeVar("T")
TransportName = Literal["kafka", "redis"]
DECLARATIONS_HELP = "Declarations (default: PIPELINE_TOPICS_DIR, topics/ when unset)."

app = typer.Typer(
    help="pipeline: webhook ingress to keyed, partitioned topics.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=HELP_MARKUP,
)
topics_app = typer.Typer(help="Declare and inspect topics.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")
app.add_typer(registry_app, name="registry")
app.add_typer(schemas_app, name="schemas")
app.add_typer(ingress_app, name="ingress")
app.add_typer(throttle_app, name="throttle")
app.add_typer(ingress_ops_app)  # pipeline sweep | replay | purge
app.add_typer(offload_app, name="offload")  # pipeline offload purge
app.command("status")(status_command)
app.command("capacity")(capacity_command)
app.command("cancel")(cancel_command)
show_flags_as_flags()  # every command's --help: --json, not --json <bool>


def _print_version(given: bool) -> None:
    if given:
        from importlib import metadata  # noqa: PLC0415 - only for --version

        typer.echo(f"pipeline {metadata.version('pipeline')}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """pipeline: webhook ingress to keyed, partitioned topics."""


@app.command("send")
def send_command(
    source: Annotated[str, typer.Argument(help="The source, as in /hooks/SOURCE.")],
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Read the body from a file.")
    ] = None,
    raw_json: Annotated[str | None, typer.Option("--json", help="The body, as JSON.")] = None,
    url: Annotated[
        str | None,
        typer.Option("--url", help="The ingress (default: PIPELINE_INGRESS__HOST and __PORT)."),
    ] = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", "-H", help="Extra request header name=value.")
    ] = None,
) -> None:
    """Sign a webhook with the source's secret and scheme and post it to a running ingress.

    Prints the ingress's answer, then the topic, partition, key and tenant the source's routes
    give it. Exits 1 when the ingress refuses it, 2 for a bad body or source.
    """
    from pipeline.ingress import send  # noqa: PLC0415 - the ingress, when the command runs

    send.send_command(source, file, raw_json, url, header)


def _settings(transport: str | None) -> Settings:
    from pipeline.config import load_settings  # noqa: PLC0415 - imported when a command runs

    settings = load_settings(**({"transport": transport} if transport else {}))
    tracing.use_system(settings.transport)
    return settings


def _service_name(args: list[str]) -> str:
    """``service.name`` by command (``pipeline-consume``, ``pipeline-ingress``), for traces."""
    command = next((arg for arg in args if not arg.startswith("-")), "")
    return f"pipeline-{command}" if command else "pipeline"


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return run_command(coro)


@topics_app.command("apply")
def topics_apply(
    directory: Annotated[Path | None, typer.Argument(help=DECLARATIONS_HELP)] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the changes only.")] = False,
    transport: TransportOpt = None,
) -> None:
    """Make the broker's topics match topics/*.yaml (main, retry tiers, dead letter)."""
    from pipeline.cli.status_checks import reach_broker  # noqa: PLC0415 - see the module doc
    from pipeline.topics.admin import apply  # noqa: PLC0415
    from pipeline.topics.spec import load_specs  # noqa: PLC0415
    from pipeline.topics.stale_guard import created_topics  # noqa: PLC0415

    async def main() -> None:
        settings = _settings(transport)
        specs = load_specs(directory or settings.topics_dir, settings.max_message_bytes)
        await reach_broker(settings)
        t = create_transport(settings)
        try:
            actions = await apply(
                t.admin(),
                specs,
                settings.redis.max_len,
                dry_run=dry_run,
                max_message_bytes=settings.max_message_bytes,
                warn=_warn_line,
            )
        finally:
            await t.close()
        await _warn_redis_state(settings, specs, () if dry_run else created_topics(actions))
        verb = "would apply" if dry_run else "applied"
        for action in actions:
            typer.echo(f"{'(dry run) ' if dry_run else ''}{action}")
        typer.echo(
            f"{t.name}: {verb} {len(actions)} change(s) for {len(specs)} declaration(s)"
            if actions
            else f"{t.name}: topics already match {len(specs)} declaration(s)"
        )

    _run(main())


def _warn_line(line: str) -> None:
    """One warning line on stderr, as printed (never merged with another by the log filter)."""
    typer.echo(f"warning: {line}", err=True)


async def _warn_redis_state(
    settings: Settings, specs: Sequence[TopicSpec], created: Collection[str]
) -> None:
    """Warn of what the members' Redis holds that the declarations just applied go against.

    Work held for lanes ``specs`` no longer release, and the guard keys of a lane whose main
    topic is among ``created``: its positions are given out again (a new message's retry copy
    at one of them would be dropped as a late duplicate). Nothing is deleted.
    """
    from redis.asyncio import Redis  # noqa: PLC0415 - see the module doc
    from redis.exceptions import RedisError  # noqa: PLC0415

    from pipeline.reachability import safe_url  # noqa: PLC0415
    from pipeline.topics.stale_guard import stale_guard_lines  # noqa: PLC0415
    from pipeline.topics.stranded import stranded_in_redis  # noqa: PLC0415

    redis = Redis.from_url(
        settings.redis.url,
        socket_timeout=settings.redis.socket_timeout_s,
        socket_connect_timeout=settings.redis.socket_timeout_s,
    )
    try:
        lines = await stranded_in_redis(redis, settings.redis.key_prefix, specs)
        lines += await stale_guard_lines(redis, settings.redis.key_prefix, specs, created)
    except (RedisError, OSError) as exc:
        also = ", or guard keys left for the lanes whose topics were created" if created else ""
        _warn_line(
            f"cannot check the members' Redis ({safe_url(settings.redis.url)},"
            " PIPELINE_REDIS__URL) for held followers or debounce buffers these declarations"
            f" strand{also}: {exc}"
        )
        return
    finally:
        await redis.aclose()
    for line in lines:
        _warn_line(line)


@topics_app.command("list")
def topics_list(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per topic.")] = False,
    transport: TransportOpt = None,
) -> None:
    """Show every topic with partitions, retention, max_len (Redis) and retained message counts."""
    from pipeline.cli.status_checks import reach_broker  # noqa: PLC0415 - see the module doc
    from pipeline.topics.spec import format_duration_ms  # noqa: PLC0415
    from pipeline.transport.redis_streams.admin import UnreadableTopicMeta  # noqa: PLC0415

    async def main() -> None:
        settings = _settings(transport)
        await reach_broker(settings)
        t = create_transport(settings)
        unreadable: tuple[str, ...] = ()
        try:
            infos = await t.admin().list_topics()
        except UnreadableTopicMeta as exc:  # the other topics are still shown, then the error
            infos, unreadable = exc.readable, exc.lines
        finally:
            await t.close()
        if as_json:
            for info in infos.values():
                typer.echo(
                    json.dumps(
                        {
                            "topic": info.name,
                            "partitions": info.partitions,
                            "retention_ms": info.retention_ms,
                            "max_len": info.max_len,
                            "messages": info.message_count,
                        }
                    )
                )
        elif not infos and not unreadable:  # an empty table would read as a broken listing
            typer.echo(
                f"no topics on {t.name} ({_address(settings)}): `pipeline topics apply` creates"
                f" the ones declared in {settings.topics_dir}/"
            )
        else:
            table = Table(
                "topic",
                "partitions",
                "retention",
                "max_len",
                "messages",
                title=f"topics on {t.name}",
            )
            for info in infos.values():
                retention = format_duration_ms(info.retention_ms) if info.retention_ms else "-"
                max_len = str(info.max_len) if info.max_len is not None else "-"
                table.add_row(  # a name as the broker has it: rich would read [..] in it
                    Text(info.name),
                    str(info.partitions),
                    retention,
                    max_len,
                    str(info.message_count),
                )
            out_console().print(table)
        for line in unreadable:
            err.print(f"[red]error:[/red] {escape(line)}", highlight=False)
        if unreadable:
            raise typer.Exit(1)

    _run(main())


def _address(settings: Settings) -> str:
    """The transport's broker address and the variable that sets it, passwords hidden."""
    from pipeline.reachability import where  # noqa: PLC0415 - it imports the settings

    address, variable = where(settings, "kafka" if settings.transport == "kafka" else "redis")
    return f"{address}, {variable}"


def _typed_bytes(text: str) -> bytes:
    """The bytes of an argument as typed: UTF-8, and bytes that are not UTF-8 as they came.

    Python hands command-line bytes that are not UTF-8 over as lone surrogates
    (``surrogateescape``); they are turned back into those bytes.
    """
    return text.encode(errors="surrogateescape")


def _as_typed(text: str) -> str:
    r"""``text`` for an error line: bytes that are not UTF-8 shown as ``\xff``."""
    return _typed_bytes(text).decode(errors="backslashreplace")


def _require_topic_text(topic: str) -> None:
    """Refuse a topic name that is not UTF-8 text: no topic can have it (ConfigError, exit 2)."""
    try:
        topic.encode()
    except UnicodeEncodeError:  # argv bytes that are not UTF-8 come as lone surrogates
        raise ConfigError(
            f"topic '{_as_typed(topic)}' is not UTF-8 text, so no topic has that name;"
            " type the name in UTF-8 (`pipeline topics list` shows them)"
        ) from None


def _parse_headers(pairs: list[str]) -> dict[str, bytes]:
    """``--header name=value`` options; a value's bytes as typed, a name in UTF-8 (else exit 2)."""
    headers = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            err.print(
                f"[red]error:[/red] --header expects name=value, got {escape(repr(pair))}",
                highlight=False,
            )
            raise typer.Exit(2)
        try:
            name.encode()
        except UnicodeEncodeError:
            err.print(
                f"[red]error:[/red] --header name '{escape(_as_typed(name))}' is not UTF-8"
                " text, which header names are on both transports; type the name in UTF-8",
                highlight=False,
            )
            raise typer.Exit(2) from None
        headers[name] = _typed_bytes(value)
    return headers


@app.command()
def produce(
    topic: Annotated[str, typer.Argument(help="Topic to produce to.")],
    key: Annotated[str | None, typer.Option("--key", "-k", help="Partitioning key.")] = None,
    value: Annotated[str | None, typer.Option("--value", "-v", help="Message value.")] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file", "-f", help="Read the value from a file.", exists=True, dir_okay=False
        ),
    ] = None,
    header: Annotated[list[str] | None, typer.Option("--header", "-H", help="name=value")] = None,
    transport: TransportOpt = None,
) -> None:
    """Produce one message; print its topic, partition, offset and event id once stored.

    The message gets an event id (``pl-event-id``, a new UUID unless ``-H pl-event-id=...``
    gives one), as the ingress gives every event: ``ctx.once`` then knows it by that id, not by
    a position a topic created anew, or another broker, would give again.
    """
    if (value is None) == (file is None):
        err.print("[red]error:[/red] give exactly one of --value or --file", highlight=False)
        raise typer.Exit(2)
    payload = _typed_bytes(value) if value is not None else file.read_bytes()  # type: ignore[union-attr]
    headers = _parse_headers(header or [])
    headers.setdefault(h.EVENT_ID, uuid.uuid4().hex.encode())
    from pipeline.cli.status_checks import reach_broker  # noqa: PLC0415 - see the module doc
    from pipeline.offload.writer import with_offload  # noqa: PLC0415

    async def main() -> None:
        _require_topic_text(topic)
        settings = _settings(transport)
        await reach_broker(settings)  # in seconds, one line, if it is down
        t = create_transport(settings)
        producer = with_offload(
            t.producer(), settings.topics_dir, settings.max_message_bytes
        )  # a large value by reference
        try:
            delivered = await producer.send(
                topic, payload, key=_typed_bytes(key) if key is not None else None, headers=headers
            )
        finally:
            with contextlib.suppress(PipelineError):
                await producer.close()
            await t.close()
        typer.echo(
            json.dumps(
                {
                    "topic": delivered.topic,
                    "partition": delivered.partition,
                    "offset": delivered.offset,
                    "event_id": headers[h.EVENT_ID].decode(errors="replace"),
                }
            )
        )

    _run(main())


def _text(raw: bytes | None) -> str | None:
    return printable(raw, base64_mark="base64:")


def _render(msg: Message, *, as_json: bool) -> str:
    """One message as ``tail`` prints it: a JSON object, or two lines of text.

    The text shows the time as every command does (:func:`utc_time`); the JSON field keeps
    its ``+00:00`` form, which scripts read, and is null for a time no calendar date holds (a
    producer may set any); ``timestamp_ms`` is the number as the broker keeps it.
    """
    if as_json:
        try:
            stamp: str | None = datetime.fromtimestamp(msg.timestamp_ms / 1000, UTC).isoformat(
                timespec="milliseconds"
            )
        except (OverflowError, OSError, ValueError):  # past what a date holds
            stamp = None
        return json.dumps(
            {
                "topic": msg.topic,
                "partition": msg.partition,
                "offset": msg.offset,
                "key": _text(msg.key),
                "value": _text(msg.value),
                "headers": {k: _text(v) for k, v in msg.headers.items()},
                "timestamp": stamp,
                "timestamp_ms": msg.timestamp_ms,
            }
        )
    headers = " ".join(f"{k}={_text(v)}" for k, v in msg.headers.items())
    return (
        f"{msg.topic}[{msg.partition}]@{msg.offset} {utc_time(msg.timestamp_ms)}"
        f" key={_text(msg.key)}"
        f"{' ' + headers if headers else ''}\n  {_text(msg.value)}"
    )


_TAIL_BATCH = 500
"""Most messages ``tail`` asks its reader for at once (Kafka takes 1,000,000, Redis 2**63-1)."""


@app.command()
def tail(
    topic: Annotated[str, typer.Argument(help="Topic to read.")],
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="Start at the oldest message.")
    ] = False,
    limit: Annotated[
        int | None, typer.Option("--limit", "-n", min=1, help="Stop after N messages.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per message.")] = False,
    transport: TransportOpt = None,
) -> None:
    """Print messages (partition, offset, key, headers, timestamp) as they arrive; Ctrl-C stops.

    With --from-beginning and --limit it stops after the messages the topic held at start when
    there are fewer than the limit. SIGTERM stops it too, with a line saying how many messages
    it printed (exit 143).
    """
    from pipeline.cli.status_checks import reach_broker  # noqa: PLC0415 - see the module doc

    seen = 0

    def stopped(by: str) -> str | None:
        if by == "Ctrl-C":  # the usual end of a tail: exit 130 without a word
            return None
        return f"tail of {topic} stopped by {by} after {seen} message{'' if seen == 1 else 's'}"

    async def main() -> None:
        nonlocal seen
        _require_topic_text(topic)
        settings = _settings(transport)
        await reach_broker(settings)  # a consumer would wait on a broker that is down
        t = create_transport(settings)
        wanted = limit
        if from_beginning and limit is not None:
            try:
                held = await t.admin().list_topics([topic])
            except PipelineError:
                await t.close()
                raise
            wanted = min(limit, held[topic].message_count) if topic in held else limit
        # A reader in no consumer group: a tail killed leaves nothing on the broker.
        reader = t.reader([topic], start_at="earliest" if from_beginning else "latest")
        try:
            while wanted is None or seen < wanted:
                # A batch of at most 500: a broker refuses a count past its own bound.
                batch = min(wanted - seen, _TAIL_BATCH) if wanted else _TAIL_BATCH
                try:
                    polled = await reader.poll(batch, 0.5)
                except UnknownTopic:  # each transport words it its own way: one line for both
                    raise UnknownTopic(
                        f"topic {_as_typed(topic)!r} does not exist on {t.name}: `pipeline topics"
                        f" list` shows the topics there (declare it in {settings.topics_dir}/ and"
                        " run `pipeline topics apply`)"
                    ) from None
                for msg in polled:
                    typer.echo(_render(msg, as_json=as_json))
                    seen += 1
                sys.stdout.flush()
        finally:
            await reader.close()
            await t.close()

    _run(until_stopped(main(), stopped))


@app.command()
def consume(
    target: Annotated[str, typer.Argument(help="MODULE:APP, e.g. consumers.messages:app")],
    group: Annotated[str, typer.Option("--group", "-g", help="Consumer group name.")],
    lane: Annotated[
        list[str] | None, typer.Option("--lane", "-l", help="Only these lanes (repeatable).")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", "-c", min=1, help="Handlers running at once.")
    ] = None,
    instance: Annotated[
        str | None,
        typer.Option(
            "--instance",
            help="Stable member name, taken back on restart (default: pod or host name-slot).",
        ),
    ] = None,
    transport: TransportOpt = None,
) -> None:
    """Run one member of a consumer group; SIGTERM or Ctrl-C stops it gracefully.

    Logs at INFO unless PIPELINE_LOG_LEVEL says otherwise: a start line, progress, dead letters.
    """
    if "PIPELINE_LOG_LEVEL" not in os.environ:
        logging.getLogger().setLevel(logging.INFO)
    from pipeline.offload.writer import check_lane_stores  # noqa: PLC0415 - see the module doc
    from pipeline.runtime.run import load_app, serve  # noqa: PLC0415
    from pipeline.transport.identity import claim_identity  # noqa: PLC0415

    async def main() -> None:
        settings = _settings(transport)
        if concurrency:
            runtime = _with_option(
                settings.runtime, "max_concurrency", concurrency, "--concurrency"
            )
            settings = settings.model_copy(update={"runtime": runtime})
        # What to run is checked before any service is asked, so a usage error is not hidden
        # behind a service that is down.
        _require_group(group)
        loaded = load_app(target)
        _require_lanes(loaded, target, lane or [])
        membership = settings.membership
        identity = claim_identity(
            group, instance or membership.instance, slot_dir=membership.slot_dir
        )
        membership = membership.model_copy(update={"instance": identity.name})
        settings = settings.model_copy(update={"membership": membership})
        try:
            await _reach_services(settings)
            chosen = [each.spec for name, each in loaded.lanes.items() if not lane or name in lane]
            await check_lane_stores(chosen)  # no credentials: exit 2 now, not at the first payload
            abandoned = await serve(loaded, settings, group, lanes=lane or None)
        finally:
            identity.release()
        if abandoned:  # their tasks would hold the event loop's close for ever: exit now
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    _run(main())


M = TypeVar("M", bound="BaseModel")


def _with_option(section: M, field: str, value: object, option: str) -> M:
    """``section`` with ``field`` set from ``option``, validated as its variable would be.

    Raises:
        ConfigError: the value is one the setting refuses; the message names ``option``.
    """
    from pydantic import ValidationError  # noqa: PLC0415 - see the module doc

    try:
        return type(section).model_validate({**section.model_dump(), field: value})
    except ValidationError as exc:
        problem = "; ".join(error["msg"] for error in exc.errors())
        raise ConfigError(f"{option} {value!r}: {problem}") from None


def _require_group(group: str) -> None:
    """Refuse a ``--group`` no member should join: empty (an unset variable) or not UTF-8.

    Such a group would be a new one, reading the lanes again apart from their own group.
    """
    if not group.strip():
        raise ConfigError(
            f"--group {group!r}: a consumer group needs a name (is the variable that gives it"
            " unset?); give the lane's group, e.g. --group replies"
        )
    try:
        group.encode()
    except UnicodeEncodeError:  # argv bytes that are not UTF-8 come as lone surrogates
        raise ConfigError(
            f"--group '{_as_typed(group)}' is not UTF-8 text, which group names are on both"
            " transports; type the name in UTF-8"
        ) from None


def _require_lanes(loaded: App, target: str, lanes: list[str]) -> None:
    """``loaded`` has a handler, and one for every ``--lane``."""
    if not loaded.lanes:  # a member of no lane would idle for ever, joined to nothing
        raise ConfigError(
            f"{target} has no handler: nothing to consume (register one with"
            ' @app.handler("<lane>") in its module)'
        )
    missing = [name for name in lanes if name not in loaded.lanes]
    if missing:
        known = ", ".join(sorted(loaded.lanes)) or "none"
        raise ConfigError(
            f"--lane {', '.join(missing)}: {target} handles no such lane (its lanes: {known})"
        )


async def _reach_services(settings: Settings) -> None:
    """Fail in seconds, naming the address and its variable, if a service is down at start.

    A member already running rides out an outage with backoff; one that never reached its
    broker or Redis would only log retries, so it stops with one line instead.
    """
    from redis.asyncio import Redis  # noqa: PLC0415 - see the module doc

    from pipeline.cli.status_checks import (  # noqa: PLC0415
        PROBE_TIMEOUT_MS,
        reach_broker,
        reach_redis,
    )

    await reach_broker(settings)
    if settings.transport != "redis":  # the member keeps its guard and throttles in Redis
        timeout_s = PROBE_TIMEOUT_MS / 1000
        try:
            client = Redis.from_url(
                settings.redis.url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
            )
        except ValueError as exc:
            raise ConfigError(f"PIPELINE_REDIS__URL: {exc}") from exc
        try:
            await reach_redis(settings, client)
        finally:
            await client.aclose()


@app.command()
def redrive(
    dlq: Annotated[str, typer.Argument(help="The dead-letter topic to take messages from.")],
    to: Annotated[
        str | None, typer.Option("--to", help="Target topic (default: each message's origin).")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="ISO time or age (2h, 7d): DLQ arrival after.")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="ISO time or age: DLQ arrival before.")
    ] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")] = None,
    error_class: Annotated[
        str | None, typer.Option("--error-class", help="Error class (suffix match).")
    ] = None,
    key: Annotated[str | None, typer.Option("--key", help="Only this message key.")] = None,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            min=1,
            help="Move at most N (dead letters left in the DLQ do not count); exit 3 if the"
            " DLQ has more still unread.",
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option("--rate", help="At most N messages per second: 50 or 50/s, as replay."),
    ] = None,
    max_redrives: Annotated[
        int, typer.Option("--max-redrives", min=1, help="Refuse messages redriven this often.")
    ] = 3,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what is still ahead, by reason; move nothing.")
    ] = False,
    transport: TransportOpt = None,
) -> None:
    """Move dead letters back to their origin topic; run again to resume after an interruption.

    Exit 0: every dead letter selected, to the end of the DLQ, was moved. Exit 3: stopped at
    --limit with dead letters still unread (the same command continues). Exit 4: some selected
    were left in the DLQ, each named in a warning (no origin topic, redriven too often, too large
    for their topic); the same command does not come back to them. A dry run exits 0. Errors
    exit 1 (the broker) or 2 (the arguments), Ctrl-C 130 and SIGTERM 143.
    """
    from pipeline.redrive.select import Selection  # noqa: PLC0415 - see the module doc

    try:
        for option, when in (("--since", since), ("--until", until)):
            _check_time(option, when)
        now_s = time.time()  # both ages count back from the same instant
        selection = Selection.typed_as(
            since=since, until=until, tenant=tenant, error_class=error_class, key=key, now_s=now_s
        )
        require_window(since, until, selection.since_ms, selection.until_ms, int(now_s * 1000))
        rate_per_s = _per_s(rate)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    from pipeline.cli.status_checks import reach_broker  # noqa: PLC0415
    from pipeline.cli_progress import progress  # noqa: PLC0415 - see the module doc
    from pipeline.offload.writer import Offloader, topic_policies  # noqa: PLC0415
    from pipeline.redrive.redrive import Redrive, require_dead_letter_topic  # noqa: PLC0415
    from pipeline.topics.spec import load_specs  # noqa: PLC0415

    async def main() -> int:
        settings = _settings(transport)
        specs = load_specs(settings.topics_dir, settings.max_message_bytes)
        require_dead_letter_topic(dlq, specs)
        await reach_broker(settings)
        t = create_transport(settings)
        policies = topic_policies(specs)
        job = Redrive(
            t,
            dlq,
            selection,
            to=to,
            limit=limit,
            rate_per_s=rate_per_s,
            max_redrives=max_redrives,
            dry_run=dry_run,
            offloader=Offloader(policies) if policies else None,  # day-old payloads kept
        )

        def stopped(by: str) -> str:
            if dry_run:
                return (
                    f"dry run of {dlq} stopped by {by} after scanning"
                    f" {job.report.scanned}; nothing was moved"
                )
            return (
                f"redrive of {dlq} stopped by {by} after moving {job.report.moved}"
                " (committed); run the same command again to resume"
            )

        try:
            total = await job.total()
            what = f"{'scanning' if dry_run else 'redriving'} {dlq}"
            with progress(what, total, console=err) as advance:
                report = await until_stopped(job.run(advance), stopped)
        finally:
            await t.close()
        _print_redrive(report, dry_run=dry_run)
        if dry_run:
            return 0
        line, code = _redrive_outcome(report, dlq, limit)
        typer.echo(line)
        return code

    code = _run(main())
    if code:
        raise typer.Exit(code)


def _check_time(option: str, value: str | None) -> None:
    """Raise ValueError naming ``option`` unless ``value`` is an ISO time or a clock's age."""
    if not value:
        return
    from pipeline.redrive.select import parse_time_ms  # noqa: PLC0415 - see the module doc

    try:
        parse_time_ms(value)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None
    except OverflowError:  # an age of more days than a float of seconds holds
        raise ValueError(
            f"{option}: an age longer ago than any time a clock holds (got {value!r}); give a"
            " shorter age or an ISO time (without --since, every dead letter from the oldest)"
        ) from None


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*s)?\s*$")


def _per_s(value: str | None) -> float | None:
    """``--rate`` as messages per second: ``50`` or ``50/s`` (the spelling replay takes)."""
    if value is None:
        return None
    match = _RATE.match(value)
    if match is None or float(match[1]) <= 0:
        raise ValueError(f"--rate: expected a positive rate such as 50/s, got {value!r}")
    return float(match[1])


def _print_redrive(report: Report, *, dry_run: bool) -> None:
    """The selected dead letters by reason (when any was selected), then the summary lines."""
    if report.reasons:  # an empty table would read as a broken listing: the summary says 0
        table = Table("reason", "messages", title="selected dead letters by reason")
        for why, count in report.reasons.most_common():
            table.add_row(Text(why), str(count))  # from the dead letter's headers: rich reads [..]
        out_console().print(table)
    verb = "would move" if dry_run else "moved"
    moved = report.selected - report.refused_loops - report.no_origin if dry_run else report.moved
    typer.echo(
        f"scanned {report.scanned}, selected {report.selected}, {verb} {moved}, "
        f"refused {report.refused_loops} (redriven too often), {report.no_origin} without an origin"
        f" topic to go back to, {report.too_large} too large for their topic"
    )
    for target, count in report.moved_to.items():
        typer.echo(f"  -> {target}: {count}")
    if report.unidentified:
        typer.echo(
            f"  {report.unidentified} without pl-event-id or origin position: ctx.once in their"
            " handler takes each for a new event and runs its effects again (give a dead letter"
            " produced by hand the pl-event-id of its event)"
        )


def _redrive_outcome(report: Report, dlq: str, limit: int | None) -> tuple[str, int]:
    """The last line of a redrive and its exit code: all moved (0), more unread (3), left (4).

    Left dead letters need an operator (another command: ``--to``, ``--max-redrives``, a larger
    topic), so they win over a limit's rest, which only needs the same command again.
    """
    if report.left:
        them = "it" if report.left == 1 else "them"
        line = (
            f"{_count(report.left, 'selected dead letter')} left in {dlq} (each named in a"
            f" warning above): the same command does not come back to {them}"
        )
        if report.unread:
            line += (
                f"; {_count(report.unread, 'dead letter')} still unread: run the same command"
                " again for those"
            )
        return f"{line} (exit 4)", 4
    if report.unread:
        line = (
            f"stopped at --limit {limit} with {_count(report.unread, 'dead letter')} of {dlq}"
            " still unread: run the same command again to continue"
        )
        return f"{line} (exit 3)", 3
    if not report.selected:
        return "done: no dead letter selected", 0
    return "done: every selected dead letter was moved", 0


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


@app.command("asyncapi")
def asyncapi_command(
    directory: Annotated[Path | None, typer.Argument(help=DECLARATIONS_HELP)] = None,
    fmt: Annotated[Literal["yaml", "json"], typer.Option("--format")] = "yaml",
    schemas: Annotated[
        Path | None,
        typer.Option(
            help="Avro records (*.avsc) for the declarations' schema: subjects "
            "(default: schemas/ when there is one)."
        ),
    ] = None,
    apps: Annotated[
        list[str] | None,
        typer.Option("--app", help="MODULE:APP whose handlers' pydantic models are payloads."),
    ] = None,
    groups: Annotated[
        list[str] | None, typer.Option("--group", help="LANE=GROUP (default: the lane's name).")
    ] = None,
) -> None:
    """Print an AsyncAPI 3.0 document of the declared topics, their messages and groups."""
    import yaml  # noqa: PLC0415 - see the module doc

    from pipeline.config import load_settings  # noqa: PLC0415
    from pipeline.runtime.run import load_app  # noqa: PLC0415
    from pipeline.topics import asyncapi  # noqa: PLC0415
    from pipeline.topics.spec import load_specs  # noqa: PLC0415

    try:
        settings = load_settings()
        declarations = directory or settings.topics_dir
        specs = load_specs(declarations, settings.max_message_bytes)
        declared = {spec.lane for spec in specs}
        lane_groups = _lane_groups(groups or [], declared)
        if schemas is not None and not schemas.is_dir():
            raise ConfigError(f"--schemas {schemas}: no such directory")
        avro = asyncapi.avro_schemas(schemas or Path("schemas"))
        models: dict[str, type[BaseModel]] = {}
        undeclared: list[str] = []  # the warning lines, printed with the document
        for target in apps or []:
            found = {
                name: model
                for name, lane in load_app(target).lanes.items()
                if (model := asyncapi.model_of(lane.event)) is not None
            }
            if left_out := sorted(found.keys() - declared):
                undeclared.append(
                    f"--app {target}: lane(s) {', '.join(left_out)} not declared in"
                    f" {declarations}; their payloads are left out"
                )
            models.update(found)
        protocol, mechanism = asyncapi.kafka_security(settings.kafka.client)
        doc = asyncapi.document(
            specs,
            kafka_bootstrap=settings.kafka.bootstrap_servers,
            redis_url=settings.redis.url,
            kafka_security_protocol=protocol,
            kafka_sasl_mechanism=mechanism,
            avro=avro,
            models=models,
            groups=lane_groups,
        )
    except PipelineError as exc:  # a bad declaration, schema, --app or --group: exit 2
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    for line in undeclared:  # the document of DIR is right: exit 0, but say what it lacks
        _warn_line(line)
    if fmt == "json":
        typer.echo(json.dumps(doc, indent=2))
    else:
        typer.echo(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), nl=False)


def _lane_groups(pairs: list[str], lanes: set[str]) -> dict[str, str]:
    """``--group LANE=GROUP`` options as {lane: group}, each lane one of ``lanes``."""
    out = {}
    for pair in pairs:
        lane, sep, group = pair.partition("=")
        if not sep or not lane or not group:
            raise ConfigError(f"--group {pair!r}: expected LANE=GROUP, e.g. messages=replies")
        if lane not in lanes:
            known = ", ".join(sorted(lanes)) or "none"
            raise ConfigError(f"--group {pair!r}: no lane {lane!r} is declared (lanes: {known})")
        out[lane] = group
    return out


def main() -> None:
    """Console-script entry point; ``PIPELINE_LOG_LEVEL`` (default WARNING) sets the log level.

    Every command runs with its soft open-file limit raised to the hard one
    (:mod:`pipeline.descriptors`), as do the processes it starts. Errors raised before a
    command's runner (settings read at the edge, a client refusing its configuration) get the
    same one line and exit code as inside it.
    """
    try:
        start(sys.argv[1:])
        tracing.configure(
            os.environ,
            service=_service_name(sys.argv[1:]),
            system=os.environ.get("PIPELINE_TRANSPORT", "redis"),
        )
        app()
    except ConfigError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        sys.exit(2)
    except PipelineError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        sys.exit(1)
    except Exception as exc:
        # librdkafka refused its properties before any request; imported only by Kafka's client
        kafka = sys.modules.get("confluent_kafka")
        if kafka is None or not isinstance(exc, kafka.KafkaException):
            raise
        reason = (
            exc.args[0].str() if exc.args and isinstance(exc.args[0], kafka.KafkaError) else exc
        )
        err.print(
            f"[red]error:[/red] Kafka client: {reason} (check PIPELINE_KAFKA__CLIENT and the "
            "other PIPELINE_KAFKA__* variables)",
            highlight=False,
        )
        sys.exit(2)

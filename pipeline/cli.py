"""The ``pipeline`` command line: topics, produce and tail, in the spirit of kcat.

Every command reads settings from the environment (``PIPELINE_*``, see :mod:`pipeline.config`);
``--transport`` overrides ``PIPELINE_TRANSPORT``. Errors print one line to stderr and exit
non-zero, never a traceback: 1 for a failed operation, 2 for bad input or configuration.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import sys
import uuid
from collections.abc import Coroutine
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from pipeline.admission.cli import app as throttle_app
from pipeline.capacity.cli import capacity_command
from pipeline.cli_support import TransportOpt, err, run_command
from pipeline.config import Settings, load_settings
from pipeline.envelope import Message
from pipeline.errors import PipelineError
from pipeline.ingress.cli import app as ingress_app
from pipeline.ingress.cli import ops_app as ingress_ops_app
from pipeline.observability.status_view import status_command
from pipeline.redrive.redrive import Redrive, Report
from pipeline.redrive.select import Selection, parse_time_ms
from pipeline.registry.cli import app as registry_app
from pipeline.registry.cli import schemas_app
from pipeline.runtime.run import load_app, serve
from pipeline.topics.admin import apply
from pipeline.topics.spec import format_duration_ms, load_specs
from pipeline.transport import create_transport

T = TypeVar("T")
TransportName = Literal["kafka", "redis"]

app = typer.Typer(
    help="pipeline: webhook ingress to keyed, partitioned topics.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
topics_app = typer.Typer(help="Declare and inspect topics.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")
app.add_typer(registry_app, name="registry")
app.add_typer(schemas_app, name="schemas")
app.add_typer(ingress_app, name="ingress")
app.add_typer(throttle_app, name="throttle")
app.add_typer(ingress_ops_app)  # pipeline sweep | replay | purge
app.command("status")(status_command)
app.command("capacity")(capacity_command)


def _print_version(given: bool) -> None:
    if given:
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


def _settings(transport: str | None) -> Settings:
    return load_settings(**({"transport": transport} if transport else {}))


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return run_command(coro)


@topics_app.command("apply")
def topics_apply(
    directory: Annotated[
        Path | None, typer.Argument(help="Declarations (default: topics/).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the changes only.")] = False,
    transport: TransportOpt = None,
) -> None:
    """Make the broker's topics match topics/*.yaml (main, retry tiers, dead letter)."""

    async def main() -> None:
        settings = _settings(transport)
        specs = load_specs(directory or settings.topics_dir)
        t = create_transport(settings)
        try:
            actions = await apply(t.admin(), specs, settings.redis.max_len, dry_run=dry_run)
        finally:
            await t.close()
        verb = "would apply" if dry_run else "applied"
        for action in actions:
            typer.echo(f"{'(dry run) ' if dry_run else ''}{action}")
        typer.echo(
            f"{t.name}: {verb} {len(actions)} change(s) for {len(specs)} declaration(s)"
            if actions
            else f"{t.name}: topics already match {len(specs)} declaration(s)"
        )

    _run(main())


@topics_app.command("list")
def topics_list(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per topic.")] = False,
    transport: TransportOpt = None,
) -> None:
    """Show every topic with partitions, retention and retained message counts."""

    async def main() -> None:
        t = create_transport(_settings(transport))
        try:
            infos = await t.admin().list_topics()
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
                            "messages": info.message_count,
                        }
                    )
                )
            return
        table = Table("topic", "partitions", "retention", "messages", title=f"topics on {t.name}")
        for info in infos.values():
            retention = format_duration_ms(info.retention_ms) if info.retention_ms else "-"
            table.add_row(info.name, str(info.partitions), retention, str(info.message_count))
        Console().print(table)

    _run(main())


def _parse_headers(pairs: list[str]) -> dict[str, bytes]:
    headers = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            err.print(
                f"[red]error:[/red] --header expects name=value, got {pair!r}", highlight=False
            )
            raise typer.Exit(2)
        headers[name] = value.encode()
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
    """Produce one message; print {"topic", "partition", "offset"} once the broker has it."""
    if (value is None) == (file is None):
        err.print("[red]error:[/red] give exactly one of --value or --file", highlight=False)
        raise typer.Exit(2)
    payload = value.encode() if value is not None else file.read_bytes()  # type: ignore[union-attr]
    headers = _parse_headers(header or [])

    async def main() -> None:
        t = create_transport(_settings(transport))
        producer = t.producer()
        try:
            delivered = await producer.send(
                topic, payload, key=key.encode() if key is not None else None, headers=headers
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
                }
            )
        )

    _run(main())


def _text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(raw).decode()


def _render(msg: Message, *, as_json: bool) -> str:
    stamp = datetime.fromtimestamp(msg.timestamp_ms / 1000, UTC).isoformat(timespec="milliseconds")
    if as_json:
        return json.dumps(
            {
                "topic": msg.topic,
                "partition": msg.partition,
                "offset": msg.offset,
                "key": _text(msg.key),
                "value": _text(msg.value),
                "headers": {k: _text(v) for k, v in msg.headers.items()},
                "timestamp": stamp,
            }
        )
    headers = " ".join(f"{k}={_text(v)}" for k, v in msg.headers.items())
    return (
        f"{msg.topic}[{msg.partition}]@{msg.offset} {stamp} key={_text(msg.key)}"
        f"{' ' + headers if headers else ''}\n  {_text(msg.value)}"
    )


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
    """Print messages (partition, offset, key, headers, timestamp) as they arrive; Ctrl-C stops."""

    async def main() -> None:
        t = create_transport(_settings(transport))
        group = f"pipeline-tail-{uuid.uuid4().hex[:8]}"
        consumer = t.consumer(group, [topic], start_at="earliest" if from_beginning else "latest")
        seen = 0
        try:
            while limit is None or seen < limit:
                for msg in await consumer.poll(limit - seen if limit else 500, 0.5):
                    typer.echo(_render(msg, as_json=as_json))
                    seen += 1
                sys.stdout.flush()
        finally:
            await consumer.close()
            with contextlib.suppress(PipelineError):
                await t.admin().delete_group(group, [topic])
            await t.close()

    _run(main())


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
    transport: TransportOpt = None,
) -> None:
    """Run one member of a consumer group; SIGTERM or Ctrl-C stops it gracefully."""

    async def main() -> None:
        settings = _settings(transport)
        if concurrency:
            runtime = settings.runtime.model_copy(update={"max_concurrency": concurrency})
            settings = settings.model_copy(update={"runtime": runtime})
        await serve(load_app(target), settings, group, lanes=lane or None)

    _run(main())


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
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Move at most N.")] = None,
    rate: Annotated[
        float | None, typer.Option("--rate", min=0.01, help="At most N messages per second.")
    ] = None,
    max_redrives: Annotated[
        int, typer.Option("--max-redrives", min=1, help="Refuse messages redriven this often.")
    ] = 3,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count and show failure reasons only.")
    ] = False,
    transport: TransportOpt = None,
) -> None:
    """Move dead letters back to their origin topic; run again to resume after an interruption."""
    try:
        selection = Selection(
            since_ms=parse_time_ms(since) if since else None,
            until_ms=parse_time_ms(until) if until else None,
            tenant=tenant,
            error_class=error_class,
            key=key,
        )
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None

    async def main() -> None:
        t = create_transport(_settings(transport))
        job = Redrive(
            t,
            dlq,
            selection,
            to=to,
            limit=limit,
            rate_per_s=rate,
            max_redrives=max_redrives,
            dry_run=dry_run,
        )
        try:
            total = await job.total()
            with Progress(console=err, transient=True) as bar:
                task = bar.add_task(f"{'scanning' if dry_run else 'redriving'} {dlq}", total=total)
                report = await job.run(lambda n: bar.advance(task, n))
        finally:
            await t.close()
        _print_redrive(report, dry_run=dry_run)

    _run(main())


def _print_redrive(report: Report, *, dry_run: bool) -> None:
    table = Table("reason", "messages", title="selected dead letters by reason")
    for why, count in report.reasons.most_common():
        table.add_row(why, str(count))
    Console().print(table)
    verb = "would move" if dry_run else "moved"
    moved = report.selected - report.refused_loops - report.no_origin if dry_run else report.moved
    typer.echo(
        f"scanned {report.scanned}, selected {report.selected}, {verb} {moved}, "
        f"refused {report.refused_loops} (redriven too often), {report.no_origin} without origin"
    )
    for target, count in report.moved_to.items():
        typer.echo(f"  -> {target}: {count}")


def main() -> None:
    """Console-script entry point; ``PIPELINE_LOG_LEVEL`` (default WARNING) sets the log level."""
    logging.basicConfig(
        level=os.environ.get("PIPELINE_LOG_LEVEL", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    app()

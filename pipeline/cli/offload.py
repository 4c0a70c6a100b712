"""``pipeline offload purge``: delete offloaded payloads nothing can need (docs/offload.md).

The default age is the store's floor: the declared one (:func:`pipeline.offload.purge.floor_ms`)
or, when the lanes' topics still hold an older message, that message's age plus the refresh
window (:func:`pipeline.offload.purge.measured_floor_ms`), so the transport is asked first; and
when the ingress log (the settings' ``PIPELINE_INGRESS__*``) holds a row neither processed nor
abandoned received before that, that row's age plus the window
(:func:`pipeline.offload.purge.oldest_unfinished_row_ms`), so the log is asked next. A younger
``--older-than`` is refused unless ``--force``, since it could delete a payload a message, a dead
letter or a replayable log row still points to.

It lives in :mod:`pipeline.cli`, not in :mod:`pipeline.offload` (whose package imports
pydantic), and imports the stores, the transports and the settings when the command runs, not
when ``pipeline`` registers it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlparse

import typer
from rich.markup import escape

from pipeline.cli_support import TransportOpt, err, run_command, until_stopped, utc_time
from pipeline.errors import ConfigError
from pipeline.transport import create_transport

if TYPE_CHECKING:
    from pipeline.config import Settings
    from pipeline.offload.purge import PurgeReport

app = typer.Typer(help="Offloaded payloads (large bodies by reference).", no_args_is_help=True)


def _duration_ms(value: str | None, option: str) -> int | None:
    if value is None:
        return None
    from pipeline.topics.spec import parse_duration_ms  # noqa: PLC0415 - see the module doc

    try:
        duration_ms = parse_duration_ms(value)
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc}") from None
    # An age reaching past 1970 reaches no object, as one of 1970 does; a float holds no more.
    return min(duration_ms, int(time.time() * 1000))


def _require_store_directory(store_url: str | None) -> None:
    """Refuse a ``--store file:///dir`` that is not there: opening it would create it, empty.

    Raises:
        ConfigError: the directory does not exist (a typo), naming the option.
    """
    if store_url and urlparse(store_url).scheme == "file":
        directory = Path(urlparse(store_url).path)
        if not directory.is_dir():
            raise ConfigError(
                f"--store {store_url}: no such directory ({directory}); point it at the"
                " lanes' payload directory (their offload.store)"
            )


async def _purge(
    store_url: str | None,
    older_than: str | None,
    log_retention: str,
    dry_run: bool,
    force: bool,
    transport_name: str | None,
    reports: list[PurgeReport],
) -> None:
    """Purge each store, appending its report to ``reports`` before it starts and counting in it.

    So a purge stopped part way (Ctrl-C, SIGTERM) leaves in ``reports`` what each store got to.
    """
    from pipeline.config import load_settings  # noqa: PLC0415 - see the module doc
    from pipeline.offload.purge import (  # noqa: PLC0415
        LOG_RETENTION_MS,
        PurgeReport,
        floor_ms,
        measured_floor_ms,
        oldest_held_ms,
        purge,
        stores,
        topics_of,
    )
    from pipeline.offload.store import open_store  # noqa: PLC0415
    from pipeline.topics.durations import format_duration_up_ms  # noqa: PLC0415
    from pipeline.topics.spec import load_specs  # noqa: PLC0415

    # The flags first: a mistyped one is the error to fix, whatever the stores.
    log_ms = _duration_ms(log_retention, "--log-retention") or LOG_RETENTION_MS
    given_ms = _duration_ms(older_than, "--older-than")
    settings = load_settings(**({"transport": transport_name} if transport_name else {}))
    specs = load_specs(settings.topics_dir, settings.max_message_bytes)
    # As a lane's offload.store is read: without a trailing slash, or no lane's floor would count.
    urls = [store_url.rstrip("/")] if store_url else stores(specs)
    if not urls:
        raise ConfigError(
            f"no lane in {settings.topics_dir} declares offload: (PIPELINE_TOPICS_DIR);"
            " name the store with --store s3://bucket/prefix or file:///dir"
        )
    floors = {}
    transport = create_transport(settings)
    try:
        admin = transport.admin()
        try:
            for url in urls:
                oldest = await oldest_held_ms(admin, topics_of(specs, url))
                floors[url] = (floor_ms(specs, url, log_ms), oldest)
        finally:
            await admin.close()
    finally:
        await transport.close()
    now_ms = int(time.time() * 1000)
    # One question covers every store: the oldest unfinished row below the youngest declared
    # floor, which measured_floor_ms then weighs against each store's own.
    unfinished = (
        None
        if given_ms is not None and force
        else await _oldest_unfinished(settings, min(d for d, _ in floors.values()), now_ms)
    )
    for url in urls:
        declared, oldest = floors[url]
        held_floor = measured_floor_ms(declared, oldest, now_ms)
        floor = measured_floor_ms(held_floor, unfinished, now_ms)
        if given_ms is not None and given_ms < floor and not force:
            held = "" if held_floor == declared else " and the oldest message its lanes still hold"
            if floor > held_floor:
                held += " and the oldest log row not yet processed or abandoned"
            raise ConfigError(
                f"--older-than {older_than} is younger than what {url} must keep "
                f"({format_duration_up_ms(floor)}: the longest lane, dead-letter and log retention"
                f"{held}, plus the writers' refresh window); give --force to delete anyway"
            )
        if given_ms is None and unfinished is not None and floor > held_floor:
            err.print(
                f"{escape(url)}: kept every object written in the last"
                f" {format_duration_up_ms(floor)}, not {format_duration_up_ms(held_floor)}: the"
                f" ingress log still holds a row received {utc_time(unfinished)} that is neither"
                " processed nor abandoned, which the sweeper or `pipeline replay` may produce"
                " again",
                highlight=False,
                soft_wrap=True,
            )
        report = PurgeReport(url)
        reports.append(report)
        await purge(open_store(url), given_ms or floor, dry_run=dry_run, report=report)


async def _oldest_unfinished(settings: Settings, declared_ms: int, now_ms: int) -> int | None:
    """The oldest unfinished row of the ingress log the settings choose, older than the floor.

    None when there is none, or when the log is an SQLite database that does not exist (no
    ingress writes one at that path: ``PIPELINE_INGRESS__SQLITE_PATH``).

    Raises:
        LogStoreError: the log did not answer: one line, and nothing is purged.
    """
    from pipeline.logstore import LogStoreError  # noqa: PLC0415 - see the module doc
    from pipeline.logstore.create import create_log_store  # noqa: PLC0415
    from pipeline.offload.purge import oldest_unfinished_row_ms  # noqa: PLC0415

    ingress = settings.ingress
    if ingress.log_store == "sqlite" and not ingress.sqlite_path.is_file():
        return None
    log = create_log_store(settings, ingress)
    try:
        await log.open()
        return await oldest_unfinished_row_ms(log, declared_ms, now_ms)
    except LogStoreError as exc:
        raise LogStoreError(
            f"the ingress log ({ingress.log_store}) did not answer: {exc}; nothing was purged,"
            " since a row it holds may still point to a payload (run it again once it answers)"
        ) from exc
    finally:
        await log.close()


@app.command("purge")
def purge_command(
    store: Annotated[
        str | None, typer.Option(help="s3://bucket/prefix or file:///dir (default: every store)")
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option(help="Last written longer ago than this (default: the store's floor)."),
    ] = None,
    log_retention: Annotated[
        str, typer.Option(help="The age `pipeline purge` deletes log rows at.")
    ] = "30d",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count only.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Allow a younger --older-than.")] = False,
    transport: TransportOpt = None,
) -> None:
    """Delete payload objects no message, dead letter or log row can still point to.

    Asks the broker (``--transport``) for the oldest message the lanes still hold, and the
    ingress log (its settings) for the oldest row neither processed nor abandoned, so nothing
    either may point to is deleted; one line says when such a row keeps objects. Prints one
    JSON line per store: scanned, deleted, deleted_bytes, kept. Stopped by Ctrl-C or SIGTERM
    (exit 130 or 143), it prints those of the stores it got to, the last one marked
    ``"interrupted": true``.
    """
    try:
        _require_store_directory(store)
    except ConfigError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    reports: list[PurgeReport] = []
    purging = _purge(store, older_than, log_retention, dry_run, force, transport, reports)
    run_command(_saying_how_far(purging, reports, dry_run=dry_run))
    _print_reports(reports, dry_run=dry_run)


async def _saying_how_far(
    purging: Coroutine[Any, Any, None], reports: list[PurgeReport], *, dry_run: bool
) -> None:
    """Await ``purging``; stopped, print what each store got to and how to go on.

    Ctrl-C exits 130, SIGTERM (a CronJob's pod stopped) 143, as :func:`until_stopped` does.
    """

    def stopped(by: str) -> str:
        if not reports:
            return f"offload purge stopped by {by} before it reached a store; nothing was deleted"
        _print_reports(reports, dry_run=dry_run, interrupted=True)
        done = "counted" if dry_run else "deleted"
        return (
            f"offload purge stopped by {by} in {reports[-1].store} after it {done}"
            f" {reports[-1].deleted} objects; run it again to finish: it deletes only what is"
            " still old"
        )

    await until_stopped(purging, stopped)


def _print_reports(reports: list[PurgeReport], *, dry_run: bool, interrupted: bool = False) -> None:
    """One JSON line per store; the last one ``"interrupted": true`` if the purge was stopped."""
    for i, report in enumerate(reports):
        line: dict[str, object] = {
            "store": report.store,
            "scanned": report.scanned,
            "deleted": report.deleted,
            "deleted_bytes": report.deleted_bytes,
            "kept": report.kept,
            "dry_run": dry_run,
        }
        if interrupted and i == len(reports) - 1:
            line["interrupted"] = True
        typer.echo(json.dumps(line))

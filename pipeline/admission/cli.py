"""Commands: ``pipeline throttle status [KEY]``, ``set-limit KEY LIMIT``, ``set-reserve KEY SLOTS``.

Settings come from ``PIPELINE_REDIS__*`` and ``PIPELINE_THROTTLE__*``; ``--namespace``
overrides the namespace. Errors print one line to stderr and exit 1 (Redis unreachable) or 2
(a value the throttle refuses).

Redis, the settings and the throttle are imported when a command runs: registering the commands
in ``pipeline`` loads none of them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from pipeline.cli_support import err, out_console, run_command
from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from pipeline.admission.status import ThrottleStatus
    from pipeline.admission.throttle import Throttle
    from pipeline.config import Settings

app = typer.Typer(help="Inspect and tune the fair admission throttles.", no_args_is_help=True)

NamespaceOpt = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="Namespace (default: PIPELINE_THROTTLE__NAMESPACE)."),
]


def _settings(namespace: str | None) -> Settings:
    """The settings with ``--namespace``, held to what PIPELINE_THROTTLE__NAMESPACE is held to.

    Raises:
        ConfigError: the namespace is one the setting refuses (exit 2, before Redis is asked).
    """
    from pydantic import ValidationError  # noqa: PLC0415 - see the module doc

    from pipeline.config import load_settings  # noqa: PLC0415

    settings = load_settings()
    if namespace:
        fields = {**settings.throttle.model_dump(), "namespace": namespace}
        try:
            throttle = type(settings.throttle).model_validate(fields)
        except ValidationError as exc:
            problem = "; ".join(error["msg"] for error in exc.errors())
            raise ConfigError(f"--namespace {namespace!r}: {problem}") from None
        settings = settings.model_copy(update={"throttle": throttle})
    return settings


def _named(key: str) -> str:
    """``key``, or one line and exit 2 when it is empty (no lane's template makes such a key)."""
    if not key.strip():
        err.print(
            "[red]error:[/red] the throttle key is empty: give one, e.g. org:acme"
            " (`pipeline throttle status` lists the active keys)",
            highlight=False,
        )
        raise typer.Exit(2)
    return key


def _client(settings: Settings) -> Redis:
    from redis.asyncio import Redis  # noqa: PLC0415 - see the module doc

    return Redis.from_url(settings.redis.url, socket_timeout=settings.redis.socket_timeout_s)


@app.command("status")
def status(
    key: Annotated[
        str | None, typer.Argument(help="One key (default: all active or closed).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per key (none: no line, exit 0).")
    ] = False,
    namespace: NamespaceOpt = None,
) -> None:
    """Show limit, holders, waiters per priority and recent grants of throttle keys.

    Without KEY: the keys with holders or waiters and the adaptive keys a Retry-After closed.
    """
    from redis import exceptions as rexc  # noqa: PLC0415 - see the module doc

    from pipeline.admission.keys import key_text  # noqa: PLC0415
    from pipeline.admission.status import (  # noqa: PLC0415
        read_active_keys,
        read_closed_keys,
        read_status,
    )
    from pipeline.reachability import unreachable  # noqa: PLC0415

    if key is not None:
        _named(key)

    async def main() -> tuple[list[ThrottleStatus], int]:
        settings = _settings(namespace)
        client = _client(settings)
        prefix, ns = settings.redis.key_prefix, settings.throttle.namespace
        try:
            # As set-limit stores it: bytes typed that are not UTF-8 are U+FFFD, as members read.
            wanted = (
                [key_text(key)]
                if key
                else sorted(
                    {
                        *await read_active_keys(client, prefix, ns),
                        *await read_closed_keys(client, prefix, ns),
                    }
                )
            )
            statuses = [
                await read_status(client, prefix, ns, k, settings.throttle.default_limit)
                for k in wanted
            ]
            seconds, micros = await client.time()  # leases run on Redis's clock
            return statuses, seconds * 1000 + micros // 1000
        except (rexc.RedisError, OSError) as exc:
            err.print(
                f"[red]error:[/red] {escape(str(unreachable(settings, 'redis', str(exc))))}",
                highlight=False,
            )
            raise typer.Exit(1) from None
        finally:
            await client.aclose()

    statuses, redis_now_ms = run_command(main())
    if as_json:
        for s in statuses:
            typer.echo(json.dumps(s.as_dict()))
        return
    if not statuses:
        typer.echo("no active throttle keys")
        return
    now_ms = int(time.time() * 1000)
    table = Table("key", "limit", "holders", "waiters by priority", "last grant", "reserve")
    for s in statuses:
        waiting = " ".join(f"p{p}:{n}" for p, n in s.waiters_by_priority().items()) or "-"
        last = f"{(now_ms - s.recent_grants[0][1]) / 1000:.1f}s ago" if s.recent_grants else "-"
        shown = Text(s.key)  # as a producer sent it: rich would read [..] and :..: in it
        held = _holders_cell(s, redis_now_ms)
        limit = _limit_cell(s, redis_now_ms)
        table.add_row(shown, limit, held, waiting, last, _reserve_cell(s))
    out_console().print(table)


def _limit_cell(s: ThrottleStatus, now_ms: int) -> str:
    """The limit admission applies; for a key a Retry-After closed, until when and what then.

    E.g. ``0, closed until 16:45:02 UTC (in 10m), then 2``. Reopening is lazy, as expiry is: a
    time past means the next throttle call in the namespace reopens it.
    """
    if s.closed_until_ms is None:
        return str(s.limit)
    from pipeline.topics.durations import format_duration_up_ms  # noqa: PLC0415 - module doc

    until = time.strftime("%H:%M:%S", time.gmtime(s.closed_until_ms / 1000))
    left_ms = s.closed_until_ms - now_ms
    when = (
        f"in {format_duration_up_ms(left_ms)}"
        if left_ms > 0
        else "passed: the next call reopens it"
    )
    return f"{s.limit}, closed until {until} UTC ({when}), then {s.reopen_limit}"


def _holders_cell(s: ThrottleStatus, now_ms: int) -> str:
    """How many hold the key, and how many of them have a lapsed lease, e.g. ``10 (10 lapsed)``.

    Expiry is lazy: a dead member's permits stay listed until the next throttle call in the
    namespace (any member's) expires them and hands their slots on.
    """
    lapsed = sum(1 for _, expires_ms in s.holders if expires_ms <= now_ms)
    return f"{len(s.holders)} ({lapsed} lapsed)" if lapsed else str(len(s.holders))


def _reserve_cell(s: ThrottleStatus) -> str:
    """The key's reserve and how often its priorities queued, e.g. ``4 for p5+, 12/1400 queued``."""
    if s.reserve is None and not s.reserved_asked:
        return "-"
    kept = f"{s.reserve[0]} for p{s.reserve[1]}+" if s.reserve is not None else "none now"
    if not s.reserved_asked:
        return kept
    share = 100 * s.reserved_queued / s.reserved_asked
    return f"{kept}, {s.reserved_queued}/{s.reserved_asked} queued ({share:.2f} %)"


@app.command("set-limit")
def set_limit(
    key: Annotated[str, typer.Argument(help="Throttle key, e.g. org:acme.")],
    limit: Annotated[int | None, typer.Argument(help="New limit; omit for the default.")] = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Set a key's concurrency limit now, for every member; new room goes to its waiters."""
    _named(key)
    run_command(_on_throttle(namespace, lambda throttle: throttle.set_limit(key, limit)))
    from pipeline.admission.keys import key_text  # noqa: PLC0415

    typer.echo(f"{key_text(key)}: limit {'default' if limit is None else limit}")


@app.command("set-reserve")
def set_reserve(
    key: Annotated[str, typer.Argument(help="Throttle key, e.g. pool.")],
    slots: Annotated[
        int | None, typer.Argument(help="Slots of its limit to keep; omit to keep none.")
    ] = None,
    min_priority: Annotated[
        int, typer.Option("--min-priority", help="The lowest priority the kept slots serve.")
    ] = 1,
    namespace: NamespaceOpt = None,
) -> None:
    """Keep the last SLOTS of a key's limit for permits of --min-priority or more, now.

    Lower priorities see the limit minus SLOTS and borrow the rest (trunk reservation); room a
    smaller reserve frees goes to the waiters. ``status`` shows how often the kept priorities
    still queued.
    """
    _named(key)
    run_command(
        _on_throttle(namespace, lambda throttle: throttle.set_reserve(key, slots, min_priority))
    )
    kept = "none" if slots is None else f"{slots} slots for priority {min_priority} and up"
    from pipeline.admission.keys import key_text  # noqa: PLC0415

    typer.echo(f"{key_text(key)}: reserve {kept}")


async def _on_throttle(
    namespace: str | None, change: Callable[[Throttle], Awaitable[None]]
) -> None:
    """Run ``change`` on a throttle member of the namespace.

    A value the throttle refuses (a negative limit, a priority out of range) prints one line and
    exits 2; Redis down, one line and exit 1.
    """
    from redis import exceptions as rexc  # noqa: PLC0415 - see the module doc

    from pipeline.admission.throttle import Throttle  # noqa: PLC0415
    from pipeline.reachability import unreachable  # noqa: PLC0415

    settings = _settings(namespace)
    client = _client(settings)
    throttle = Throttle.from_settings(client, settings)
    try:
        await change(throttle)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    except (rexc.RedisError, OSError) as exc:
        err.print(
            f"[red]error:[/red] {escape(str(unreachable(settings, 'redis', str(exc))))}",
            highlight=False,
        )
        raise typer.Exit(1) from None
    finally:
        await throttle.close()
        await client.aclose()

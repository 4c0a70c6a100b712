"""``pipeline cancel``: cancel the work of one event id, key or tenant from the command line.

The command calls the same transition as ``await app.cancel(...)`` and the reconciler
(:func:`pipeline.cancel.cancel`), against the Redis the members use (``PIPELINE_REDIS__URL``,
``PIPELINE_REDIS__KEY_PREFIX``).

It lives in :mod:`pipeline.cli`, not in :mod:`pipeline.cancel` (whose package imports
redis-py), and imports Redis, the settings and the declarations when the command runs, not when
``pipeline`` registers it.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.markup import escape

from pipeline.cli_support import err, run_command
from pipeline.errors import ConfigError, TopicSpecError


def _as_read(value: str) -> str:
    """An argument as the members read keys, tenants and event ids (invalid UTF-8 replaced).

    An argument that is not UTF-8 reaches Python with its bytes escaped as surrogates, which
    Redis cannot be sent; a member decodes such bytes in a message with U+FFFD in their place.
    """
    return os.fsencode(value).decode(errors="replace")


def _refuse_blank(values: dict[str, str | None]) -> None:
    """Refuse an option given blank, as ``--tenant "$TENANT"`` gives it when the variable is unset.

    A blank target beside another would be dropped and the other cancelled wider than meant
    (``--key K --tenant ""``: the key for every tenant); a blank reason logs nothing of why.

    Raises:
        ConfigError: the first option given as an empty or all-blank value.
    """
    for option, value in values.items():
        if value is not None and not value.strip():
            what = (
                "say why, as the members log it" if option == "--reason" else "name what to cancel"
            )
            raise ConfigError(
                f"{option} {value!r}: blank (is the variable that gives it unset?); {what}"
            )


def cancel_command(
    event: Annotated[str | None, typer.Option("--event", help="An event id (pl-event-id).")] = None,
    key: Annotated[str | None, typer.Option("--key", help="A message key.")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="A tenant (pl-tenant).")] = None,
    lane: Annotated[
        str | None,
        typer.Option(
            "--lane",
            help="Only this lane. The cancellation stands as long as the lanes it covers"
            " (this one, or every lane of PIPELINE_TOPICS_DIR) keep their work: their longest"
            " retention (a dead-letter topic's at least 14 days) plus the retry path.",
        ),
    ] = None,
    reason: Annotated[
        str, typer.Option("--reason", help="Why, as logged by the members.")
    ] = "cancelled",
) -> None:
    """Cancel queued, parked, retry-tier and running work of an event, key or tenant."""
    from redis.asyncio import Redis  # noqa: PLC0415 - see the module doc

    from pipeline.cancel.target import Target  # noqa: PLC0415
    from pipeline.cancel.transition import KEEP_MS, CancelFailed, cancel  # noqa: PLC0415
    from pipeline.config import load_settings  # noqa: PLC0415
    from pipeline.reachability import named_with_fix  # noqa: PLC0415
    from pipeline.topics.durations import format_duration_ms  # noqa: PLC0415
    from pipeline.topics.spec import load_specs  # noqa: PLC0415

    event, key, tenant = (v if v is None else _as_read(v) for v in (event, key, tenant))
    reason = _as_read(reason)
    try:
        _refuse_blank({"--event": event, "--key": key, "--tenant": tenant, "--reason": reason})
        target = Target.of(event=event, key=key, tenant=tenant, lane=lane)
    except ConfigError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None

    async def main() -> int:
        settings = load_settings()
        if lane is not None:
            specs = load_specs(settings.topics_dir, settings.max_message_bytes)
            lanes = {spec.lane for spec in specs}
            if lane not in lanes:
                known = ", ".join(sorted(lanes)) or "none"
                raise ConfigError(f"--lane: no lane {lane!r} in {settings.topics_dir} ({known})")
        else:
            try:
                specs = load_specs(settings.topics_dir, settings.max_message_bytes)
            except TopicSpecError as exc:
                specs = []  # a cancellation is urgent: it stands the least bound, and says so
                err.print(
                    f"[yellow]warning:[/yellow] {escape(str(exc))}; the cancellation stands"
                    f" {format_duration_ms(KEEP_MS)}, as long as a lane with the least retention"
                    " keeps its work",
                    highlight=False,
                )
        timeout_s = settings.redis.socket_timeout_s
        redis = Redis.from_url(
            settings.redis.url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
        )
        try:
            return await cancel(redis, settings.redis.key_prefix, target, reason, specs=specs)
        except CancelFailed as exc:
            hint = named_with_fix(settings, "redis", "the members' Redis", str(exc))
            raise CancelFailed(f"{exc} ({hint})") from None
        finally:
            await redis.aclose()

    stopped = run_command(main())
    # Only long work (lanes with heartbeat_timeout) is registered, so only it can be counted.
    typer.echo(
        f"cancelled {target} ({reason}); long work told to stop: {stopped}; other work it covers,"
        " running or not, stops when its member next looks (PIPELINE_RUNTIME__CANCEL_POLL_MS)"
    )

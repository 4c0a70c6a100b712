"""What every command-line module shares: the error console, --transport, times and the runner.

The runner turns pipeline errors into one stderr line and an exit code (never a traceback):
2 for bad input or configuration, 1 for a failed operation, 130 for Ctrl-C, and 143 for SIGTERM
in a command that awaits :func:`until_stopped`.

Every command module imports this one to declare its options, so it imports no more than that
takes: the settings (pydantic, redis-py) are imported when a command runs.
"""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from pipeline.cancel_tasks import cancel_until_done
from pipeline.errors import BrokerUnavailable, ConfigError, PipelineError, TopicSpecError
from pipeline.times import utc_time as utc_time  # noqa: PLC0414 - re-exported for the commands

if TYPE_CHECKING:
    from pipeline.reachability import Service

T = TypeVar("T")

err = Console(stderr=True, soft_wrap=True, emoji=False)

PIPE_WIDTH = 200
"""Columns of a table printed to a pipe or file, where rich would otherwise assume 80."""

HELP_MARKUP: Final = "markdown"
"""How a command root reads help texts: each docstring paragraph is reflowed to the terminal's
width (a line break inside it is a space), and a literal in double backquotes is shown as code,
without them."""


def out_console() -> Console:
    """A stdout console: the terminal's width, or :data:`PIPE_WIDTH` when not on a terminal."""
    console = Console(emoji=False)  # ":name:" in a key or a topic is text, not an emoji
    return console if console.is_terminal else Console(width=PIPE_WIDTH, emoji=False)


TransportOpt = Annotated[
    Literal["kafka", "redis"] | None,
    typer.Option("--transport", "-t", help="kafka or redis (default: PIPELINE_TRANSPORT)."),
]


AGE = re.compile(r"^\s*\d+\s*[a-z]+\s*$")
"""An age as typed (``2h``, ``90m``), not an ISO time: the window hint says ages count back."""


def require_window(
    since: str | None, until: str | None, since_ms: int | None, until_ms: int | None, now_ms: int
) -> None:
    """Raise ValueError naming the options unless ``--since``/``--until`` can select anything.

    A ``--since`` after now, or a start not before the end (``--since 1h --until 2h``: an
    hour ago to two hours ago), selects nothing, which a dry run would report as nothing to do
    (``pipeline redrive``: no dead letter failed then; ``pipeline replay``: no row came in).
    ``since_ms``/``until_ms`` are the options read as ms since the epoch, ages counted back from
    ``now_ms``.
    """
    if since_ms is not None and since_ms > now_ms:
        raise ValueError(
            f"--since {since} is after now ({utc_time(now_ms)}): the window selects nothing yet;"
            " give a time in the past, or an age (--since 2h)"
        )
    if since_ms is None or until_ms is None or since_ms < until_ms:
        return
    ages = "ages count back from now: " if any(AGE.match(t or "") for t in (since, until)) else ""
    hint = (
        f"{ages or 'the earlier time goes to --since: '}--since {until} --until {since}"
        if since_ms > until_ms
        else "both give the same time; give --since the earlier time"
    )
    raise ValueError(
        f"--since {since} is not before --until {until}: the window selects nothing ({hint})"
    )


def require_listenable(host: str, port: int, *, variable: str, host_variable: str) -> None:
    """:func:`pipeline.reachability.require_listenable`, imported when called.

    Raises:
        ConfigError: the host is no address or name of this machine, or the port is taken.
    """
    from pipeline.reachability import require_listenable as check  # noqa: PLC0415 - settings

    check(host, port, variable=variable, host_variable=host_variable)


def run_command(
    coro: Coroutine[Any, Any, T],
    *,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> T:
    """Run ``coro`` to completion and map pipeline errors to exit codes."""
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(coro)
    except (ConfigError, TopicSpecError) as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    except BrokerUnavailable as exc:
        line = (exc.diagnose() if exc.diagnose else None) or str(exc) + _where(exc)
        err.print(f"[red]error:[/red] {escape(line)}", highlight=False)
        raise typer.Exit(1) from None
    except PipelineError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


async def until_stopped(coro: Coroutine[Any, Any, T], said: Callable[[str], str | None]) -> T:
    """Await ``coro``; Ctrl-C or SIGTERM cancels it (its cleanup runs) and prints ``said(by)``.

    ``by`` is ``"Ctrl-C"`` or ``"SIGTERM"``. ``said`` is called once, after the cleanup; it may
    print the command's own output of how far it got (a purge's report lines) and returns the
    stderr line, or None for none. Ctrl-C goes on to exit 130, SIGTERM exits 143.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    stopping: asyncio.Task[None] | None = None

    def terminate() -> None:
        nonlocal stopping
        if stopping is None:  # cancelled again until it ends: a cancellation can be lost below
            stopping = loop.create_task(cancel_until_done(task, report=False))

    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        return await task
    except asyncio.CancelledError:
        line = said("SIGTERM" if stopping is not None else "Ctrl-C")
        if line is not None:
            err.print(f"[red]error:[/red] {escape(line)}", highlight=False)
        if stopping is not None:
            raise typer.Exit(143) from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        if stopping is not None:
            await asyncio.wait([stopping])  # it ends with the task, which has ended


def _where(exc: BrokerUnavailable) -> str:
    """Which broker address and variable an unreachable-broker error is about, and the fix.

    The transports translate redis-py errors as "redis unreachable"; any other is Kafka's.
    """
    text = str(exc)
    if "PIPELINE_" in text:  # already says where (pipeline status)
        return ""
    from pipeline.config import load_settings  # noqa: PLC0415 - imported when a command runs
    from pipeline.reachability import named_with_fix  # noqa: PLC0415 - it imports the settings

    try:
        settings = load_settings()
    except ConfigError:
        return ""
    service: Service = "redis" if "redis unreachable" in text else "kafka"
    return f" ({named_with_fix(settings, service, reason=text)})"

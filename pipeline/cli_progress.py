"""Progress of a long command: a bar on a terminal, a count line now and then elsewhere.

rich draws its bar only on a terminal; under a Kubernetes Job, a CronJob or ``| tee`` a redrive
or replay of minutes said nothing until its summary. There it prints one line every ``every_s``
(``redriving pipeline.dlq: 40,000 of 100,000 (40 %)``) instead.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

__all__ = ["progress"]

EVERY_S = 10.0
"""How often a count line is printed when there is no terminal."""


@contextlib.contextmanager
def progress(
    what: str,
    total: int,
    *,
    console: Console,
    disable: bool = False,
    every_s: float = EVERY_S,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)``, to call with each batch of ``n`` items done out of ``total``."""
    if disable:
        yield lambda _: None
        return
    if console.is_terminal:
        text = TextColumn(what.replace("{", "{{").replace("}", "}}"), markup=False)
        columns = (text, BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(what, total=total)
            yield lambda n: bar.advance(task, n)
        return
    done = 0
    last = clock()

    def advance(n: int) -> None:
        nonlocal done, last
        done += n
        now = clock()
        if now - last >= every_s:
            last = now
            share = f" ({100 * done // total} %)" if total else ""
            console.print(f"{what}: {done:,} of {total:,}{share}", markup=False, highlight=False)

    yield advance

"""The consumer runtime: users write ``async def handle(event, ctx)``; this runs it.

Handlers are registered on an :class:`~pipeline.runtime.app.App` per lane (``topics/*.yaml``);
a :class:`~pipeline.runtime.member.Member` is one consumer-group member that fetches, fans work
out per key (:mod:`~pipeline.runtime.lanes`), tracks offsets (:mod:`~pipeline.runtime.offsets`),
pauses partitions under load (:mod:`~pipeline.runtime.flow`), holds retry-tier messages until
due (:mod:`~pipeline.runtime.due`) and routes failures (:mod:`pipeline.retry`).
"""

from pipeline.runtime.app import App
from pipeline.runtime.context import Context

__all__ = ["App", "Context"]

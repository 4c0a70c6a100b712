"""The soak's app, as ``pipeline consume soak_app:app`` imports it from the run's directory.

Its lanes come from the run's ``topics/*.yaml`` (``bench/soak.py`` writes them): ``plain``
writes one byte per event to the file ``SOAK_HANDLED`` names; ``retry`` does the same after
failing, on its first attempt, the events whose ``crc32(event id) % SOAK_FAIL_MODULO`` is 0.
"""

from __future__ import annotations

import os
import zlib

from pipeline.runtime import App, Context

app = App("topics")
FAIL_MODULO = int(os.environ.get("SOAK_FAIL_MODULO", "50"))
_HANDLED = os.open(os.environ["SOAK_HANDLED"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


@app.handler("plain")
async def plain(_event: bytes, _ctx: Context) -> None:
    """One byte per handled event."""
    os.write(_HANDLED, b".")


@app.handler("retry")
async def retry(_event: bytes, ctx: Context) -> None:
    """Fail the chosen events once, then one byte per handled event."""
    if ctx.attempt == 1 and zlib.crc32((ctx.event_id or "").encode()) % FAIL_MODULO == 0:
        raise RuntimeError("injected failure (attempt 1)")
    os.write(_HANDLED, b".")

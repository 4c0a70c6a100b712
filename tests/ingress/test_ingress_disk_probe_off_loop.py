"""The readiness probe's random body is drawn off the event loop, on SQLite and PostgreSQL.

While the ingress is unready after a failed insert it probes each second with a body as large as
its largest row (about 1 MiB by default, more with a larger ``max_message_bytes``). Drawn with
``os.urandom`` in the loop's thread, each probe held the loop some 3 ms a MiB while it answered
webhooks 503 and ``/readyz``; the draw now runs in a worker thread.
"""

from __future__ import annotations

import os
import threading

import pytest

from pipeline.logstore import LogStore, Selection

BODY = 256 * 1024


async def test_the_probe_body_is_drawn_off_the_loop(
    store: LogStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each store's probe draws its body in a thread other than the loop's, and keeps nothing."""
    loop_thread = threading.get_ident()
    drawn: list[tuple[int, int]] = []
    real = os.urandom

    def spy(size: int) -> bytes:
        drawn.append((size, threading.get_ident()))
        return real(size)

    monkeypatch.setattr(os, "urandom", spy)
    await store.probe_write(BODY)
    monkeypatch.undo()
    probes = [thread for size, thread in drawn if size == BODY]
    assert probes, drawn
    assert loop_thread not in probes
    assert await store.select(Selection(), limit=10) == []

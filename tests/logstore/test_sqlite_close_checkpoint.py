"""A last checkpoint that fails at close (a full disk) still closes the store, and loses nothing.

close() copies the WAL back into the database (``TRUNCATE``), which needs room for the database
to grow. On a full disk that copy failed and close() raised before closing its connections: the
ingress's shutdown stopped there (the transport was left open) with a traceback, though every
committed row was safe in the WAL. The disk is made full for the database file by a file size
limit (``RLIMIT_FSIZE``) in a process of its own.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from logstore.helpers import FakeClock

from pipeline.logstore import Selection
from pipeline.logstore.sqlite import SqliteLogStore

ROWS = 300
TESTS = Path(__file__).resolve().parent.parent  # where logstore.helpers is

_CHILD = """
import asyncio, os, resource, signal, sys
sys.path.insert(0, sys.argv[2])
from logstore.helpers import FakeClock, new_row
from pipeline.logstore.sqlite import SqliteLogStore

async def main() -> None:
    store = SqliteLogStore(sys.argv[1], checkpoint_rows=10**9)
    await store.open()
    clock = FakeClock()
    rows = [new_row(n, clock, body=b"x" * 4000) for n in range(int(sys.argv[3]))]
    await asyncio.gather(*(store.insert(row) for row in rows))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, as when full
    limit = os.path.getsize(sys.argv[1])  # the database cannot grow: the WAL is not copied back
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    await store.close()
    print("closed" if store._writer is None else "left open")

asyncio.run(main())
"""


async def test_close_on_a_full_disk_closes_and_keeps_every_row(tmp_path: Path) -> None:
    """close() returns with its connections closed, warns, and the rows are there when reopened."""
    path = tmp_path / "log.db"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD,
        str(path),
        str(TESTS),
        str(ROWS),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), 60)
    assert out.decode().strip() == "closed", err.decode()
    assert "checkpoint at close failed" in err.decode()
    store = SqliteLogStore(path, clock=FakeClock())
    await store.open()
    try:
        assert sum((await store.count_by_state(Selection())).values()) == ROWS
    finally:
        await store.close()

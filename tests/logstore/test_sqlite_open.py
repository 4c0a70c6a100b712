"""Opening the SQLite log where it cannot be: one error naming the path, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.logstore.errors import LogStoreError
from pipeline.logstore.sqlite import SqliteLogStore


@pytest.mark.parametrize("where", ["under a file", "under /proc"])
async def test_a_directory_that_cannot_be_made_is_a_log_store_error(
    where: str, tmp_path: Path
) -> None:
    """A path whose directory cannot be created is a LogStoreError naming the path."""
    if where == "under a file":
        blocker = tmp_path / "sources.yaml"
        blocker.write_text("sources: {}\n", encoding="utf-8")
        path = blocker / "ingress.db"
    else:
        path = Path("/proc/no-such-dir/ingress.db")
    store = SqliteLogStore(path)
    with pytest.raises(LogStoreError) as caught:
        await store.open()
    assert str(path) in str(caught.value)
    assert "\n" not in str(caught.value)

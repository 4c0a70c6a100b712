"""Payloads in a directory every member mounts (an NFS or CSI shared volume).

``file:///mnt/payloads``: objects are files under it; each write goes to a temporary file that
is renamed into place, so a reader never sees half an object. The purge's delete is a rename
too, so a writer that rewrites an object the purge is deleting keeps it
(:meth:`DirectoryPayloadStore.delete_unless_written_since`).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from urllib.parse import urlparse

from obstore.store import LocalStore

from pipeline.offload.errors import OffloadError
from pipeline.offload.objects import ObjectPayloadStore


class DirectoryPayloadStore(ObjectPayloadStore):
    """A payload store in a local or shared directory (created if missing)."""

    def __init__(self, url: str) -> None:
        """Open ``url`` (``file:///absolute/dir``)."""
        self._root = Path(urlparse(url).path)
        super().__init__(url, LocalStore(str(self._root), mkdir=True))

    async def delete_unless_written_since(self, key: str, cutoff_s: float) -> bool:
        """Delete ``key`` unless last written at or after ``cutoff_s``, atomically.

        The file is renamed aside first (atomic), so what is checked is what is deleted: one a
        writer renamed into place before is put back, one renamed into place after stays.
        """
        current = await self.head(key)  # the usual case (young or gone) renames nothing
        if current is None:
            return True
        if current.last_modified.timestamp() >= cutoff_s:
            return False
        try:
            return await asyncio.to_thread(self._delete_unless_written_since, key, cutoff_s)
        except OSError as exc:
            raise OffloadError(
                f"offload store {self.url}: cannot delete {key}: {exc.strerror or exc}"
            ) from exc

    def _delete_unless_written_since(self, key: str, cutoff_s: float) -> bool:
        path = self._root / key
        aside = path.with_name(f"{path.name}.purging-{uuid.uuid4().hex[:8]}")
        try:
            path.rename(aside)
        except FileNotFoundError:
            return True
        if aside.stat().st_mtime >= cutoff_s:  # rewritten since the look: back into place
            aside.replace(path)  # a writer's copy renamed in meanwhile has the same bytes
            return False
        aside.unlink()
        return True

"""Payloads in a directory every member mounts (an NFS or CSI shared volume).

``file:///mnt/payloads``: objects are files under it; each write goes to a temporary file that
is renamed into place, so a reader never sees half an object.
"""

from __future__ import annotations

from urllib.parse import urlparse

from obstore.store import LocalStore

from pipeline.offload.objects import ObjectPayloadStore


class DirectoryPayloadStore(ObjectPayloadStore):
    """A payload store in a local or shared directory (created if missing)."""

    def __init__(self, url: str) -> None:
        """Open ``url`` (``file:///absolute/dir``)."""
        super().__init__(url, LocalStore(urlparse(url).path, mkdir=True))

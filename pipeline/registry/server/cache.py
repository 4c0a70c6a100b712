"""A least-recently-used cache bounded by the bytes of what it holds, not by its entry count.

The registry keeps parsed stored schemas and schemas by id in memory. Bounded by count
(10,000 entries), 400 KiB schemas could hold gigabytes; bounded by bytes, it cannot pass
``max_bytes`` (an entry larger than that is simply not kept). Thread-safe: the registry's
handlers run in a thread pool.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class ByteBoundedCache(Generic[K, V]):
    """Maps keys to values, evicting the least recently used past ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        """Hold at most ``max_bytes`` (as sized by the caller on :meth:`put`)."""
        self._max_bytes = max_bytes
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def size_bytes(self) -> int:
        """The bytes held now."""
        return self._bytes

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or None."""
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            self._entries.move_to_end(key)
            return hit[0]

    def put(self, key: K, value: V, size_bytes: int) -> None:
        """Keep ``value`` for ``key``, counted as ``size_bytes``; evict to stay under the cap."""
        if size_bytes > self._max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, size_bytes)
            self._bytes += size_bytes
            while self._bytes > self._max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted

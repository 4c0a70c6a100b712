"""Load a Redis Functions library once and call its functions, reloading it if Redis lost it.

Each ``.lua`` library file lives beside the Python that owns it and starts with
``#!lua name=<library>``; it is loaded on first use. A call that finds the function missing (a
Redis restarted without persistence, or ``FUNCTION FLUSH``) reloads the library and retries once.

Libraries are versioned by their code: ``gd_begin`` of a library whose source hashes to
``3f9a0c1e`` is loaded as ``gd_begin_3f9a0c1e`` in the library ``pipeline_guard_3f9a0c1e``.
During a rolling deploy, members of the old and the new release share one Redis; under one name,
each would ``FUNCTION LOAD REPLACE`` the other's code and call functions whose arguments changed
under them. Side by side, each release calls its own. A library of a release no member runs any
more stays loaded, a few kilobytes; ``FUNCTION DELETE`` removes it.

A call never absorbs its task's cancellation. redis-py writes each command under
``asyncio.wait_for`` (its ``socket_timeout``, 5 s by default), and on Python 3.11 ``wait_for``
returns the inner result instead of raising when the cancellation arrives in the same turn of
the loop as the write completes (CPython issue 86296, fixed in 3.12). A call that returns while
a cancellation was requested during it therefore raises :class:`asyncio.CancelledError`: a
throttle acquisition cancelled that way went on to wait for its grant forever.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.cancel_tasks import raise_absorbed_cancel
from pipeline.redis_channel import channel_of

LONGEST_EXPIRY_MS = 2**62
"""The longest expiry given a key (or an end time written) through these functions: Redis refuses
one reaching past 2**63 ms from the epoch, and a lane may retain its messages up to 2**63-1 ms
(Kafka's "forever"). Such a count passes 2**53, so the Lua takes it as its digits, never through
``tonumber()`` (a float reaches Redis in a form it refuses)."""

FAILED = (rexc.RedisError, rexc.RedisClusterException, OSError)
"""Redis out of reach or answering an error; ``RedisClusterException`` (no node of a Redis
Cluster answering) is no ``RedisError``."""


def is_missing(error: BaseException) -> bool:
    """True if ``error`` says the called function is not loaded."""
    return isinstance(error, rexc.ResponseError) and "Function not found" in str(error)


_LIBRARY_NAME = re.compile(r"^#!lua name=(\w+)", re.MULTILINE)
_REGISTERED = re.compile(r"(redis\.register_function\s*[({]\s*(?:function_name\s*=\s*)?')(\w+)'")


def versioned(source: str) -> tuple[str, str]:
    """The library's code with its library and function names suffixed by its version."""
    version = hashlib.sha256(source.encode()).hexdigest()[:8]
    if not _LIBRARY_NAME.search(source):
        raise ValueError("a Redis Functions library starts with '#!lua name=<library>'")
    source = _LIBRARY_NAME.sub(rf"#!lua name=\1_{version}", source, count=1)
    return _REGISTERED.sub(rf"\1\2_{version}'", source), version


class FunctionLibrary:
    """One Lua library on one Redis client, under names that carry its version."""

    def __init__(self, client: Redis, source: str) -> None:
        """Bind ``source`` (the library's code) to ``client``; loading waits for first use."""
        self.client = client
        self._source, self.version = versioned(source)
        self._loaded = False
        self._loading: asyncio.Future[None] | None = None

    def name(self, function: str) -> str:
        """The loaded name of ``function`` (``gd_begin`` -> ``gd_begin_<version>``)."""
        return f"{function}_{self.version}"

    async def load(self) -> None:
        """``FUNCTION LOAD REPLACE`` the library."""
        await self.client.function_load(self._source, replace=True)
        self._loaded = True

    async def ensure_loaded(self) -> None:
        """Load the library unless this process already did (concurrent first calls load once)."""
        if self._loaded:
            return
        if self._loading is None:
            self._loading = asyncio.ensure_future(self.load())
            self._loading.add_done_callback(self._loaded_or_not)
        await asyncio.shield(self._loading)

    def _loaded_or_not(self, loading: asyncio.Future[None]) -> None:
        """A failed load is tried again by the next call, and its error is read here.

        Its callers may all have been cancelled meanwhile (a member stopping while Redis did not
        answer yet): unread, the error would be logged as a task's exception never retrieved.
        """
        failed = loading.cancelled() or loading.exception() is not None
        if failed and self._loading is loading:
            self._loading = None

    async def fcall(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """``FCALL name`` with ``keys`` and ``args``, reloading the library once if needed.

        Through the client's :class:`~pipeline.redis_channel.FunctionChannel` when one is bound
        to it (``pipeline consume`` binds one), else through redis-py.
        """
        with raise_absorbed_cancel():  # requested during the call and absorbed on the way
            if not self._loaded:
                await self.ensure_loaded()
            loaded = self.name(name)
            try:
                reply = await self._call(loaded, keys, args)
            except rexc.ResponseError as exc:
                if not is_missing(exc):
                    raise
                await self.load()
                reply = await self._call(loaded, keys, args)
        return reply

    async def _call(self, loaded: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        channel = channel_of(self.client)
        if channel is not None:
            return await channel.fcall(loaded, keys, args)
        return await self.client.fcall(loaded, len(keys), *keys, *args)

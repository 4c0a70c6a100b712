"""Redis Functions calls of one process, pipelined over one connection of their own.

The guard, the throttle and the cancel gate make one or more ``FCALL`` per message they touch,
so what a call costs the member's CPU bounds them. redis-py spends about 100 µs of CPU on one
(a connection checked out of the pool and back, the retry wrapper, a timeout context and a
stream read per reply); a command written to an open connection and its reply parsed by hiredis
as it arrives cost a fraction of that. A :class:`FunctionChannel` does only that:

* each call goes out on one connection in the same turn of the event loop, and replies are
  matched to calls in order (Redis answers a connection's commands in the order it read them),
  so concurrent calls share the connection without waiting for each other's round trips; the
  calls made in one turn of the loop (the guard's batched starts and ends, a route, a
  throttle's acquire) leave in one write, at the start of the next turn, since each write to a
  socket costs a system call and, on a busy host, a wake-up of the server's thread;
* only ``FCALL``: a function never blocks the server, so one connection serves every call in
  Redis's own order (blocking commands stay on redis-py's pool);
* the client's settings: host, port, database, username and password, name, socket timeouts and
  its retry policy (a call that times out or loses its connection is tried again as redis-py
  would, after closing the connection), and its errors (``redis.exceptions``), so the callers'
  fail-open handling is unchanged;
* a call whose reply does not come within the socket timeout fails with ``TimeoutError`` and
  closes the connection (every call still waiting on it fails the same way); the next call
  connects again.

:func:`open_channel` makes one for a client whose connections it can speak for (TCP, RESP2, no
TLS or credential provider), binds it to that client, and :meth:`FunctionLibrary.fcall
<pipeline.redis_functions.FunctionLibrary.fcall>` then sends through it; other clients (TLS,
Unix sockets, clusters, the in-process fakes) keep redis-py's path. The owner closes the
channel with the client (``pipeline consume`` does for its Redis client, the Redis Streams
transport for its own, whose produce batches go through :meth:`FunctionChannel.fcall_many`).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import hiredis
from redis import exceptions as rexc
from redis._parsers.base import BaseParser
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry

__all__ = ["FunctionChannel", "channel_of", "open_channel"]

_UNSUPPORTED = ("credential_provider", "ssl", "path", "connection_class")


def _pack(args: tuple[Any, ...]) -> bytes:
    """One command in RESP, as redis-py encodes its arguments (bytes, str, int, float).

    hiredis packs it in C (floats as ``repr`` writes them, str as UTF-8); anything else (a bool,
    None) is refused with redis-py's error.
    """
    try:
        return hiredis.pack_command(args)  # type: ignore[no-any-return]
    except TypeError:
        bad = next(
            (a for a in args if isinstance(a, bool) or not isinstance(a, (bytes, str, int, float))),
            None,
        )
        raise rexc.DataError(
            f"Invalid input of type: {type(bad).__name__!r}. Convert to a bytes, string, "
            "int or float first."
        ) from None


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A future nobody waits for any more (a connect, a batch's later calls) logs no failure."""
    if not future.cancelled():
        future.exception()


class _Wire(asyncio.Protocol):
    """One connection: calls wait in ``pending``, in the order they were written."""

    def __init__(self, timeout_s: float | None, encoding: str | None) -> None:
        self.timeout_s = timeout_s
        kwargs: dict[str, Any] = {
            "protocolError": rexc.InvalidResponse,
            "replyError": BaseParser.parse_error,
        }
        if encoding is not None:
            kwargs["encoding"] = encoding
        self._reader = hiredis.Reader(**kwargs)
        self.pending: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._out: list[bytes] = []
        """Commands written since the last flush (they leave together, in order)."""
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # TCP (uvloop's is no subclass)

    def send(self, command: bytes) -> asyncio.Future[Any]:
        """Write ``command``; the future settles with its reply (or the connection's failure)."""
        return self.send_many((command,))[0]

    def send_many(self, commands: Sequence[bytes]) -> list[asyncio.Future[Any]]:
        """Write ``commands``, with the others of this loop turn; one future each, in order."""
        if self.lost or self.transport is None:
            raise rexc.ConnectionError("the Redis connection of the function channel is closed")
        loop = self._loop
        deadline = 0.0 if self.timeout_s is None else loop.time() + self.timeout_s
        futures = [loop.create_future() for _ in commands]
        self.pending.extend((future, deadline) for future in futures)
        if not self._out:
            loop.call_soon(self._flush)
        self._out += commands
        if self._timer is None and self.timeout_s is not None:
            self._timer = loop.call_at(deadline, self._check)
        return futures

    def _flush(self) -> None:
        """Write what this turn's calls sent, in one write.

        Nothing once the connection failed: their futures failed with it.
        """
        out, self._out = self._out, []
        if out and not self.lost and self.transport is not None:
            self.transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        pending = self.pending
        while True:
            try:
                reply = self._reader.gets()
            except rexc.InvalidResponse as exc:
                self.fail(exc)
                return
            if reply is False:
                return
            if not pending:
                self.fail(rexc.InvalidResponse("Redis sent a reply to no call"))
                return
            future, _ = pending.popleft()
            if future.done():  # its caller was cancelled: the reply is dropped, order kept
                continue
            if isinstance(reply, Exception):  # an error reply, as redis-py's parser maps it
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def _check(self) -> None:
        """The oldest call's deadline: fail the connection if it passed, else wait for it."""
        self._timer = None
        if not self.pending or self.lost:
            return
        deadline = self.pending[0][1]
        if self._loop.time() >= deadline:
            self.fail(rexc.TimeoutError(f"Redis did not answer within {self.timeout_s} s"))
        else:
            self._timer = self._loop.call_at(deadline, self._check)

    def fail(self, error: Exception) -> None:
        """Close the connection; every call still waiting fails with ``error``."""
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self.pending:
            future, _ = self.pending.popleft()
            if not future.done():
                future.set_exception(error)
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc is not None else ""
        self.fail(rexc.ConnectionError(f"Redis closed the function channel's connection{reason}"))


class FunctionChannel:
    """``FCALL`` to one Redis server over one pipelined connection, opened on first use."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
        retry: Retry | None = None,
        encoding: str | None = None,
        client_name: str | None = None,
    ) -> None:
        """Connect to ``host:port`` when first called; ``retry`` as the client's own."""
        self._address = (host, port)
        self._db = db
        self._username = username
        self._password = password
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._retry = retry
        self._encoding = encoding
        self._client_name = client_name
        self._wire: _Wire | None = None
        self._connecting: asyncio.Future[_Wire] | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    async def fcall(self, function: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """``FCALL function`` with ``keys`` and ``args``: its reply, or redis-py's error."""
        command = _pack(("FCALL", function, len(keys), *keys, *args))
        try:
            return await self._once(command)  # the common case, without the retry machinery
        except (rexc.ConnectionError, rexc.TimeoutError) as error:
            if self._retry is None or self._closed:
                raise
            first: list[Exception] = [error]

        async def attempt() -> Any:
            if first:  # the attempt above, counted as the retry policy's first failure
                raise first.pop()
            return await self._once(command)

        return await self._retry.call_with_retry(attempt, self._dropped)

    async def fcall_many(
        self, function: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """One ``FCALL function`` per ``(keys, args)``, written at once, replies in order.

        An error reply comes back in its place, as an exception (redis-py's pipeline with
        ``raise_on_error=False``); a lost connection or a timeout fails the whole call, which is
        tried again under the client's retry policy as redis-py retries a pipeline.
        """
        commands = [_pack(("FCALL", function, len(keys), *keys, *args)) for keys, args in calls]

        async def attempt() -> list[Any]:
            replies: list[Any] = []
            futures = (await self._live_wire()).send_many(commands)
            try:
                for future in futures:
                    try:
                        replies.append(await future)
                    except rexc.ResponseError as error:
                        replies.append(error)
            except BaseException:
                for future in futures:  # they fail with the one raised: not lost, not logged
                    future.add_done_callback(_retrieved)
                raise
            return replies

        if self._retry is None:
            return await attempt()
        return await self._retry.call_with_retry(attempt, self._dropped)

    async def _once(self, command: bytes) -> Any:
        return await (await self._live_wire()).send(command)

    async def _live_wire(self) -> _Wire:
        """The open connection, or a new one."""
        wire = self._wire
        if wire is None or wire.lost:
            wire = await self._connected()
        return wire

    async def _dropped(self, _error: Exception) -> None:
        """A failed attempt: a connection that failed is replaced by the next attempt.

        Only a failed one: another call may have connected again meanwhile, and an error reply
        redis-py counts as a connection error (``LOADING``) leaves the connection sound.
        """
        if self._wire is not None and self._wire.lost:
            self._wire = None

    async def _connected(self) -> _Wire:
        if self._closed:
            raise rexc.ConnectionError("the function channel is closed")
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
            self._connecting.add_done_callback(_retrieved)
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done():
                self._connecting = None

    async def _connect(self) -> _Wire:
        loop = asyncio.get_running_loop()
        host, port = self._address
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, wire = await loop.create_connection(
                    lambda: _Wire(self._timeout_s, self._encoding), host, port
                )
        except TimeoutError as exc:
            raise rexc.TimeoutError(f"connecting to Redis at {host}:{port} timed out") from exc
        except OSError as exc:
            raise rexc.ConnectionError(
                f"cannot connect to Redis at {host}:{port}: {exc.strerror or exc}"
            ) from exc
        hello: list[asyncio.Future[Any]] = []
        if self._password is not None:
            auth = (self._username, self._password) if self._username else (self._password,)
            hello.append(wire.send(_pack(("AUTH", *auth))))
        if self._db:
            hello.append(wire.send(_pack(("SELECT", self._db))))
        if self._client_name:
            hello.append(wire.send(_pack(("CLIENT", "SETNAME", self._client_name))))
        try:
            for reply in hello:
                await reply
        except rexc.RedisError:
            wire.fail(rexc.ConnectionError("the function channel's connection was refused"))
            raise
        if self._closed:  # closed while connecting
            wire.fail(rexc.ConnectionError("the function channel is closed"))
            raise rexc.ConnectionError("the function channel is closed")
        self._wire = wire
        return wire

    async def aclose(self) -> None:
        """Close the connection; calls still waiting fail with ``ConnectionError``."""
        self._closed = True
        if self._connecting is not None:
            with contextlib.suppress(Exception):
                await self._connecting
        wire, self._wire = self._wire, None
        if wire is not None and not wire.lost:
            wire.fail(rexc.ConnectionError("the function channel is closed"))
        await asyncio.sleep(0)  # let the aborted transport release its socket


_channels: dict[int, tuple[weakref.ref[Redis], FunctionChannel]] = {}


def open_channel(client: Redis) -> FunctionChannel | None:
    """A channel speaking for ``client``'s connections, bound to it; None if it cannot.

    A client bound already keeps its open channel.

    It cannot for a client whose connections are not plain TCP with RESP2 and a password at
    most (TLS, a Unix socket, a credential provider, RESP3, another connection class).
    """
    bound = channel_of(client)
    if bound is not None:
        return bound
    pool = client.connection_pool
    settings = pool.connection_kwargs
    plain = pool.connection_class is Connection or getattr(
        pool.connection_class, "plain_tcp_resp", False
    )
    if not plain or any(k in settings for k in _UNSUPPORTED):
        return None
    if str(settings.get("protocol") or 2) != "2":
        return None
    channel = FunctionChannel(
        str(settings.get("host", "localhost")),
        int(settings.get("port", 6379)),
        db=int(settings.get("db") or 0),
        username=settings.get("username"),
        password=settings.get("password"),
        timeout_s=settings.get("socket_timeout"),
        connect_timeout_s=settings.get("socket_connect_timeout"),
        retry=client.get_retry(),
        encoding=settings.get("encoding", "utf-8") if settings.get("decode_responses") else None,
        client_name=settings.get("client_name"),
    )
    key = id(client)
    _channels[key] = (weakref.ref(client, lambda _ref: _channels.pop(key, None)), channel)
    return channel


def channel_of(client: Redis) -> FunctionChannel | None:
    """The channel :func:`open_channel` bound to ``client``, if it is open."""
    entry = _channels.get(id(client))
    if entry is None or entry[0]() is not client or entry[1].closed:
        return None
    return entry[1]

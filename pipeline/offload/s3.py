"""Payloads in an S3-compatible service (AWS S3, S3Proxy, MinIO, R2, ...).

``s3://bucket/prefix``. Credentials, region and endpoint come from the usual variables, read
by obstore: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION`` and ``AWS_ENDPOINT_URL`` (for a service other than AWS; an ``http://``
endpoint is allowed, for a local S3Proxy). The bucket must exist.

Every request gives up after ``PIPELINE_OFFLOAD_TIMEOUT_S`` (default 5 s) without progress:
connecting, waiting for an answer, or between two slices of a write's body. A write is one
``PUT`` (presigned, its body streamed with httpx in 256 KiB slices, each with its own timeout),
so a large payload whose bytes keep flowing takes as long as it needs, while a store that
accepts the connection and never reads or answers fails within the timeout. The S3 client's
read timeout runs from a request's start until its answer, body included; a write through it
would fail whenever its body took longer than that. Reads go through the S3 client, with no
bound on a request as a whole: a handler may take a payload's chunks as slowly as it needs,
and only a read that waits the timeout for bytes fails.

Deletes are single-object ``DeleteObject`` requests (presigned, sent with httpx): obstore
deletes through the batch ``DeleteObjects`` call, which not every S3-compatible service
implements (S3Proxy's filesystem backend answers 501).

Writes and deletes share a pool of kept-alive connections (at most
:data:`KEPT_ALIVE_CONNECTIONS` idle, each kept :data:`KEPT_ALIVE_S`), one per event loop, so a
burst of objects costs no TCP (and TLS) handshake per object and leaves no connection per
object in ``TIME_WAIT``. A kept-alive connection the service closed fails before any answer;
the request is then sent again on a fresh one. The pool is closed as its event loop shuts down,
even when its store was dropped before.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import socket
import ssl
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import timedelta
from typing import TYPE_CHECKING

import httpx
import obstore
from obstore.store import S3Store

from pipeline.errors import ConfigError
from pipeline.offload.errors import (
    NO_SUCH_BUCKET,
    REFUSED_CREDENTIALS,
    OffloadError,
    bucket_missing,
    client_error_text,
    no_such_bucket,
    unanswered,
)
from pipeline.offload.objects import ObjectPayloadStore

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config

    from pipeline.offload.store import StoredObject


_SIGNED_FOR = timedelta(minutes=5)
TIMEOUT_VARIABLE = "PIPELINE_OFFLOAD_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 5.0
"""Seconds a request may go without progress (connect, answer, a slice of a body)."""
_MAX_TIMEOUT_S = 300.0
_SLICE_BYTES = 256 * 1024
_WHOLE_REQUEST = timedelta(days=1)
_PUT_ATTEMPTS = 4
"""A write's tries, as the S3 client's ``max_retries`` of 3 (within the timeout)."""
_S3_CODE = re.compile(r"<Code>([^<]{1,100})</Code>")
_ANSWERED = re.compile(r"non-2xx status code: 4\d\d")
"""The S3 client's text of a request the service refused (a 4xx): an answer, not a blip."""
_UNSENT_CAP = (
    [(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, _SLICE_BYTES)]
    if hasattr(socket, "TCP_NOTSENT_LOWAT")
    else []
)
"""A write waits while more than a slice is queued in the kernel unsent, so the wait for the
answer after the last slice is not also the time to send megabytes the kernel took at once."""
KEPT_ALIVE_CONNECTIONS = 32
"""Idle connections to the store kept for the next write or delete (more at once are opened)."""
KEPT_ALIVE_S = 5.0
"""Seconds an idle connection is kept: below the services' own idle timeouts (S3: about 20)."""
_DELETE_TIMEOUT_S = 30.0
BUCKET_SEEN_S = 60.0
"""Seconds a bucket seen to exist is not asked about again when a HEAD finds no object."""


def _refused(status: int) -> str:
    """What a 403 from the store means, as a suffix of its line; "" for another status."""
    return f" ({REFUSED_CREDENTIALS})" if status == httpx.codes.FORBIDDEN else ""


_CHAIN_MOST = 12
"""The most exceptions of a chain :func:`_chain` says."""


def _chain(exc: BaseException) -> str:
    """``exc`` and what caused it, each as ``Type: text`` (a refused connection is wrapped)."""
    said: list[str] = []
    seen: list[BaseException] = [exc]
    while seen and len(said) < _CHAIN_MOST:
        current = seen.pop(0)
        said.append(f"{type(current).__name__}: {current}")
        if isinstance(current, BaseExceptionGroup):
            seen.extend(current.exceptions)
        cause = current.__cause__ or current.__context__
        if cause is not None:
            seen.append(cause)
    return " | ".join(said)


def timeout_s() -> float:
    """``PIPELINE_OFFLOAD_TIMEOUT_S`` in seconds (default 5).

    Raises:
        ConfigError: not a number of seconds above 0 and at most 300.
    """
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= _MAX_TIMEOUT_S:
        raise ConfigError(
            f"{TIMEOUT_VARIABLE}={text!r}: expected seconds above 0 and at most"
            f" {_MAX_TIMEOUT_S:g}, like 5 or 2.5"
        )
    return value


def _unsigned_payload() -> bool:
    """``AWS_UNSIGNED_PAYLOAD``: true (the default) leaves bodies unsigned, false signs them.

    Raises:
        ConfigError: a value that is neither.
    """
    text = os.environ.get("AWS_UNSIGNED_PAYLOAD", "").strip().lower()
    if text in {"", "true", "1", "yes", "on"}:
        return True
    if text in {"false", "0", "no", "off"}:
        return False
    raise ConfigError(f"AWS_UNSIGNED_PAYLOAD={text!r}: expected true (the default) or false")


def _first_listed(store: S3Store, prefix: str) -> None:
    """List one page of at most one key under ``prefix``: S3's answer tells the bucket exists."""
    next(iter(obstore.list(store, prefix, chunk_size=1)), None)


async def _slices(data: bytes | memoryview) -> AsyncIterator[bytes]:
    """``data`` in slices of 256 KiB: each is sent under its own write timeout."""
    view = memoryview(data)
    for start in range(0, len(view), _SLICE_BYTES):
        yield bytes(view[start : start + _SLICE_BYTES])


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every connection (loading the CA bundle costs ~0.1 s of CPU)."""
    return ssl.create_default_context()


_LIVES: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, list[AsyncGenerator[httpx.AsyncClient]]
] = weakref.WeakKeyDictionary()
"""Every pool's holder, kept until its event loop shuts down, whatever its store's life: a
holder finalized when its store was dropped would close the pool in a task the loop's shutdown
may cancel first (its sockets then left to warn as unclosed)."""


async def _pool_life(client: httpx.AsyncClient) -> AsyncGenerator[httpx.AsyncClient]:
    """Holds ``client`` open; closed when its event loop shuts down.

    An async generator, kept in :data:`_LIVES`, so the loop's own shutdown closes it:
    ``asyncio.run`` (and any ``asyncio.Runner``) finalizes the live ones after cancelling the
    tasks, so the close itself is never cancelled.
    """
    try:
        yield client
    finally:
        await client.aclose()


class S3PayloadStore(ObjectPayloadStore):
    """A payload store in an S3 bucket, under the URL's prefix."""

    def __init__(self, url: str) -> None:
        """Open ``url`` (``s3://bucket/prefix``); nothing is contacted yet.

        Raises:
            ConfigError: a bad ``PIPELINE_OFFLOAD_TIMEOUT_S``.
        """
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT") or ""
        self.timeout_s = timeout_s()
        timeout = timedelta(seconds=self.timeout_s)
        options: ClientConfig = {
            "allow_http": endpoint.startswith("http://"),
            "connect_timeout": timeout,
            "read_timeout": timeout,
            # No bound on a request as a whole (the client's default is 30 s): a handler may
            # stream a large payload into a slow sink for longer; a stalled read still fails.
            "timeout": _WHOLE_REQUEST,
        }
        # A webhook waits on the write: give up within seconds (503, the provider retries)
        # rather than obstore's default of ten retries over three minutes. A failure that
        # comes at once is retried; a request that timed out is not tried again.
        retry: RetryConfig = {"max_retries": 3, "retry_timeout": timeout}
        config: S3Config = {}
        self._signed_bodies = not _unsigned_payload()
        if not self._signed_bodies:
            # Every read checks the payload's SHA-256 against its reference, end to end: signing
            # the body as well would hash it once more here and once more in the service.
            config["unsigned_payload"] = True
        if not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
            config["region"] = "us-east-1"  # what an S3-compatible service takes by default
        super().__init__(
            url, S3Store.from_url(url, config=config, client_options=options, retry_config=retry)
        )
        self._pools: dict[
            asyncio.AbstractEventLoop,
            tuple[httpx.AsyncClient, AsyncGenerator[httpx.AsyncClient]],
        ] = {}
        self._bucket_seen_until = 0.0
        self._bucket_asked: dict[asyncio.AbstractEventLoop, asyncio.Task[bool]] = {}

    async def head(self, key: str) -> StoredObject | None:
        """The object at ``key``, or None; an error when the bucket itself does not exist.

        S3 answers a HEAD in a missing bucket as it answers one of a missing object (404, no
        body), so on a 404 the bucket is asked about with a one-key listing, at most once every
        :data:`BUCKET_SEEN_S` while it exists: a typo in ``offload.store`` is a store failure
        (a 503, a retry) naming the bucket, not an object that was never written or is gone.
        The 404s that come while a listing is under way wait for its answer (one listing, not
        one per read).

        Raises:
            OffloadError: the store failed, or the bucket does not exist.
        """
        found = await super().head(key)
        if (
            found is None
            and time.monotonic() >= self._bucket_seen_until
            and not await self._bucket_exists(key)
        ):
            raise OffloadError(
                f"offload store {self.url}: cannot read {key}: {bucket_missing(self.url)}"
            )
        return found

    async def _bucket_exists(self, key: str) -> bool:
        """Whether the bucket exists, as the listing under way in this event loop answers."""
        loop = asyncio.get_running_loop()
        asking = self._bucket_asked.get(loop)
        if asking is None:
            asking = self._bucket_asked[loop] = loop.create_task(self._ask_bucket(key))
            asking.add_done_callback(lambda _: self._bucket_asked.pop(loop, None))
        return await asyncio.shield(asking)  # a caller cancelled leaves the others their answer

    async def _ask_bucket(self, key: str) -> bool:
        """List one key: False when S3 says the bucket does not exist, else True.

        An answer, or a refusal (a 4xx: a key without ``s3:ListBucket`` cannot tell, and never
        will), holds for :data:`BUCKET_SEEN_S`; a failure otherwise (a 5xx, a timeout, no
        answer) lets the HEAD's 404 stand and the next 404 asks again.
        """
        try:
            await asyncio.to_thread(_first_listed, self._store, key)
        except Exception as exc:
            if no_such_bucket(exc):
                return False
            if not _ANSWERED.search(str(exc)):
                return True
        self._bucket_seen_until = time.monotonic() + BUCKET_SEEN_S
        return True

    async def _client(self) -> httpx.AsyncClient:
        """The kept-alive connections of the running event loop (opened on first use)."""
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None or pool[0].is_closed:
            for gone in [old for old in self._pools if old.is_closed()]:
                del self._pools[gone]
            limits = httpx.Limits(
                max_connections=None,
                max_keepalive_connections=KEPT_ALIVE_CONNECTIONS,
                keepalive_expiry=KEPT_ALIVE_S,
            )
            transport = httpx.AsyncHTTPTransport(
                verify=_tls(), socket_options=_UNSENT_CAP, limits=limits
            )
            client = httpx.AsyncClient(timeout=self.timeout_s, transport=transport)
            life = _pool_life(client)
            self._pools[loop] = (client, life)
            _LIVES.setdefault(loop, []).append(life)
            await anext(life)  # the loop now finalizes it
            return client
        return pool[0]

    async def put(self, key: str, data: bytes | memoryview) -> None:
        """Write ``data`` at ``key`` with one presigned ``PUT``, its body streamed in slices.

        A failure that comes at once (a refused connection, a 5xx) is tried again, as the S3
        client does, while the first try began less than the timeout ago. With
        ``AWS_UNSIGNED_PAYLOAD=false`` (bodies signed), through the S3 client instead: each of
        its requests, body included, must then finish within the timeout.
        """
        if self._signed_bodies:
            await super().put(key, data)
            return
        began = time.monotonic()
        try:
            url = obstore.sign(self._store, "PUT", key, _SIGNED_FOR)  # local: no request
        except Exception as exc:  # no credentials
            raise OffloadError(
                f"offload store {self.url}: cannot write {key}: {self._error_text(exc)}"
            ) from exc
        for attempt in range(_PUT_ATTEMPTS):
            try:
                answer = await self._put_once(url, data)
            except httpx.TimeoutException as exc:
                raise OffloadError(
                    f"offload store {self.url}: cannot write {key}: {self._error_text(exc)}"
                ) from exc
            except Exception as exc:
                failure: BaseException | httpx.Response = exc
            else:
                if answer.status_code == httpx.codes.OK:
                    return
                failure = answer
            transient = (
                not isinstance(failure, httpx.Response)
                or failure.status_code >= httpx.codes.INTERNAL_SERVER_ERROR
            )
            waited_s = time.monotonic() - began
            if not transient or attempt + 1 == _PUT_ATTEMPTS or waited_s >= self.timeout_s:
                break
            await asyncio.sleep(0.1 * 2**attempt)
        raise self._write_failed(key, failure) from (
            None if isinstance(failure, httpx.Response) else failure
        )

    def _write_failed(self, key: str, failure: BaseException | httpx.Response) -> OffloadError:
        """The error of a write of ``key`` that ended with ``failure`` (an answer or an error)."""
        if not isinstance(failure, httpx.Response):
            return OffloadError(
                f"offload store {self.url}: cannot write {key}: {self._error_text(failure)}"
            )
        code = _S3_CODE.search(failure.text)
        if code is not None and code[1] == NO_SUCH_BUCKET:
            return OffloadError(
                f"offload store {self.url}: cannot write {key}: {bucket_missing(self.url)}"
            )
        return OffloadError(
            f"offload store {self.url}: cannot write {key}: HTTP {failure.status_code}"
            f"{' ' + code[1] if code else ''} from {failure.url.host}:{failure.url.port}"
            f"{_refused(failure.status_code)}"
        )

    async def _put_once(self, url: str, data: bytes | memoryview) -> httpx.Response:
        client = await self._client()
        return await client.put(
            url, content=_slices(data), headers={"Content-Length": str(len(data))}
        )

    def _error_text(self, exc: BaseException) -> str:
        """The client's error ``exc`` as one line; a timeout says so and names the variable."""
        waited = f"no answer within {self.timeout_s:g} s ({TIMEOUT_VARIABLE})"
        if no_such_bucket(exc):
            return bucket_missing(self.url)
        if isinstance(exc, httpx.RequestError):
            where = f"{exc.request.url.host}:{exc.request.url.port}"
            if isinstance(exc, httpx.TimeoutException):
                return f"{waited} from {where}"
            if isinstance(exc, httpx.ConnectError):
                said = unanswered(_chain(exc), str(exc.request.url))
                if said is not None:
                    return said
            return f"{client_error_text(exc)} ({where})"
        if "kind: Timeout" in str(exc):  # the S3 client's debug text of a timed-out request
            return f"{waited}: {client_error_text(exc)}"
        return client_error_text(exc)

    async def delete(self, key: str) -> None:
        """Delete ``key`` with one ``DELETE`` (S3 answers 204 whether or not it existed)."""
        try:
            url = obstore.sign(self._store, "DELETE", key, _SIGNED_FOR)  # local: no request
            client = await self._client()
            try:
                answer = await client.delete(url, timeout=_DELETE_TIMEOUT_S)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                # A kept-alive connection the service had closed: once more, on a fresh one.
                answer = await client.delete(url, timeout=_DELETE_TIMEOUT_S)
        except Exception as exc:
            raise OffloadError(
                f"offload store {self.url}: cannot delete {key}: {self._error_text(exc)}"
            ) from exc
        if answer.status_code not in (200, 204, 404):
            raise OffloadError(
                f"offload store {self.url}: cannot delete {key}: HTTP {answer.status_code}"
                f"{_refused(answer.status_code)}"
            )

"""The bucket check of an S3 store whose HEAD found no object (one listing, what it caches).

On S3Proxy, and (for the answers S3Proxy cannot give: a key refused the listing, a listing that
fails) on a small S3 stand-in that answers every HEAD 404 and every listing as told.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal
from urllib.parse import urlparse

import httpx
import obstore
import pytest
from obstore.store import S3Store
from offload.helpers import S3PROXY
from support import require_service

from pipeline.offload import s3
from pipeline.offload.errors import OffloadError
from pipeline.offload.store import open_store

READS_AT_ONCE = 50


@pytest.fixture
def s3proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """S3Proxy's address and keys (the environment wins when it names another service)."""
    for name, value in S3PROXY.items():
        if not os.environ.get(name):
            monkeypatch.setenv(name, value)
    endpoint = urlparse(os.environ["AWS_ENDPOINT_URL"])
    require_service("s3proxy", endpoint.hostname or "127.0.0.1", endpoint.port or 9000)


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The prefixes of the bucket checks' listings (each still sent to the store)."""
    asked: list[str] = []
    real: Callable[[S3Store, str], None] = s3._first_listed

    def counted(store: S3Store, prefix: str) -> None:
        asked.append(prefix)
        real(store, prefix)

    monkeypatch.setattr(s3, "_first_listed", counted)
    return asked


async def _bucket(method: Literal["PUT", "DELETE"], bucket: str) -> None:
    """Create (PUT) or delete (DELETE) ``bucket`` on S3Proxy with a presigned request."""
    raw = S3Store.from_url(f"s3://{bucket}", client_options={"allow_http": True})
    url = obstore.sign(raw, method, "", timedelta(minutes=1))
    async with httpx.AsyncClient() as client:
        answer = await client.request(method, url)
    assert answer.status_code in (200, 204), answer.text


@pytest.fixture
async def new_bucket(s3proxy: None) -> AsyncIterator[str]:
    """A bucket name nobody created yet; deleted after if a test created it."""
    bucket = f"review-{uuid.uuid4().hex[:10]}"
    yield bucket
    raw = S3Store.from_url(f"s3://{bucket}", client_options={"allow_http": True})
    url = obstore.sign(raw, "DELETE", "", timedelta(minutes=1))
    async with httpx.AsyncClient() as client:
        await client.delete(url)


async def test_reads_that_find_no_object_at_once_share_one_listing(
    s3proxy: None, listings: list[str]
) -> None:
    """Fifty 404s at once (an ingress's burst of new payloads) sent fifty listings."""
    store = open_store(f"s3://pipeline/review-{uuid.uuid4().hex[:10]}")
    found = await asyncio.gather(*(store.head(f"k{i}") for i in range(READS_AT_ONCE)))
    assert found == [None] * READS_AT_ONCE
    assert len(listings) == 1, len(listings)


async def test_reads_in_a_missing_bucket_at_once_all_fail(
    s3proxy: None, listings: list[str]
) -> None:
    """Each read that waited for the shared listing says the bucket is missing, with its key."""
    store = open_store(f"s3://nobucket-{uuid.uuid4().hex[:10]}/payloads")
    failed = await asyncio.gather(
        *(store.head(f"k{i}") for i in range(READS_AT_ONCE)), return_exceptions=True
    )
    for i, error in enumerate(failed):
        assert isinstance(error, OffloadError), error
        assert f"cannot read k{i}: bucket nobucket-" in str(error), error
    assert listings, "no listing"


async def test_a_bucket_created_after_it_was_missing_serves_at_once(
    new_bucket: str, listings: list[str]
) -> None:
    """A missing bucket is not remembered: once created, a missing object is just missing."""
    store = open_store(f"s3://{new_bucket}/payloads")
    with pytest.raises(OffloadError, match="does not exist"):
        await store.head("k")
    await _bucket("PUT", new_bucket)
    assert await store.head("k") is None


async def test_a_bucket_deleted_after_it_was_seen_fails_once_the_answer_is_old(
    new_bucket: str, listings: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer 'it exists' holds BUCKET_SEEN_S (here 0: at once), then is asked again."""
    monkeypatch.setattr(s3, "BUCKET_SEEN_S", 0.0)
    await _bucket("PUT", new_bucket)
    store = open_store(f"s3://{new_bucket}/payloads")
    assert await store.head("k") is None
    await _bucket("DELETE", new_bucket)
    with pytest.raises(OffloadError, match="does not exist"):
        await store.head("k")


@dataclass
class StandIn:
    """An S3 stand-in: every HEAD 404 (no body), every listing ``listing`` (status, code)."""

    listing: tuple[int, str]
    listed: list[str] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one request, then close the connection (it says so)."""
        try:
            method, target = (await reader.readuntil(b"\r\n\r\n")).split(b" ", 2)[:2]
            status, code = (404, "") if method == b"HEAD" else self.listing
            if method != b"HEAD":
                self.listed.append(target.decode())
            body = f"<Error><Code>{code}</Code></Error>".encode() if code else b""
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Type: application/xml\r\nConnection: close\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def stand_in(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[StandIn]:
    """The stand-in on a loopback port, named by AWS_ENDPOINT_URL."""
    served = StandIn((200, ""))
    server = await asyncio.start_server(served.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "pipeline")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "pipeline-local-secret")
    monkeypatch.setenv("PIPELINE_OFFLOAD_TIMEOUT_S", "2")
    try:
        yield served
    finally:
        server.close()
        await server.wait_closed()


async def test_a_key_refused_the_listing_keeps_missing_payloads_missing(
    stand_in: StandIn,
) -> None:
    """A key without s3:ListBucket: the 404 stands (a dead letter), asked once, not each read."""
    stand_in.listing = (403, "AccessDenied")
    store = open_store("s3://payloads/p")
    assert await store.head("k1") is None
    assert await store.head("k2") is None
    assert len(stand_in.listed) == 1, stand_in.listed


async def test_a_listing_that_failed_is_asked_again_at_the_next_404(stand_in: StandIn) -> None:
    """A blip on the listing was taken as 'the bucket exists' for a minute.

    In a bucket that does not exist, a lazy lane's member then dead-lettered every message as
    ``payload_missing`` meanwhile; now the next 404 asks again, and learns the bucket is missing.
    """
    stand_in.listing = (500, "InternalError")
    store = open_store("s3://payloads/p")
    assert await store.head("k1") is None  # the blip: the 404 stands
    stand_in.listing = (404, "NoSuchBucket")
    with pytest.raises(OffloadError, match="bucket payloads does not exist"):
        await store.head("k2")

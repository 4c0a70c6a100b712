"""An ``offload.store`` whose bucket does not exist (a typo, another S3 service), on S3Proxy.

S3 answers a HEAD of a missing object and a HEAD in a missing bucket alike (404, no body), so
the start check passed in silence, a member dead-lettered every message of such a store as
``payload_missing`` ("the object is gone": no retry), and a write or a purge said
``HTTP 404 NoSuchBucket`` or printed S3's XML. Each now says the bucket does not exist and what
to do, and a read is a store failure (a retry), not a missing payload.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from urllib.parse import urlparse

import pytest
from offload.helpers import S3PROXY
from support import require_service

from pipeline.offload import reference as ref
from pipeline.offload.errors import OffloadError, PayloadMissing
from pipeline.offload.store import check_stores, open_store

BODY = b"x" * 1000
KEY = ref.key_for(hashlib.sha256(BODY).hexdigest())


@pytest.fixture
def missing_bucket(monkeypatch: pytest.MonkeyPatch) -> str:
    """A store URL on S3Proxy in a bucket nobody created (nothing is created by the tests)."""
    for name, value in S3PROXY.items():
        if not os.environ.get(name):
            monkeypatch.setenv(name, value)
    endpoint = urlparse(os.environ["AWS_ENDPOINT_URL"])
    require_service("s3proxy", endpoint.hostname or "127.0.0.1", endpoint.port or 9000)
    return f"s3://nobucket-{uuid.uuid4().hex[:10]}/payloads"


def says_the_bucket_is_missing(text: str, url: str) -> None:
    """One line naming the bucket, saying it does not exist and what to do; no XML."""
    bucket = urlparse(url).netloc
    assert f"bucket {bucket} does not exist" in text, text
    assert "create it" in text, text
    assert "offload.store" in text, text
    assert "<?xml" not in text, text
    assert "\n" not in text, text


async def test_the_start_check_warns_of_a_missing_bucket(
    missing_bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The start check's HEAD found "no object" and went on without a word."""
    with caplog.at_level(logging.WARNING, logger="pipeline.offload.store"):
        await check_stores([missing_bucket])
    warned = [r.getMessage() for r in caplog.records if r.name == "pipeline.offload.store"]
    assert len(warned) == 1, warned
    assert missing_bucket in warned[0]
    says_the_bucket_is_missing(warned[0], missing_bucket)


async def test_a_read_in_a_missing_bucket_is_a_store_failure(missing_bucket: str) -> None:
    """Not ``PayloadMissing``, a dead letter at once: a store failure, retried.

    The bucket may be created, or the member's AWS_ENDPOINT_URL corrected, and the message read.
    """
    store = open_store(missing_bucket)
    with pytest.raises(OffloadError) as looked:
        await store.head(KEY)
    says_the_bucket_is_missing(str(looked.value), missing_bucket)
    with pytest.raises(OffloadError) as read:
        async for _ in store.chunks(KEY, 1024):
            pass
    assert not isinstance(read.value, PayloadMissing)
    says_the_bucket_is_missing(str(read.value), missing_bucket)


async def test_a_write_to_a_missing_bucket_says_so(
    missing_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both write paths: the presigned PUT (the default) and the S3 client (signed bodies)."""
    for signed in ("true", "false"):
        monkeypatch.setenv("AWS_UNSIGNED_PAYLOAD", signed)
        with pytest.raises(OffloadError) as wrote:
            await open_store(missing_bucket).put(KEY, BODY)
        says_the_bucket_is_missing(str(wrote.value), missing_bucket)


async def test_a_listing_of_a_missing_bucket_says_so(missing_bucket: str) -> None:
    """What `pipeline offload purge --store` of such a store prints, instead of S3's XML."""
    with pytest.raises(OffloadError) as listed:
        async for _ in open_store(missing_bucket).list():
            pass
    says_the_bucket_is_missing(str(listed.value), missing_bucket)


async def test_a_missing_object_in_a_bucket_that_exists_is_still_missing(store_url: str) -> None:
    """The usual 404 keeps its meaning: no object.

    A writer then writes it; a reader dead-letters it as ``payload_missing``.
    """
    store = open_store(store_url)
    assert await store.head(KEY) is None
    assert await store.head(KEY) is None  # the bucket, once seen, is not asked for again
    with pytest.raises(PayloadMissing):
        async for _ in store.chunks(KEY, 1024):
            pass

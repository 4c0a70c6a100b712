"""Payloads in an S3-compatible service (AWS S3, S3Proxy, MinIO, R2, ...).

``s3://bucket/prefix``. Credentials, region and endpoint come from the usual variables, read
by obstore: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION`` and ``AWS_ENDPOINT_URL`` (for a service other than AWS; an ``http://``
endpoint is allowed, for a local S3Proxy). The bucket must exist.

Deletes are single-object ``DeleteObject`` requests (presigned, sent with httpx): obstore
deletes through the batch ``DeleteObjects`` call, which not every S3-compatible service
implements (S3Proxy's filesystem backend answers 501).
"""

from __future__ import annotations

import functools
import os
import ssl
from datetime import timedelta
from typing import TYPE_CHECKING

import httpx
import obstore
from obstore.store import S3Store

from pipeline.offload.errors import OffloadError, client_error_text
from pipeline.offload.objects import ObjectPayloadStore

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config


_SIGNED_FOR = timedelta(minutes=5)


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every delete (loading the CA bundle costs ~0.1 s of CPU)."""
    return ssl.create_default_context()


class S3PayloadStore(ObjectPayloadStore):
    """A payload store in an S3 bucket, under the URL's prefix."""

    def __init__(self, url: str) -> None:
        """Open ``url`` (``s3://bucket/prefix``); nothing is contacted yet."""
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT") or ""
        options: ClientConfig = {
            "allow_http": endpoint.startswith("http://"),
            "connect_timeout": timedelta(seconds=5),
        }
        # A webhook waits on the write: give up within seconds (503, the provider retries)
        # rather than obstore's default of ten retries over three minutes.
        retry: RetryConfig = {"max_retries": 3, "retry_timeout": timedelta(seconds=15)}
        config: S3Config = {}
        if not os.environ.get("AWS_UNSIGNED_PAYLOAD"):
            # Every read checks the payload's SHA-256 against its reference, end to end: signing
            # the body as well would hash it once more here and once more in the service.
            config["unsigned_payload"] = True
        if not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
            config["region"] = "us-east-1"  # what an S3-compatible service takes by default
        super().__init__(
            url, S3Store.from_url(url, config=config, client_options=options, retry_config=retry)
        )

    async def delete(self, key: str) -> None:
        """Delete ``key`` with one ``DELETE`` (S3 answers 204 whether or not it existed)."""
        try:
            url = obstore.sign(self._store, "DELETE", key, _SIGNED_FOR)  # local: no request
            async with httpx.AsyncClient(timeout=30.0, verify=_tls()) as client:
                answer = await client.delete(url)
        except Exception as exc:
            raise OffloadError(
                f"offload store {self.url}: cannot delete {key}: {client_error_text(exc)}"
            ) from exc
        if answer.status_code not in (200, 204, 404):
            raise OffloadError(
                f"offload store {self.url}: cannot delete {key}: HTTP {answer.status_code}"
            )

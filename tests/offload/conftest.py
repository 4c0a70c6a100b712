"""Fixtures for the offload tests: each payload store (S3Proxy, a directory), emptied after."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlparse

import obstore
import pytest
from obstore.store import S3Store
from offload.helpers import closed_port
from support import require_service

from pipeline.offload.store import open_store

# What deploy/local/s3proxy.sh configures; the environment wins when it names another service.
S3PROXY = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_ACCESS_KEY_ID": "pipeline",
    "AWS_SECRET_ACCESS_KEY": "pipeline-local-secret",
}


@pytest.fixture(params=["s3", "directory"])
async def store_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[str]:
    """A fresh store URL: a uuid prefix in S3Proxy's bucket, or a directory; emptied after."""
    if request.param == "directory":
        yield f"file://{tmp_path}/payloads"
        return
    for name, value in S3PROXY.items():
        if not os.environ.get(name):
            monkeypatch.setenv(name, value)
    endpoint = urlparse(os.environ["AWS_ENDPOINT_URL"])
    require_service("s3proxy", endpoint.hostname or "127.0.0.1", endpoint.port or 9000)
    url = f"s3://pipeline/test-{uuid.uuid4().hex[:10]}"
    yield url
    store = open_store(url)
    for key in [obj.key async for obj in store.list()]:
        await store.delete(key)
    # S3Proxy's filesystem backend keeps the emptied directories; they list as ETag-less objects.
    raw = S3Store.from_url(url, client_options={"allow_http": True}, region="us-east-1")
    markers = [m["path"] for page in obstore.list(raw) for m in page]
    for key in sorted(markers, key=len, reverse=True):
        await store.delete(key)
    await store.delete("")  # the prefix itself


@pytest.fixture
def s3_down_port(monkeypatch: pytest.MonkeyPatch) -> int:
    """S3 (``AWS_ENDPOINT_URL``) at a loopback port nothing listens on, with S3Proxy's keys."""
    port = closed_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "pipeline")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "pipeline-local-secret")
    return port

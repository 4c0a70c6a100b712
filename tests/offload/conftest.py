"""Fixtures for the offload tests: each payload store (S3Proxy, a directory), emptied after."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from offload.helpers import closed_port, s3_prefix


@pytest.fixture(params=["s3", "directory"])
async def store_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[str]:
    """A fresh store URL: a uuid prefix in S3Proxy's bucket, or a directory; emptied after."""
    if request.param == "directory":
        yield f"file://{tmp_path}/payloads"
        return
    async with s3_prefix(monkeypatch) as url:
        yield url


@pytest.fixture
def s3_down_port(monkeypatch: pytest.MonkeyPatch) -> int:
    """S3 (``AWS_ENDPOINT_URL``) at a loopback port nothing listens on, with S3Proxy's keys."""
    port = closed_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "pipeline")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "pipeline-local-secret")
    return port

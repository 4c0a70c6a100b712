"""A payload store's S3 endpoint that does not answer: one line saying what failed and what to do.

Before, `pipeline offload purge` against an ``https://`` endpoint whose port speaks plain HTTP
(S3Proxy on 127.0.0.1:9000), or against a port nobody listens on, said only "Generic S3 error:
... HTTP error: error sending request". Now the line says that the TLS handshake failed and
which ``AWS_ENDPOINT_URL`` to set, or that nothing listens there and to start it. The same for
a delete, which goes through another HTTP client (httpx) than the listing (obstore).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from offload.helpers import closed_port, offload_env
from support import require_service, run_pipeline

from pipeline.offload.errors import OffloadError
from pipeline.offload.s3 import S3PayloadStore

S3PROXY = "127.0.0.1:9000"
NOT_TLS = (
    f"TLS handshake with S3 at https://{S3PROXY} failed: the port does not speak TLS? If the"
    f" service there serves plain HTTP (a local S3Proxy or MinIO), set"
    f" AWS_ENDPOINT_URL=http://{S3PROXY}"
)


def _refused(endpoint: str) -> str:
    return (
        f"cannot reach S3 at {endpoint}: connection refused; start it, or set AWS_ENDPOINT_URL"
        " to where it runs"
    )


def _purge(tmp_path: Path, lane: str, endpoint: str) -> subprocess.CompletedProcess[str]:
    """``offload purge --dry-run`` of a store no lane declares (the broker is not asked)."""
    env = offload_env(
        tmp_path,
        lane,
        f"s3://pipeline/{lane}",
        AWS_REGION="us-east-1",
        AWS_ACCESS_KEY_ID="pipeline",
        AWS_SECRET_ACCESS_KEY="pipeline",  # noqa: S106 - S3Proxy's local key
        AWS_ENDPOINT_URL=endpoint,
    )
    store = f"s3://pipeline/{lane}-purged"
    return run_pipeline("offload", "purge", "--store", store, "--dry-run", env=env, cwd=tmp_path)


@pytest.mark.parametrize("case", ["https to a plain port", "nothing listening"])
def test_purge_against_an_endpoint_that_does_not_answer_is_one_clear_line(
    tmp_path: Path, unique: str, case: str
) -> None:
    """Exit 1 and one line: the store, the operation, what failed at which endpoint, what to do."""
    require_service("s3proxy", "127.0.0.1", 9000)
    lane = f"unanswered_{unique}"
    if case == "nothing listening":
        endpoint = f"http://127.0.0.1:{closed_port()}"
        said = _refused(endpoint)
    else:
        endpoint, said = f"https://{S3PROXY}", NOT_TLS
    result = _purge(tmp_path, lane, endpoint)
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        f"error: offload store s3://pipeline/{lane}-purged: cannot list: {said}"
    ]


@pytest.mark.parametrize("case", ["https to a plain port", "nothing listening"])
async def test_a_delete_through_httpx_says_the_same(
    monkeypatch: pytest.MonkeyPatch, unique: str, case: str
) -> None:
    """A delete (presigned, sent with httpx) to the same endpoints: the same words."""
    require_service("s3proxy", "127.0.0.1", 9000)
    if case == "nothing listening":
        endpoint = f"http://127.0.0.1:{closed_port()}"
        said = _refused(endpoint)
    else:
        endpoint, said = f"https://{S3PROXY}", NOT_TLS
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "pipeline")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "pipeline")
    store = S3PayloadStore(f"s3://pipeline/unanswered-{unique}")
    with pytest.raises(OffloadError) as raised:
        await store.delete("k")
    assert str(raised.value) == (
        f"offload store s3://pipeline/unanswered-{unique}: cannot delete k: {said}"
    )

"""A payload store that refuses the key (a wrong AWS_SECRET_ACCESS_KEY, an unknown key id).

S3Proxy answers 403 (SignatureDoesNotMatch, InvalidAccessKeyId). The ingress and `pipeline
consume` stop at start with one line saying the store refused the credentials and which
variables to check, as they do without credentials: a key read at start cannot change while
the process runs. Not on AccessDenied, which S3 also answers a key without s3:ListBucket that
asks for a missing object (the start probe's case): such a key reads and writes every payload.
`pipeline offload purge` says the same in one line, without the store's XML. No secret is
printed.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from offload.helpers import consume_idle, offload_env
from support import require_service, run_pipeline

from pipeline.offload.errors import OffloadError, PayloadMissing
from pipeline.offload.store import _key_refused

WRONG_SECRET = "wrong-secret-6c1f9d"  # noqa: S105 - what S3Proxy must refuse


def environment(
    tmp_path: Path, lane: str, key_id: str = "pipeline", **extra: str
) -> dict[str, str]:
    """S3Proxy with a wrong secret, a lane offloading to it, an ingress with no sources."""
    require_service("s3proxy", "127.0.0.1", 9000)
    return offload_env(
        tmp_path,
        lane,
        f"s3://pipeline/refused-{lane}",
        AWS_REGION="us-east-1",
        AWS_ACCESS_KEY_ID=key_id,
        AWS_SECRET_ACCESS_KEY=WRONG_SECRET,
        **extra,
    )


def one_refusal_line(result: subprocess.CompletedProcess[str], lane: str, code: int) -> str:
    """Exit ``code``; one stderr line naming the store, the refusal and the variables."""
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    assert WRONG_SECRET not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert f"offload store s3://pipeline/refused-{lane}" in line
    assert "refused the credentials" in line
    assert "AWS_ACCESS_KEY_ID" in line
    assert "AWS_SECRET_ACCESS_KEY" in line
    assert "<?xml" not in line
    return line


@pytest.mark.parametrize("key_id", ["pipeline", "no-such-key"])
def test_the_ingress_with_a_refused_key_stops_at_start(
    tmp_path: Path, unique: str, key_id: str
) -> None:
    """`ingress serve` with a wrong secret (or key id) exits 2 at start, not serving on."""
    lane = f"refused_{unique}"
    env = environment(tmp_path, lane, key_id)
    result = run_pipeline("ingress", "serve", "--port", "0", env=env, cwd=tmp_path)
    one_refusal_line(result, lane, 2)


def test_consume_with_a_refused_key_stops_at_start(
    redis_service: str, tmp_path: Path, unique: str
) -> None:
    """`pipeline consume` of a lane whose store refuses the key exits 2 at start."""
    lane = f"refused_{unique}"
    env = environment(tmp_path, lane, PIPELINE_REDIS__URL=redis_service)
    one_refusal_line(consume_idle(tmp_path, lane, f"g-{unique}", env), lane, 2)


def test_purge_with_a_refused_key_is_one_line(tmp_path: Path, unique: str) -> None:
    """`offload purge` against a store refusing the key: exit 1, one line, no XML, no secret."""
    lane = f"refused_{unique}"
    env = environment(tmp_path, lane)
    store = f"s3://pipeline/refused-{lane}-purged"  # no lane's: the broker is not asked
    result = run_pipeline("offload", "purge", "--store", store, "--dry-run", env=env, cwd=tmp_path)
    line = one_refusal_line(result, lane, 1)
    assert "SignatureDoesNotMatch" in line


class _AnswersGet:
    """A store whose GET of the start probe fails with ``error`` (the rest is never called)."""

    url = "s3://pipeline/least-privilege"

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def chunks(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:  # noqa: ARG002
        raise self.error
        yield b""  # an async generator, as the stores' chunks are


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        (OffloadError("cannot read k: 403 Forbidden SignatureDoesNotMatch (...)"), True),
        (OffloadError("cannot read k: 403 Forbidden InvalidAccessKeyId (...)"), True),
        # S3's answer for a missing object to a key without s3:ListBucket: it works for payloads
        (OffloadError("cannot read k: 403 Forbidden AccessDenied (...)"), False),
        (PayloadMissing("no object"), False),
    ],
)
async def test_only_a_key_refused_whatever_it_asks_stops_the_start(
    error: Exception, refused: bool
) -> None:
    """A HEAD's 403 has no body: the GET's code decides, and AccessDenied starts (warned)."""
    assert await _key_refused(_AnswersGet(error)) is refused  # type: ignore[arg-type]

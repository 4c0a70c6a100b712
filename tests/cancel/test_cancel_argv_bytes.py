"""`pipeline cancel` with a key, tenant or reason whose bytes are not UTF-8."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from redis import Redis as SyncRedis
from typer.testing import CliRunner

from pipeline.cancel.keys import CancelKeys
from pipeline.cancel.target import Selectors, facts_of
from pipeline.cli import app as cli
from pipeline.envelope import Message


@pytest.fixture
def cli_prefix(redis_service: str, unique: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The CLI's key prefix for this test; its cancellation keys are deleted after."""
    name = f"t{unique}"
    monkeypatch.setenv("PIPELINE_REDIS__URL", redis_service)
    monkeypatch.setenv("PIPELINE_REDIS__KEY_PREFIX", name)
    yield name
    client = SyncRedis.from_url(redis_service)
    client.delete(*CancelKeys(name).all())
    client.close()


def test_a_key_that_is_not_utf8_is_cancelled_as_members_read_it(
    cli_prefix: str, redis_service: str
) -> None:
    """`pipeline cancel --key` with bytes that are not UTF-8 covers that key, no traceback."""
    raw = b"conv-\xff\xfe"
    argv_key = raw.decode(errors="surrogateescape")  # how Python hands such an argument over
    reason = b"bad \xff".decode(errors="surrogateescape")
    result = CliRunner().invoke(cli, ["cancel", "--key", argv_key, "--reason", reason])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    client = SyncRedis.from_url(redis_service)
    try:
        version = int(client.get(CancelKeys(cli_prefix).version) or 0)
        entries = {
            (f.decode() if isinstance(f, bytes) else f): json.loads(v)
            for f, v in client.hgetall(CancelKeys(cli_prefix).selectors).items()
        }
    finally:
        client.close()
    facts = facts_of(Message("lane", 0, 0, raw, b"", {}, 1), "e1")
    assert Selectors(version, entries).reason("lane", facts, 2) is not None

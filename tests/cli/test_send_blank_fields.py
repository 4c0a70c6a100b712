"""`pipeline send` of a webhook without a tenant or a key prints what its log row holds: ``""``.

It printed ``"key": null`` while the row holds ``""`` (the event then goes without a key, its
partition the broker's choice, printed null); the tenant was already printed as the row holds it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from ingress.helpers import (
    ROOT,
    ingress_env,
    killed_at_end,
    serve_until_listening,
    write_example_sources,
)
from support import run_pipeline

from pipeline.logstore.sqlite import SqliteLogStore

pytestmark = pytest.mark.redis

SECRETS = {
    "META_APP_SECRET": "app-secret",
    "META_VERIFY_TOKEN": "token",
    "GITHUB_WEBHOOK_SECRET": "github-secret",
}
NO_TENANT = {  # a WhatsApp change without the business account id its tenant is read from
    "object": "whatsapp_business_account",
    "entry": [{"changes": [{"field": "messages", "value": {"contacts": [{"wa_id": "15550001"}]}}]}],
}
NO_KEY = {  # a WhatsApp change without the contact's wa_id its key is read from
    "object": "whatsapp_business_account",
    "entry": [{"id": "waba-1", "changes": [{"field": "messages", "value": {"contacts": []}}]}],
}


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Ingress processes the test started; any still running at the end is killed."""
    with killed_at_end() as procs:
        yield procs


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[SqliteLogStore]:
    """The ingress's log (``tmp_path/ingress.db``, as :func:`ingress_env` configures it)."""
    store = SqliteLogStore(tmp_path / "ingress.db")
    yield store
    await store.close()


@pytest.mark.parametrize(
    ("body", "tenant", "key", "partition_known"),
    [(NO_TENANT, "", "15550001", True), (NO_KEY, "waba-1", "", False)],
    ids=["no tenant", "no key"],
)
async def test_a_blank_field_is_printed_as_the_row_holds_it(
    tmp_path: Path,
    redis_service: str,
    unique: str,
    started: list[subprocess.Popen[str]],
    log: SqliteLogStore,
    body: dict[str, Any],
    tenant: str,
    key: str,
    partition_known: bool,
) -> None:
    """The row's blank field is ``""`` and so is send's; without a key the partition is null."""
    write_example_sources(tmp_path)
    env = (
        ingress_env(
            tmp_path, redis_service, ROOT / "topics", PIPELINE_REDIS__KEY_PREFIX=f"t{unique}"
        )
        | SECRETS
    )
    _, url = serve_until_listening(env, started)
    sent = run_pipeline(
        "send", "whatsapp", "--json", json.dumps(body), "--url", url, env=env, cwd=tmp_path
    )
    assert sent.returncode == 0, sent.stdout + sent.stderr
    answer, where = sent.stdout.strip().splitlines()
    row_id = json.loads(answer.partition(" ")[2])["id"]
    await log.open()
    row = await log.get(row_id)
    assert row is not None
    assert (row.tenant, row.key) == (tenant, key)
    printed = json.loads(where)
    assert (printed["tenant"], printed["key"], printed["topic"]) == (tenant, key, "messages")
    assert (printed["partition"] is not None) == partition_known

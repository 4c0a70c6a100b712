"""``kill -9`` between commit and produce: the sweeper produces exactly the missing events."""

from __future__ import annotations

import asyncio
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from contract.helpers import consume_until, make_topic
from ingress.helpers import ingress_env, meta_body, write_whatsapp_source
from ingress.signing import hub_signature

from pipeline.config import Settings, SweeperSettings
from pipeline.ingress import headers as h
from pipeline.ingress.sweeper import Sweeper
from pipeline.logstore import RowState, Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.testing.ports import free_port
from pipeline.transport import create_transport

SECRET = "kill-nine-secret"  # noqa: S105 - a test secret


class Calm:
    """No lane is backed up."""

    async def is_backlogged(self, lane: str) -> bool:  # noqa: ARG002 - the protocol's signature
        """Never."""
        return False


def start_ingress(
    env: dict[str, str], timeout_s: float = 30.0
) -> tuple[subprocess.Popen[str], str]:
    """Start ``pipeline ingress serve --port 0`` and return it with its base URL once listening."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.ingress.cli", "ingress", "serve", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("ingress listening on "):
                return proc, line.removeprefix("ingress listening on ").strip()
            if not line:
                break
    proc.kill()
    _, stderr = proc.communicate()
    raise AssertionError(f"ingress did not start: {stderr}")


async def post_all(base_url: str, bodies: list[bytes]) -> None:
    """POST every body as a signed Meta delivery; each must be accepted."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for body in bodies:
            headers = {"x-hub-signature-256": hub_signature(SECRET, body)}
            response = await http.post("/hooks/whatsapp", content=body, headers=headers)
            assert response.json()["status"] == "accepted", response.text


async def test_kill_9_between_commit_and_produce_then_sweep(
    tmp_path: Path, settings: Settings, redis_service: str, unique: str
) -> None:
    """Rows committed by an ingress killed before producing are produced once by the sweeper."""
    topic = f"messages-{unique}"
    transport = create_transport(settings, "redis")
    await make_topic(transport, topic, 2)
    write_whatsapp_source(tmp_path, topic, "env:PIPELINE_TEST_KILL_SECRET")
    db = tmp_path / "ingress.db"
    env = ingress_env(tmp_path, settings.redis.url, PIPELINE_TEST_KILL_SECRET=SECRET)

    # Phase 1: a healthy ingress produces its 20 events, then is killed.
    healthy, url = start_ingress(env)
    try:
        await post_all(url, [meta_body(n) for n in range(20)])
        store = SqliteLogStore(db)
        await store.open()
        deadline = time.monotonic() + 30
        while await store.count_by_state(Selection()) != {RowState.PRODUCED: 20}:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await store.close()
    finally:
        healthy.send_signal(signal.SIGKILL)
        healthy.communicate()

    # Phase 2: an ingress whose broker is unreachable commits 30 rows and is killed.
    blocked_env = {**env, "PIPELINE_REDIS__URL": f"redis://127.0.0.1:{free_port()}/0"}
    blocked, url = start_ingress(blocked_env)
    try:
        await post_all(url, [meta_body(n) for n in range(20, 50)])
    finally:
        blocked.send_signal(signal.SIGKILL)
        blocked.communicate()
    assert blocked.returncode == -signal.SIGKILL

    store = SqliteLogStore(db)
    await store.open()
    assert await store.count_by_state(Selection()) == {
        RowState.PRODUCED: 20,
        RowState.RECEIVED: 30,
    }
    sweeper = Sweeper(
        store,
        transport.producer(),
        Calm(),
        {"messages": [topic]},
        SweeperSettings(unproduced_after_s=0.001),
    )
    report = await sweeper.sweep_once()
    assert (report.produced, report.replayed, report.failed) == (30, 0, 0)
    assert await store.count_by_state(Selection()) == {RowState.PRODUCED: 50}
    await store.close()

    consumer = transport.consumer(f"g-{unique}", [topic])
    got = await consume_until(consumer, lambda r: len(r) >= 50)
    await consumer.close()
    await transport.close()
    assert sorted(m.headers[h.EVENT_ID].decode() for m in got) == sorted(
        f"wamid.{n}" for n in range(50)
    )

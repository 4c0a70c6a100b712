"""Workers without a metrics port still answer health and readiness on the webhook port.

Such a worker's observer is replaced (it refreshes no snapshot) before the ingress starts; the
ingress turns the replacement ready, so ``/readyz`` says 200 once it serves, from any worker.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import psycopg
import pytest
from ingress.helpers import ROOT, ingress_env, listening_url, start_ingress, stop

pytestmark = pytest.mark.postgres

ASKED = 12
"""Requests per path, each on a new connection: the kernel hands them to either worker."""


def test_unscraped_workers_answer_health_and_readiness(
    redis_service: str, postgres_service: str, tmp_path: Path
) -> None:
    """Two workers, no metrics port: /healthz and /readyz 200, /metrics 404, from every worker."""
    (tmp_path / "sources.yaml").write_text("sources: {}\n", encoding="utf-8")
    schema = f"unscraped_ready_{uuid.uuid4().hex[:12]}"
    env = ingress_env(
        tmp_path,
        redis_service,
        ROOT / "topics",
        PIPELINE_INGRESS__LOG_STORE="postgres",
        PIPELINE_POSTGRES__URL=postgres_service,
        PIPELINE_INGRESS__POSTGRES_SCHEMA=schema,
    )
    proc = start_ingress(env, "--workers", "2", cwd=tmp_path)
    try:
        url = listening_url(proc)
        for path, status in (("/healthz", 200), ("/readyz", 200), ("/metrics", 404)):
            answers = {httpx.get(url + path, timeout=10).status_code for _ in range(ASKED)}
            assert answers == {status}, (path, answers)
    finally:
        try:
            stop(proc)
        finally:
            with psycopg.connect(postgres_service, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

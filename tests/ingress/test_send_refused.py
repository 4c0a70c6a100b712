"""`pipeline send` to a real ingress whose secret differs: the answer and what to do about it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ingress.helpers import ROOT, ingress_env, serve_until_listening, write_example_sources

WEBHOOK = str(ROOT / "deploy/local/webhooks/whatsapp-message.json")


def test_a_refused_signature_says_the_secrets_differ(
    tmp_path: Path, redis_service: str, unique: str, started: list[subprocess.Popen[str]]
) -> None:
    """A 401 is printed as answered, then one error line naming the source and sources file."""
    sources = write_example_sources(tmp_path)
    env = ingress_env(
        tmp_path, redis_service, ROOT / "topics", PIPELINE_REDIS__KEY_PREFIX=f"t{unique}"
    )
    env |= {"META_VERIFY_TOKEN": "token", "GITHUB_WEBHOOK_SECRET": "ingress-secret"}
    _, url = serve_until_listening({**env, "META_APP_SECRET": "ingress-secret"}, started)
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "send", "whatsapp", "--file", WEBHOOK, "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**env, "META_APP_SECRET": "another-secret"},
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout.strip() == '401 {"error": "unauthorized"}'
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    assert f"{url}/hooks/whatsapp" in line
    assert "refused the signature" in line
    assert "sources.whatsapp" in line
    assert str(sources) in line

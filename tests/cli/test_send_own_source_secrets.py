"""`pipeline send SOURCE` needs SOURCE's signing secret only, not every source's secrets."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from ingress.helpers import (
    ROOT,
    ingress_env,
    killed_at_end,
    serve_until_listening,
    write_example_sources,
)
from support import run_pipeline

from pipeline.errors import ConfigError
from pipeline.ingress.settings import load_sources

WEBHOOK = str(ROOT / "deploy/local/webhooks/whatsapp-message.json")
SECRET_VARIABLES = ("META_APP_SECRET", "META_VERIFY_TOKEN", "GITHUB_WEBHOOK_SECRET")


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Ingress processes the test started; any still running at the end is killed."""
    with killed_at_end() as procs:
        yield procs


def environment(tmp_path: Path, redis_service: str, unique: str) -> dict[str, str]:
    """The example sources and topics on the test Redis, and none of the sources' secrets."""
    write_example_sources(tmp_path)
    env = ingress_env(
        tmp_path, redis_service, ROOT / "topics", PIPELINE_REDIS__KEY_PREFIX=f"t{unique}"
    )
    return {k: v for k, v in env.items() if k not in SECRET_VARIABLES}


def test_send_whatsapp_with_only_its_secret_is_accepted(
    tmp_path: Path, redis_service: str, unique: str, started: list[subprocess.Popen[str]]
) -> None:
    """With META_APP_SECRET alone exported, a whatsapp webhook is signed, posted and accepted."""
    env = environment(tmp_path, redis_service, unique)
    ingress = {
        **env,
        "META_APP_SECRET": "app-secret",
        "META_VERIFY_TOKEN": "token",
        "GITHUB_WEBHOOK_SECRET": "github-secret",
    }
    _, url = serve_until_listening(ingress, started)
    result = run_pipeline(
        "send",
        "whatsapp",
        "--file",
        WEBHOOK,
        "--url",
        url,
        env={**env, "META_APP_SECRET": "app-secret"},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    answer, where = result.stdout.strip().splitlines()
    assert answer.startswith("20"), answer
    assert json.loads(where)["topic"] == "messages"


def test_send_names_only_its_own_missing_secret(tmp_path: Path, redis_service: str) -> None:
    """Without META_APP_SECRET, send whatsapp exits 2 with that source's line, no other's."""
    env = environment(tmp_path, redis_service, "none")
    result = run_pipeline("send", "whatsapp", "--file", WEBHOOK, env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "sources.whatsapp.secrets[0]: environment variable META_APP_SECRET" in result.stderr
    assert "github" not in result.stderr
    assert "verify_token" not in result.stderr


def test_send_still_refuses_an_undeclared_source(tmp_path: Path, redis_service: str) -> None:
    """An undeclared source is one line naming the declared ones, secrets or not."""
    env = environment(tmp_path, redis_service, "none")
    result = run_pipeline("send", "shopify", "--json", "{}", env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "no source 'shopify' (declared: github, whatsapp)" in line


def test_the_ingress_still_needs_every_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ingress's loader (load_sources) names every source's missing secret, as before."""
    sources = write_example_sources(tmp_path)
    for name in SECRET_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("META_APP_SECRET", "app-secret")
    with pytest.raises(ConfigError) as raised:
        load_sources(sources, {"messages", "engagement"})
    assert "sources.whatsapp.verify_token" in str(raised.value)
    assert "sources.github.secrets[0]" in str(raised.value)

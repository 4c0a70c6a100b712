"""`pipeline send` with its source's secret variable unset names the variable, not a bad file."""

from __future__ import annotations

from pathlib import Path

from ingress.helpers import ROOT, ingress_env, write_example_sources
from support import run_pipeline

SECRET_VARIABLES = ("META_APP_SECRET", "META_VERIFY_TOKEN", "GITHUB_WEBHOOK_SECRET")


def test_send_without_its_secret_variable_names_it_and_says_to_export_it(
    tmp_path: Path, redis_service: str, unique: str
) -> None:
    """The example sources file, META_APP_SECRET unset: one line naming it; exit 2, no request."""
    sources = write_example_sources(tmp_path)
    env = ingress_env(
        tmp_path, redis_service, ROOT / "topics", PIPELINE_REDIS__KEY_PREFIX=f"t{unique}"
    )
    env = {k: v for k, v in env.items() if k not in SECRET_VARIABLES}
    result = run_pipeline(
        "send", "whatsapp", "--json", "{}", "--url", "http://127.0.0.1:9/", env=env
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"error: {sources}: sources.whatsapp.secrets[0]: environment variable META_APP_SECRET"
        " is not set or empty (or only whitespace): export META_APP_SECRET where this command"
        " runs"
    )
    assert "invalid sources file" not in result.stderr

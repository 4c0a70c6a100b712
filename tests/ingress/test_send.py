"""`pipeline send`: signatures the ingress's own verifiers accept, and clear failures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.ingress.send import signed_headers
from pipeline.ingress.settings import SourceConfig
from pipeline.ingress.source import build_verifier

ROOT = Path(__file__).resolve().parents[2]
BODY = b'{"id": "evt_1", "data": {"id": "user_1", "object": {"customer": "cus_1"}}}'
CONFIGS = {
    "meta": {"scheme": "meta", "secrets": ["s3cret"]},
    "github": {"scheme": "github", "secrets": ["s3cret"]},
    "stripe": {"scheme": "stripe", "secrets": ["whsec_s3cret"]},
    "standard_webhooks": {
        "scheme": "standard_webhooks",
        "secrets": ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
    },
    "hmac hex": {
        "scheme": "hmac",
        "secrets": ["s3cret"],
        "hmac": {"header": "X-Sig", "algorithm": "sha1", "encoding": "hex", "prefix": "sha1="},
    },
    "hmac base64": {
        "scheme": "hmac",
        "secrets": ["s3cret"],
        "hmac": {"header": "X-Sig", "algorithm": "sha512", "encoding": "base64"},
    },
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_signed_headers_pass_the_verifier(name: str) -> None:
    """What send signs, the ingress's verifier of the same scheme and secret accepts."""
    config = SourceConfig.model_validate({**CONFIGS[name], "topic": "messages"})
    now_s = 1_764_576_000.0
    headers = signed_headers(config, BODY, now_s)
    build_verifier(config).verify(headers, BODY, now_s)  # raises Rejected when wrong


def test_a_changed_body_is_rejected() -> None:
    """A signature is over the exact body: one changed byte fails verification."""
    config = SourceConfig.model_validate({**CONFIGS["meta"], "topic": "messages"})
    headers = signed_headers(config, BODY, 0.0)
    with pytest.raises(Exception, match="signature mismatch"):
        build_verifier(config).verify(headers, BODY.replace(b"evt_1", b"evt_2"), 0.0)


def send(*args: str, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline send ARGS`` in ``tmp_path`` holding the example sources and topics."""
    (tmp_path / "sources.yaml").write_text(
        (ROOT / "deploy/local/sources.example.yaml").read_text(encoding="utf-8")
    )
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "send", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PIPELINE_TOPICS_DIR": str(ROOT / "topics"), **env},
        check=False,
    )


SECRETS = {"META_APP_SECRET": "x", "META_VERIFY_TOKEN": "x", "GITHUB_WEBHOOK_SECRET": "x"}


def test_no_ingress_is_one_line_naming_the_address(tmp_path: Path) -> None:
    """With no ingress listening, send exits 1 with one line naming the URL and the fix."""
    body = str(ROOT / "deploy/local/webhooks/whatsapp-message.json")
    result = send(
        "whatsapp", "--file", body, "--url", "http://127.0.0.1:1", tmp_path=tmp_path, env=SECRETS
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "http://127.0.0.1:1/hooks/whatsapp" in line
    assert "pipeline ingress serve" in line


def test_unknown_source_and_missing_secret_exit_2(tmp_path: Path) -> None:
    """An undeclared source, or a secret not exported, is a one-line error with exit 2."""
    unknown = send("shopify", "--json", "{}", tmp_path=tmp_path, env=SECRETS)
    assert unknown.returncode == 2
    assert "no source 'shopify'" in unknown.stderr
    assert "github, whatsapp" in unknown.stderr
    no_secret = send("github", "--json", "{}", tmp_path=tmp_path, env={})
    assert no_secret.returncode == 2
    assert "Traceback" not in no_secret.stderr
    assert "GITHUB_WEBHOOK_SECRET" in no_secret.stderr or "META_APP_SECRET" in no_secret.stderr


def test_json_nested_past_the_parser_is_one_line(tmp_path: Path) -> None:
    """``--json`` nested 10,000 deep is one error line with exit 2, not a RecursionError."""
    deep = "[" * 10_000 + "]" * 10_000
    sent = send("github", "--json", deep, tmp_path=tmp_path, env=SECRETS)
    assert sent.returncode == 2, sent.stderr
    assert "Traceback" not in sent.stderr
    assert "--json is nested too deeply to read" in sent.stderr

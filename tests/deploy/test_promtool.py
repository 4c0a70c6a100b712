"""The PromQL of deploy/ checked by Prometheus's own engine: promtool (``make promtool``).

``promtool check rules`` parses deploy/prometheus/alerts.yaml and every query of the KEDA
ScaledObjects of deploy/k8s; ``promtool test rules`` runs the rule unit tests of
tests/deploy/promtool/, whose series carry the names and labels a scraped member exports. The
unit tests run on a copy of the rules without their annotations (promtool compares rendered
annotations whole; ``check rules`` already parses their templates). promtool is built once from
its Go module and cached (deploy/local/promtool.sh); without it these tests skip.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
K8S = ROOT / "deploy" / "k8s"
RULE_TESTS = Path(__file__).parent / "promtool"


@pytest.fixture(scope="module")
def promtool() -> Path:
    """The cached promtool binary; skip when it has not been built."""
    where = subprocess.run(
        ["bash", str(ROOT / "deploy" / "local" / "promtool.sh"), "path"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    binary = Path(where)
    if not binary.is_file():
        pytest.skip("promtool is not built (make promtool builds it once, several minutes)")
    return binary


def run(promtool: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool with ARGS, its output kept."""
    return subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def keda_queries() -> list[tuple[str, str]]:
    """(where, query) of every Prometheus trigger of every ScaledObject under deploy/k8s."""
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not isinstance(document, dict) or document.get("kind") != "ScaledObject":
                continue
            for index, trigger in enumerate(document["spec"]["triggers"]):
                if trigger["type"] == "prometheus":
                    where = f"{path.relative_to(ROOT)}#{index}"
                    found.append((where, trigger["metadata"]["query"]))
    return found


def test_the_alert_rules_pass_promtool_check(promtool: Path) -> None:
    """Every rule of alerts.yaml parses in promtool: its expression and its templates."""
    result = run(promtool, "check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_keda_query_parses(promtool: Path, tmp_path: Path) -> None:
    """Each ScaledObject's Prometheus query is valid PromQL (checked as a recording rule)."""
    queries = keda_queries()
    assert len(queries) >= 6, queries
    rules = [{"record": f"keda:query{n}", "expr": query} for n, (_, query) in enumerate(queries)]
    path = tmp_path / "keda.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "keda", "rules": rules}]}))
    result = run(promtool, "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def bare_rules() -> dict[str, Any]:
    """alerts.yaml without its annotations."""
    document: dict[str, Any] = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return document


@pytest.mark.parametrize("name", sorted(p.stem for p in RULE_TESTS.glob("*.yaml")))
def test_alert_rule_unit_tests(promtool: Path, tmp_path: Path, name: str) -> None:
    """The alerts fire, and stay quiet, on realistic series as tests/deploy/promtool/NAME says."""
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(bare_rules()), encoding="utf-8")
    shutil.copy(RULE_TESTS / f"{name}.yaml", tmp_path / "test.yaml")
    result = run(promtool, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr

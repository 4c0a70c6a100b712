"""Generated files are current: docs/configuration.md and the consumer-group manifests."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import RuntimeSettings
from pipeline.topics.spec import load_specs
from scripts import config_doc, manifests

ROOT = Path(__file__).parents[2]


def test_configuration_reference_is_current():
    """docs/configuration.md is what `python scripts/config_doc.py` writes."""
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == config_doc.render(), "run: python scripts/config_doc.py"


def test_every_setting_has_a_meaning():
    """Each row of the configuration reference explains its variable."""
    rows = [line for line in config_doc.render().splitlines() if line.startswith("| `PIPELINE_")]
    assert rows
    assert [row for row in rows if row.rstrip().endswith("|  |")] == []


def test_consumer_manifests_are_current():
    """deploy/k8s/base/consumers is what `python scripts/manifests.py` writes."""
    files = manifests.render_all(load_specs(ROOT / "topics"), RuntimeSettings())
    directory = ROOT / manifests.OUTPUT
    committed = {p.name: p.read_text(encoding="utf-8") for p in directory.glob("*.yaml")}
    assert committed == files, "run: python scripts/manifests.py"

"""docs/glossary.md agrees with the metric families and the header names."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline import headers
from pipeline.observability.metrics import FAMILIES

GLOSSARY = Path(__file__).parents[2] / "docs" / "glossary.md"
ROW = re.compile(r"^\| `(pipeline_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|", re.MULTILINE)


def test_every_metric_family_is_in_the_glossary_with_its_type_and_labels():
    """The glossary's metric table lists exactly the defined families, types and labels."""
    rows = {
        name: (kind, tuple(re.findall(r"`(\w+)`", labels)))
        for name, kind, labels in ROW.findall(GLOSSARY.read_text(encoding="utf-8"))
    }
    defined = {family.name: (family.kind, family.labels) for family in FAMILIES}
    assert rows == defined


def test_every_header_is_in_the_glossary():
    """Each header name of pipeline/headers.py has a row in the glossary."""
    text = GLOSSARY.read_text(encoding="utf-8")
    names = [v for k, v in vars(headers).items() if k.isupper() and isinstance(v, str)]
    assert names
    missing = [name for name in names if f"| `{name}` |" not in text]
    assert missing == []

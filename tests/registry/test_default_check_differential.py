"""The memoised, bounded default check gives the verdicts of the plain recursive one.

The reference is the check before memoising (Java's ``isValidValue``, a union trying every
branch): over a seeded set of generated schemas (records, enums and fixed in several
namespaces under one name, unions, arrays, maps, defaults that match or not, 1, 1.0 and true,
one object reused in several places) and a few written to share a memo key if any could,
``parse`` answers the same: the same normalised schema or the same refusal.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from pipeline.registry import canonical
from pipeline.registry.errors import InvalidSchema

SCHEMAS = 3000
SCALARS: list[Any] = [None, True, False, 0, 1, 1.0, -1, 2**31, 2**63, 1.5, "", "A", "ab"]
LOOSE: list[Any] = [[], {}, [1], {"f0": 1}, {"f0": None}, {"f1": [1.0]}]


def reference(schema: Any, value: Any, names: dict[str, Any]) -> bool:
    """The check before memoising: every branch of a union tried, every time."""
    if isinstance(schema, list):
        return any(reference(branch, value, names) for branch in schema)
    if isinstance(schema, str) and schema not in canonical.PRIMITIVES:
        schema = names[schema]
    kind = schema if isinstance(schema, str) else schema["type"]
    if kind in canonical._SCALAR_DEFAULTS:
        return canonical._SCALAR_DEFAULTS[kind](value)
    if kind == "array":
        return isinstance(value, list) and all(reference(schema["items"], v, names) for v in value)
    if kind == "map":
        return isinstance(value, dict) and all(
            reference(schema["values"], v, names) for v in value.values()
        )
    return isinstance(value, dict) and all(
        reference(f["type"], value[f["name"]], names) if f["name"] in value else "default" in f
        for f in schema["fields"]
    )


class _Reference:
    """Stands in for the memoised check in :func:`canonical._check_defaults`."""

    def __init__(self, names: dict[str, Any], limit: int | None) -> None:  # noqa: ARG002
        self.names = names

    def matches(self, schema: Any, value: Any) -> bool:
        return reference(schema, value, self.names)


class _Generator:
    """Random schemas and defaults of a seed; named types may share a name across namespaces."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.named: list[str] = []
        self.n = 0

    def type(self, depth: int) -> Any:
        r, c = self.r, self.r.random()
        if depth > 4 or c < 0.3:
            return r.choice([*sorted(canonical.PRIMITIVES), *self.named])
        if c < 0.45:
            return {"type": "array", "items": self.type(depth + 1)}
        if c < 0.55:
            return {"type": "map", "values": self.type(depth + 1)}
        if c < 0.75:
            branches, seen = [], set()
            for _ in range(r.randint(1, 4)):
                t = self.type(depth + 1)
                if isinstance(t, list):
                    continue
                key = t if isinstance(t, str) else str(t.get("name", t["type"]))
                if key in seen:
                    continue
                seen.add(key)
                branches.append(t)
            return branches or ["null"]
        return self.named_type(depth)

    def named_type(self, depth: int) -> Any:
        r = self.r
        self.n += 1
        space = r.choice([None, "x", "y", "x.y"])
        name = r.choice(["R", "S"]) + (str(self.n) if r.random() < 0.6 else "")
        full = f"{space}.{name}" if space else name
        if full in self.named:
            return full
        kind = r.choice(["record", "record", "enum", "fixed"])
        t: dict[str, Any] = {"type": kind, "name": name}
        if space:
            t["namespace"] = space
        self.named.append(full)
        if kind == "enum":
            t["symbols"] = ["A", "B"]
        elif kind == "fixed":
            t["size"] = 2
        else:
            t["fields"] = []
            for i in range(r.randint(0, 3)):
                f: dict[str, Any] = {"name": f"f{i}", "type": self.type(depth + 1)}
                if r.random() < 0.5:
                    f["default"] = self.value(f["type"], depth + 1)
                t["fields"].append(f)
        return t

    def value(self, t: Any, depth: int) -> Any:
        r = self.r
        if r.random() < 0.15 or depth > 8:
            return r.choice(SCALARS + LOOSE)
        if isinstance(t, list):
            return self.value(r.choice(t), depth + 1)
        if not isinstance(t, dict):
            return r.choice([*SCALARS, {"f0": 1}, {}])
        return self.structured(t, depth)

    def structured(self, t: dict[str, Any], depth: int) -> Any:
        """A value shaped like ``t`` (array, map, record) or, for enum and fixed, close."""
        r = self.r
        if t["type"] == "array":
            if r.random() < 0.5:  # one object in several places
                return [self.value(t["items"], depth + 1)] * r.randint(0, 3)
            return [self.value(t["items"], depth + 1) for _ in range(r.randint(0, 3))]
        if t["type"] == "map":
            return {f"k{i}": self.value(t["values"], depth + 1) for i in range(r.randint(0, 3))}
        if t["type"] == "record":
            return {f["name"]: self.value(f["type"], depth + 1) for f in t["fields"]}
        return r.choice(["A", 1, "ab"])

    def schema(self) -> dict[str, Any]:
        fields = []
        for i in range(self.r.randint(1, 4)):
            t = self.type(0)
            fields.append({"name": f"t{i}", "type": t, "default": self.value(t, 0)})
        return {"type": "record", "name": "Top", "namespace": "z", "fields": fields}


def verdict(raw: Any) -> str:
    """The normalised schema, or the refusal's message."""
    try:
        return canonical.parse_json(raw).normalized
    except InvalidSchema as exc:
        return f"refused: {exc}"


def both(raw: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """``raw``'s verdict by the memoised check, then by the reference."""
    memoised = verdict(raw)
    with monkeypatch.context() as patched:
        patched.setattr(canonical, "_DefaultCheck", _Reference)
        return memoised, verdict(raw)


def two_namespaces(default: Any) -> dict[str, Any]:
    """x.R (field a int) and y.R (field a boolean) in one union, then ``default`` for it."""
    xr = {"type": "record", "name": "R", "namespace": "x", "fields": [{"name": "a", "type": "int"}]}
    yr = {
        "type": "record",
        "name": "R",
        "namespace": "y",
        "fields": [{"name": "a", "type": "boolean"}],
    }
    return {
        "type": "record",
        "name": "Top",
        "fields": [
            {"name": "u", "type": {"type": "array", "items": [xr, yr]}, "default": default},
            {"name": "v", "type": {"type": "array", "items": ["x.R"]}, "default": default},
        ],
    }


SHARED = {"a": True}
WRITTEN = {
    "one-true-one-point-zero": {
        "type": "record",
        "name": "Top",
        "fields": [
            {"name": f"n{i}", "type": {"type": "array", "items": [kind]}, "default": [v]}
            for i, (kind, v) in enumerate(
                [("int", 1), ("int", 1.0), ("int", True), ("float", 1), ("boolean", 1)]
            )
        ],
    },
    "a-name-in-two-namespaces": two_namespaces([{"a": 1}, {"a": True}]),
    "one-object-under-two-unions": two_namespaces([SHARED, SHARED]),
}


@pytest.mark.parametrize("raw", WRITTEN.values(), ids=WRITTEN.keys())
def test_written_cases_get_the_reference_verdict(
    raw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values equal in Python (1, 1.0, True), one name in two namespaces, one object twice."""
    memoised, expected = both(raw, monkeypatch)
    assert memoised == expected


def test_generated_schemas_get_the_reference_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every generated schema: the same verdict; some valid and some refused for a default."""
    valid = refused_default = 0
    for seed in range(SCHEMAS):
        raw = _Generator(seed).schema()
        memoised, expected = both(raw, monkeypatch)
        assert memoised == expected, (seed, json.dumps(raw)[:500])
        valid += not memoised.startswith("refused")
        refused_default += "does not match the field's type" in memoised
    assert valid > SCHEMAS // 20
    assert refused_default > SCHEMAS // 20

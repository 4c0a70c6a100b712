"""JSON pointers with wildcards, value extraction, and first-match lane routing."""

from __future__ import annotations

import pytest

from pipeline.ingress.extract import Extractor, parse_pointer, resolve
from pipeline.ingress.route import Condition, Route, RouteRules

DOC = {
    "entry": [
        {"id": 1, "changes": [{"field": "messages"}, {"field": "comments"}]},
        {"id": "b", "changes": []},
    ],
    "a/b": {"m~n": True},
}


def test_pointer_escapes_and_indices() -> None:
    """~1 and ~0 unescape, numbers index arrays, and the empty pointer is the document."""
    assert list(resolve(DOC, parse_pointer("/a~1b/m~0n"))) == [True]
    assert list(resolve(DOC, parse_pointer("/entry/1/id"))) == ["b"]
    assert list(resolve(DOC, parse_pointer(""))) == [DOC]
    assert list(resolve(DOC, parse_pointer("/entry/5/id"))) == []
    with pytest.raises(ValueError, match="starts with '/'"):
        parse_pointer("entry")


def test_wildcards_visit_every_element() -> None:
    """* matches each element of arrays and each value of objects."""
    assert list(resolve(DOC, parse_pointer("/entry/*/changes/*/field"))) == [
        "messages",
        "comments",
    ]


def test_extractors_read_pointer_header_or_constant() -> None:
    """Non-string values become compact JSON; a missing value is None."""
    assert Extractor(pointer=parse_pointer("/entry/0/id")).extract(DOC, {}) == "1"
    assert Extractor(pointer=parse_pointer("/nope")).extract(DOC, {}) is None
    assert Extractor(header="x-tenant").extract(None, {"x-tenant": "acme"}) == "acme"
    assert Extractor(constant="fixed").extract(None, {}) == "fixed"


def test_first_matching_rule_wins_then_the_default() -> None:
    """Rules are tried in order; without a match the default route is taken."""
    messages, engagement, other = Route("m", "m"), Route("e", "e"), Route("o", "o")
    router = RouteRules(
        [
            (
                Condition(
                    parse_pointer("/entry/*/changes/*/field"), one_of=frozenset({"comments"})
                ),
                engagement,
            ),
            (Condition(parse_pointer("/entry/0/id"), equals=1), other),
        ],
        messages,
    )
    assert router.route(DOC) == engagement
    assert router.route({"entry": [{"id": 1}]}) == other
    assert router.route({"entry": []}) == messages
    absent = RouteRules([(Condition(parse_pointer("/x"), exists=False), other)], messages)
    assert absent.route({}) == other

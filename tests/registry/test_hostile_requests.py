"""Hostile requests answer a 4xx naming the problem, never a 500, on both stores.

Each request here once reached a Python or database error (ValueError, OverflowError,
RecursionError, UnicodeEncodeError, psycopg's DataError) and came back as a 500 with a traceback
in the log. Confluent's answers are the reference: 40403 for an id that names nothing, 42201 for
a schema or body that cannot be read, 42202 for a bad version.
"""

from __future__ import annotations

import httpx
import pytest

MEDIA_TYPE = "application/vnd.schemaregistry.v1+json"


def answer_of(response: httpx.Response) -> tuple[int, int]:
    """(HTTP status, Confluent error code) of an error answer."""
    return response.status_code, response.json()["error_code"]


ODD_IDS = {
    "superscript-two": "²",
    "arabic-indic-one": "\u0661",
    "past-2^64": "99999999999999999999",
    "2^31": "2147483648",
    "5000-digits": "9" * 5000,
    "5000-zeros": "0" * 5000,
}


@pytest.mark.parametrize("raw_id", ODD_IDS.values(), ids=ODD_IDS.keys())
@pytest.mark.parametrize("suffix", ["", "/schema", "/versions", "/subjects"])
def test_an_id_that_is_not_a_31_bit_number_is_not_found(
    registry_url: str, raw_id: str, suffix: str
) -> None:
    """Non-ASCII digits and ids past 2^31-1 answer 40403, as an id no schema has."""
    httpx.post(f"{registry_url}/subjects/held/versions", json={"schema": '"int"'})  # id 1 exists
    answer = httpx.get(f"{registry_url}/schemas/ids/{raw_id}{suffix}")
    assert answer_of(answer) == (404, 40403), answer.text

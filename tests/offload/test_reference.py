"""The reference codec: small, round-trips, and refuses what this version cannot read."""

from __future__ import annotations

import pytest

from pipeline.offload import reference as ref
from pipeline.offload.errors import ReferenceRefused
from pipeline.offload.policy import OffloadPolicy
from pipeline.topics.spec import TopicSpec


def test_a_reference_round_trips_and_stays_small() -> None:
    """Body and headers decode to the same reference, in well under 1 KiB together."""
    reference = ref.reference_for("s3://pipeline/p", b"x" * 1000, "application/json")
    body, headers = reference.encode()
    assert ref.is_reference(headers)
    assert ref.decode(body, headers) == reference
    assert len(body) + sum(len(k) + len(v) for k, v in headers.items()) < 1024


def test_an_unknown_format_or_a_forged_key_is_refused() -> None:
    """A newer format, a body that is no reference, or a key not from the digest: refused."""
    body, headers = ref.reference_for("file:///srv/p", b"abc").encode()
    with pytest.raises(ReferenceRefused, match="format '2'"):
        ref.decode(body, {**headers, ref.OFFLOAD: b"2"})
    with pytest.raises(ReferenceRefused):
        ref.decode(b"not json", headers)
    forged = body.replace(b'"key":"sha256/', b'"key":"../../etc/')
    with pytest.raises(ReferenceRefused, match="content-addressed"):
        ref.decode(forged, headers)


def test_the_lane_declaration_reads_sizes_and_stores() -> None:
    """``offload:`` takes 256KiB-style sizes with a default and only s3:// or file:/// stores."""
    spec = TopicSpec.model_validate(
        {"name": "uploads", "partitions": 1, "offload": {"store": "s3://b/p/"}}
    )
    assert spec.offload == OffloadPolicy(above=256 * 1024, store="s3://b/p")
    assert OffloadPolicy(above="1MiB", store="file:///x").above_bytes == 1_048_576
    bad = [{"store": "http://x"}, {"store": "file://rel"}, {"store": "s3://b", "above": "1 lb"}]
    for fields in bad:
        with pytest.raises(ValueError, match=r"expected|absolute path"):
            OffloadPolicy.model_validate(fields)

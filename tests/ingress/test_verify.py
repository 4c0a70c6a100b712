"""Every verification scheme: the providers' published vectors, then each way to fail."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from ingress.signing import hub_signature, standard_headers, standard_signature, stripe_signature

from pipeline.errors import ConfigError
from pipeline.ingress.errors import Rejected
from pipeline.ingress.verify import (
    HmacHeaderVerifier,
    HubSignatureVerifier,
    StandardWebhooksVerifier,
    StripeVerifier,
    UnverifiedVerifier,
)

# GitHub, "Validating webhook deliveries", section "Testing the webhook payload validation".
GITHUB_SECRET = "It's a Secret to Everybody"  # noqa: S105 - GitHub's documented vector
GITHUB_BODY = b"Hello, World!"
GITHUB_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"

# Svix, "Verifying Webhooks Manually" / Standard Webhooks reference example.
SVIX_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # noqa: S105 - Svix's documented vector
SVIX_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SVIX_TIMESTAMP = 1614265330
SVIX_BODY = b'{"test": 2432232314}'
SVIX_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

NOW_S = 1_800_000_000.0


def reason(verify: object) -> str:
    """The reason a call to ``verify()`` is rejected with."""
    assert callable(verify)
    with pytest.raises(Rejected) as caught:
        verify()
    return caught.value.reason


# GitHub and Meta: X-Hub-Signature-256


def test_github_documented_vector_is_accepted() -> None:
    """GitHub's published secret, payload and signature verify."""
    verifier = HubSignatureVerifier([GITHUB_SECRET])
    verifier.verify({"x-hub-signature-256": GITHUB_SIGNATURE}, GITHUB_BODY, NOW_S)


def test_hub_signature_helper_matches_the_documented_vector() -> None:
    """The tests' own signer reproduces GitHub's vector, so its other signatures are trusted."""
    assert hub_signature(GITHUB_SECRET, GITHUB_BODY) == GITHUB_SIGNATURE


def test_hub_signature_accepts_upper_case_hex_and_a_rotated_secret() -> None:
    """Any active secret verifies, and hex case does not matter."""
    verifier = HubSignatureVerifier(["new-secret", GITHUB_SECRET])
    verifier.verify({"x-hub-signature-256": GITHUB_SIGNATURE.upper()}, GITHUB_BODY, NOW_S)


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ({"x-hub-signature-256": GITHUB_SIGNATURE}, b"Hello, World?", "signature mismatch"),
        (
            {"x-hub-signature-256": hub_signature("wrong", GITHUB_BODY)},
            GITHUB_BODY,
            "signature mismatch",
        ),
        ({}, GITHUB_BODY, "missing signature header"),
        ({"x-hub-signature-256": "sha1=" + "0" * 64}, GITHUB_BODY, "malformed signature header"),
        ({"x-hub-signature-256": "sha256=xyz"}, GITHUB_BODY, "malformed signature header"),
        ({"x-hub-signature-256": "sha256=" + "é" * 64}, GITHUB_BODY, "malformed signature header"),
    ],
    ids=["tampered-body", "wrong-secret", "missing", "wrong-prefix", "not-hex", "non-ascii"],
)
def test_hub_signature_rejections(headers: dict[str, str], body: bytes, expected: str) -> None:
    """A tampered body, a wrong secret, a missing or malformed header are each rejected."""
    verifier = HubSignatureVerifier([GITHUB_SECRET])
    assert reason(lambda: verifier.verify(headers, body, NOW_S)) == expected


# Stripe


def stripe_vector(secret: str, body: bytes, timestamp: int) -> str:
    """Stripe publishes no fixed vector; this is its documented algorithm, spelled out inline."""
    payload = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest()


def test_stripe_signature_is_accepted() -> None:
    """A v1 signature over "{t}.{body}" with the whsec_ secret used as is verifies."""
    secret, body, t = "whsec_test_secret", b'{"id": "evt_1", "object": "event"}', int(NOW_S)
    header = f"t={t},v1={stripe_vector(secret, body, t)}"
    assert header == stripe_signature(secret, body, t)
    StripeVerifier([secret], 300).verify({"stripe-signature": header}, body, NOW_S)


def test_stripe_accepts_any_v1_during_a_roll_and_ignores_v0() -> None:
    """With several v1 (a secret roll) and a v0, one matching v1 is enough."""
    secret, body, t = "whsec_new", b"{}", int(NOW_S)
    header = f"t={t},v1={'0' * 64},v1={stripe_vector(secret, body, t)},v0={'1' * 64}"
    StripeVerifier(["whsec_old", secret], 300).verify({"stripe-signature": header}, body, NOW_S)


@pytest.mark.parametrize(
    ("header", "body", "now_s", "expected"),
    [
        (stripe_signature("whsec_s", b"{}", int(NOW_S)), b"{ }", NOW_S, "signature mismatch"),
        (stripe_signature("whsec_x", b"{}", int(NOW_S)), b"{}", NOW_S, "signature mismatch"),
        (
            stripe_signature("whsec_s", b"{}", int(NOW_S) - 301),
            b"{}",
            NOW_S,
            "timestamp outside tolerance",
        ),
        (
            stripe_signature("whsec_s", b"{}", int(NOW_S) + 301),
            b"{}",
            NOW_S,
            "timestamp outside tolerance",
        ),
        (None, b"{}", NOW_S, "missing signature header"),
        ("t=abc,v1=00", b"{}", NOW_S, "malformed signature header"),
        (f"t={int(NOW_S)}", b"{}", NOW_S, "malformed signature header"),
        ("garbage", b"{}", NOW_S, "malformed signature header"),
    ],
    ids=["tampered", "wrong-secret", "stale", "future", "missing", "bad-t", "no-v1", "garbage"],
)
def test_stripe_rejections(header: str | None, body: bytes, now_s: float, expected: str) -> None:
    """Tampered, wrong secret, stale or future timestamp, missing or malformed: rejected."""
    verifier = StripeVerifier(["whsec_s"], 300)
    headers = {} if header is None else {"stripe-signature": header}
    assert reason(lambda: verifier.verify(headers, body, now_s)) == expected


def test_stripe_accepts_a_timestamp_just_inside_tolerance() -> None:
    """A timestamp exactly at the tolerance is still fresh."""
    header = stripe_signature("whsec_s", b"{}", int(NOW_S) - 300)
    StripeVerifier(["whsec_s"], 300).verify({"stripe-signature": header}, b"{}", NOW_S)


# Standard Webhooks


def test_standard_webhooks_documented_vector_is_accepted() -> None:
    """The Svix / Standard Webhooks published example verifies at its own time."""
    headers = {
        "webhook-id": SVIX_ID,
        "webhook-timestamp": str(SVIX_TIMESTAMP),
        "webhook-signature": SVIX_SIGNATURE,
    }
    StandardWebhooksVerifier([SVIX_SECRET], 300).verify(headers, SVIX_BODY, SVIX_TIMESTAMP)
    assert standard_signature(SVIX_SECRET, SVIX_ID, SVIX_TIMESTAMP, SVIX_BODY) == SVIX_SIGNATURE


def test_standard_webhooks_svix_header_names_are_accepted() -> None:
    """The same example under svix-* header names verifies."""
    headers = {
        "svix-id": SVIX_ID,
        "svix-timestamp": str(SVIX_TIMESTAMP),
        "svix-signature": SVIX_SIGNATURE,
    }
    StandardWebhooksVerifier([SVIX_SECRET], 300).verify(headers, SVIX_BODY, SVIX_TIMESTAMP)


def test_standard_webhooks_rotation_with_several_secrets_and_signatures() -> None:
    """Several active secrets and space-separated signatures (v1a skipped): one match suffices."""
    old = "whsec_" + base64.b64encode(b"old key bytes").decode()
    body, t = b'{"a":1}', int(NOW_S)
    signature = "v1a,AAAA " + standard_signature(old, "msg_1", t, body) + " v1,!!notbase64"
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(t), "webhook-signature": signature}
    StandardWebhooksVerifier([SVIX_SECRET, old], 300).verify(headers, body, NOW_S)


@pytest.mark.parametrize(
    ("change", "now_s", "expected"),
    [
        ({"body": b'{"test": 2432232315}'}, SVIX_TIMESTAMP, "signature mismatch"),
        ({"webhook-id": "msg_other"}, SVIX_TIMESTAMP, "signature mismatch"),
        ({}, SVIX_TIMESTAMP + 301, "timestamp outside tolerance"),
        ({}, SVIX_TIMESTAMP - 301, "timestamp outside tolerance"),
        ({"webhook-signature": None}, SVIX_TIMESTAMP, "missing signature header"),
        ({"webhook-timestamp": "soon"}, SVIX_TIMESTAMP, "malformed signature header"),
        ({"webhook-signature": "v2,abc"}, SVIX_TIMESTAMP, "malformed signature header"),
        ({"webhook-signature": "v1,\xe9"}, SVIX_TIMESTAMP, "malformed signature header"),
    ],
    ids=[
        "tampered",
        "other-id",
        "stale",
        "future",
        "missing",
        "bad-timestamp",
        "no-v1",
        "non-ascii",
    ],
)
def test_standard_webhooks_rejections(change: dict[str, object], now_s: int, expected: str) -> None:
    """Tampered body or id, stale or future timestamp, missing or malformed header: rejected."""
    headers: dict[str, object] = {
        "webhook-id": SVIX_ID,
        "webhook-timestamp": str(SVIX_TIMESTAMP),
        "webhook-signature": SVIX_SIGNATURE,
    }
    body = change.pop("body", SVIX_BODY)
    headers.update(change)
    present = {k: str(v) for k, v in headers.items() if v is not None}
    verifier = StandardWebhooksVerifier([SVIX_SECRET], 300)
    assert isinstance(body, bytes)
    assert reason(lambda: verifier.verify(present, body, now_s)) == expected


def test_standard_webhooks_skips_a_non_ascii_entry_and_checks_the_others() -> None:
    """A ``v1`` entry with a non-ASCII byte is skipped, not a crash; a valid one still counts."""
    headers = {
        "webhook-id": SVIX_ID,
        "webhook-timestamp": str(SVIX_TIMESTAMP),
        "webhook-signature": f"v1,\xe9== {SVIX_SIGNATURE}",
    }
    StandardWebhooksVerifier([SVIX_SECRET], 300).verify(headers, SVIX_BODY, SVIX_TIMESTAMP)


def test_standard_webhooks_wrong_secret_is_rejected() -> None:
    """The documented example does not verify under another secret."""
    other = "whsec_" + base64.b64encode(b"another key").decode()
    headers = standard_headers(SVIX_SECRET, SVIX_ID, SVIX_TIMESTAMP, SVIX_BODY)
    verifier = StandardWebhooksVerifier([other], 300)
    assert reason(lambda: verifier.verify(headers, SVIX_BODY, SVIX_TIMESTAMP)) == (
        "signature mismatch"
    )


@pytest.mark.parametrize("secret", ["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_%%%", "whsec_"])
def test_standard_webhooks_invalid_secret_fails_closed_at_start(secret: str) -> None:
    """A secret without whsec_, not base64, or empty is a configuration error, not an accept."""
    with pytest.raises(ConfigError):
        StandardWebhooksVerifier([secret], 300)


# Generic HMAC


@pytest.mark.parametrize(
    ("algorithm", "encoding", "prefix"),
    [("sha256", "hex", ""), ("sha1", "hex", "sha1="), ("sha512", "base64", "")],
)
def test_generic_hmac_forms_are_accepted(algorithm: str, encoding: str, prefix: str) -> None:
    """Each hash and encoding verifies with its prefix."""
    mac = hmac.new(b"k", b"payload", getattr(hashlib, algorithm))
    value = mac.hexdigest() if encoding == "hex" else base64.b64encode(mac.digest()).decode()
    verifier = HmacHeaderVerifier(
        ["k"],
        header="X-Sig",
        algorithm=algorithm,
        encoding=encoding,
        prefix=prefix,  # type: ignore[arg-type]
    )
    verifier.verify({"x-sig": prefix + value}, b"payload", NOW_S)


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        (
            {"x-sig": hmac.new(b"k", b"payload", hashlib.sha256).hexdigest()},
            b"payloaD",
            "signature mismatch",
        ),
        (
            {"x-sig": hmac.new(b"other", b"payload", hashlib.sha256).hexdigest()},
            b"payload",
            "signature mismatch",
        ),
        ({}, b"payload", "missing signature header"),
        ({"x-sig": ""}, b"payload", "malformed signature header"),
    ],
    ids=["tampered", "wrong-secret", "missing", "empty"],
)
def test_generic_hmac_rejections(headers: dict[str, str], body: bytes, expected: str) -> None:
    """Tampered, wrong secret, missing or empty header: rejected."""
    verifier = HmacHeaderVerifier(["k"], header="X-Sig")
    assert reason(lambda: verifier.verify(headers, body, NOW_S)) == expected


def test_unverified_scheme_accepts_anything() -> None:
    """The explicit none scheme accepts a request with no signature at all."""
    UnverifiedVerifier().verify({}, b"anything", NOW_S)

"""How each provider signs a webhook, written from the providers' documentation.

Deliberately independent of ``pipeline.ingress.verify``: the tests sign with these and check that
the verifiers accept, so a shared misunderstanding would need to be made twice.
"""

from __future__ import annotations

import base64
import hashlib
import hmac


def hub_signature(secret: str, body: bytes) -> str:
    """``X-Hub-Signature-256`` as GitHub and Meta send it."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def stripe_signature(secret: str, body: bytes, timestamp: int) -> str:
    """``Stripe-Signature`` with one ``v1`` (https://docs.stripe.com/webhooks#verify-manually)."""
    signed = f"{timestamp}.".encode() + body
    return f"t={timestamp},v1={hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()}"


def standard_signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` entry of ``webhook-signature`` (Standard Webhooks spec)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def standard_headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers for ``body``."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": standard_signature(secret, msg_id, timestamp, body),
    }

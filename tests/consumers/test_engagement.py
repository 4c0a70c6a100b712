"""Unit tests of consumers/engagement.py (a throttled, unordered lane) with pipeline.testing."""

from __future__ import annotations

from consumers.engagement import EngagementEvent, app
from pipeline.testing import TestApp


def comment(n: int, customer: str = "cust-1", text: str = "nice") -> dict[str, str]:
    """A comment on conversation ``n`` by an end-customer (JSON, as the ingress produces it)."""
    return {
        "conversation_id": f"post-{n}",
        "kind": "comment",
        "text": text,
        "customer_id": customer,
    }


async def test_a_tenant_storm_is_held_to_its_throttle_limit() -> None:
    """Acme's 12 events never run more than 2 at once while beta's run beside them."""
    limits = {"org:acme": 2}
    async with TestApp(app, throttle_limits=limits) as t:
        for n in range(12):
            await t.send("engagement", comment(n, customer=f"c{n}"), key=f"post-{n}", tenant="acme")
        for n in range(3):
            await t.send("engagement", comment(100 + n), key=f"post-b{n}", tenant="beta")
        await t.drain()
        assert len(t.handled("engagement")) == 15
        assert t.peak_concurrency("engagement", tenant="acme") == 2
        beta = t.runs("engagement", lambda r: r.tenant == "beta")
        last_acme_start = max(r.started_s for r in t.runs("engagement") if r.tenant == "acme")
        assert max(r.started_s for r in beta) < last_acme_start  # not queued behind acme


async def test_an_end_customer_is_its_own_throttle_key() -> None:
    """One noisy end-customer is held to its own key's limit inside its tenant."""
    async with TestApp(app, throttle_limits={"sub:acme/noisy": 1}) as t:
        for n in range(5):
            await t.send("engagement", comment(n, customer="noisy"), key=f"p{n}", tenant="acme")
        for n in range(5):
            await t.send("engagement", comment(n, customer=f"q{n}"), key=f"q{n}", tenant="acme")
        await t.drain()
        assert len(t.handled("engagement")) == 10
        noisy = t.runs("engagement", lambda r: r.message.value.find(b'"noisy"') > 0)
        assert len(noisy) == 5
        assert t.recorder.peak_concurrency("engagement", lambda r: r in noisy) == 1
        assert t.peak_concurrency("engagement", tenant="acme") > 1


async def test_spam_is_dead_lettered_for_a_person_to_look_at() -> None:
    """A spam comment goes to engagement.dlq, reason fatal, with its tenant."""
    async with TestApp(app) as t:
        await t.send("engagement", comment(1, text="buy spam now"), key="post-1", tenant="acme")
        await t.drain()
        (dead,) = t.dead_letters("engagement")
        assert (dead.reason, dead.error_message, dead.tenant) == (
            "fatal",
            "flagged as spam",
            "acme",
        )
        assert EngagementEvent.model_validate_json(dead.message.value).text == "buy spam now"

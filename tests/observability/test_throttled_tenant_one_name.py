"""A throttled tenant has one name in the metrics and in both status commands.

``pipeline status`` lists a lane's throttled tenants as what follows ``org:`` in their active
throttle keys, and ``pipeline throttle status`` prints those keys; both are
:func:`~pipeline.admission.keys.org_name`. The top-tenant gauge labelled a ``pl-tenant`` over a
kilobyte by :func:`~pipeline.redis_keys.headed` of the tenant alone instead: another head (64
characters of the tenant, not 60 after ``org:``) and another digest (of the tenant, not of its
key), and a tenant of 1021 to 1024 bytes in full (1 KiB in every scrape) where status showed
132 bytes. An operator who saw a tenant in a metric could not find it in status. A tenant with
a lone surrogate made every later scrape fail (no UTF-8 form).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Mapping

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from runtime.helpers import eventually, lane_spec
from support import serving_metrics

from pipeline import headers as h
from pipeline.admission.keys import org_name
from pipeline.admission.throttle import Throttle
from pipeline.admission.view import ThrottledTenants
from pipeline.envelope import Message
from pipeline.observability.facades import AdmissionMetrics
from pipeline.observability.metrics import TOP_TENANTS, Metrics
from pipeline.observability.server import MetricsServer
from pipeline.runtime.throttle_gate import ThrottleGate
from pipeline.topics.spec import ThrottlePolicy

LANE = "engagement"
FAMILY = "pipeline_throttled_tenant_waiting"
LABEL_MAX_BYTES = 4 * 60 + 72
"""The longest name org_name gives a tenant over the bound: 60 characters and the digest."""

HOSTILE: dict[str, bytes] = {
    "mebibyte": b"m" * (1024 * 1024),
    "two_kib": b"t" * 2047 + b"a",
    "at_the_bound": b"b" * 1022,  # the tenant fits the bound, its key org:TENANT does not
    "quotes_newlines": b'a"b\nc\\d}{x',
    "not_utf8": b"bad\xff\xfe\xed\xa0\x80",  # \xed\xa0\x80 is a UTF-8-encoded surrogate
}
"""``pl-tenant`` headers as producers sent them."""

LONE = chr(0xDC80)
"""A lone surrogate: what ``surrogateescape`` or a JSON ``\\udc80`` leaves in a str."""


def _scraped(exposition: str) -> dict[str, float]:
    """The top-tenant gauge's samples of ``LANE`` in a parsed text exposition: tenant -> value."""
    return {
        sample.labels["tenant"]: sample.value
        for family in text_string_to_metric_families(exposition)
        if family.name == FAMILY
        for sample in family.samples
        if sample.labels["lane"] == LANE
    }


def _report(metrics: AdmissionMetrics, waiting_by: Mapping[tuple[str, str], int]) -> None:
    """What the member's report tick hands the facade: the gate's waiting per tenant."""
    tenants = {tenant: n for (lane, tenant), n in waiting_by.items() if lane == LANE}
    metrics.throttled_tenants(LANE, tenants)


async def _throttle_status(redis_url: str, namespace: str) -> list[dict[str, object]]:
    """``pipeline throttle status --json`` of ``namespace``: one object per active key."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pipeline",
        "throttle",
        "status",
        "--json",
        env={
            **os.environ,
            "PIPELINE_REDIS__URL": redis_url,
            "PIPELINE_THROTTLE__NAMESPACE": namespace,
            "PIPELINE_THROTTLE__DEFAULT_LIMIT": "1",
        },
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    return [json.loads(line) for line in out.decode().splitlines()]


@pytest.fixture
async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle of limit 1 on a namespace holding ``unique`` (its keys go with it)."""
    t = Throttle(Redis.from_url(redis_service), namespace=f"label{unique}", default_limit=1)
    await t.start()
    yield t
    await t.close()
    await t.client.aclose()


@pytest.mark.redis
async def test_a_metric_names_a_hostile_tenant_as_both_status_commands_do(
    throttle: Throttle, redis_service: str
) -> None:
    """Two messages of each hostile tenant on a limit of 1: one runs, one waits in Redis.

    The scraped label of each waiting tenant is the name ``pipeline status`` lists, and
    ``org:`` and it is the key ``pipeline throttle status`` prints. Before, three of the five
    differed (the 1 MiB, the 2 KiB and the 1022-byte tenant).
    """
    admitted: list[Message] = []
    gate: ThrottleGate[Message] = ThrottleGate(throttle, admitted.append, admitted.append)
    policy = ThrottlePolicy.model_validate({"keys": ["org:{tenant}"]})
    offset = 0
    for tenant in HOSTILE.values():
        for _ in range(2):  # two keys of one tenant: both heads ask for org:TENANT
            message = Message(LANE, 0, offset, str(offset).encode(), b"{}", {h.TENANT: tenant})
            gate.offer(message, policy, LANE, ordered=True, busy=False, can_defer=False)
            offset += 1
    metrics = Metrics()
    admission = AdmissionMetrics(metrics)
    server = MetricsServer(metrics, interval_s=3600)
    try:
        await eventually(lambda: throttle.waited == len(HOSTILE), 30)
        assert len(admitted) == len(HOSTILE)
        _report(admission, gate.waiting_by)
        await server.refresh_once()
        async with serving_metrics(server) as port, httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{port}/metrics")
        assert response.status_code == 200
        labels = _scraped(response.text)

        spec = lane_spec(LANE, 1, throttle={"keys": ["org:{tenant}"]})
        view = ThrottledTenants(
            throttle.client,
            [spec],
            prefix=throttle.prefix,
            namespace=throttle.namespace,
            default_limit=1,
        )
        listed = dict(await view.throttled_tenants(LANE, TOP_TENANTS))
        keys = {str(s["key"]) for s in await _throttle_status(redis_service, throttle.namespace)}

        assert labels == dict.fromkeys(listed, 1.0), (sorted(labels), sorted(listed))
        assert {f"org:{name}" for name in labels} == keys
        assert len(labels) == len(HOSTILE)
        assert all(len(name.encode()) <= LABEL_MAX_BYTES for name in labels)
        assert len(response.content) < 64 * 1024  # a 1 MiB tenant is no 1 MiB scrape
    finally:
        for message in admitted:
            gate.finished(message)
        await gate.close()


def test_labels_stay_few_short_and_valid_for_a_flood_of_hostile_tenants() -> None:
    """A thousand tenants of up to 2 KiB and a 1 MiB one, with quotes, newlines, lone surrogates.

    At most :data:`TOP_TENANTS` series, each named by :func:`org_name` (a lone surrogate as
    U+FFFD, as the throttle key has it), and the exposition parses back to those names. A lone
    surrogate made ``generate_latest`` raise before, so no scrape rendered at all. Two tenants
    of one throttle key (``a`` and a lone surrogate, ``a`` and U+FFFD) are one series with
    their sum.
    """
    metrics = Metrics()
    admission = AdmissionMetrics(metrics)
    flood = {f'q"{i}\n\\' + LONE * (i % 3) + "z" * (2048 * (i % 2)): 1 for i in range(1000)}
    huge = "huge" + LONE + "h" * (1024 * 1024)
    top = {
        huge: 50,
        'quote"line\nback\\slash': 40,
        "a" + LONE: 30,
        "a\ufffd": 25,
        "b" * 1022: 20,
    }
    admission.throttled_tenants(LANE, {**flood, **top})
    exposition = generate_latest(metrics.registry)
    scraped = _scraped(exposition.decode())
    assert len(scraped) == TOP_TENANTS
    assert all(len(name.encode()) <= LABEL_MAX_BYTES for name in scraped)
    assert len(exposition) < 64 * 1024
    assert scraped[org_name("a" + LONE)] == 55  # one key in Redis, one series
    for tenant in (huge, 'quote"line\nback\\slash', "b" * 1022):
        assert scraped[org_name(tenant)] == top[tenant]
    # The flood leaves the top: its series go, the rest keep their one name.
    admission.throttled_tenants(LANE, top)
    assert len(_scraped(generate_latest(metrics.registry).decode())) == len(top) - 1
    admission.throttled_tenants(LANE, {})
    assert _scraped(generate_latest(metrics.registry).decode()) == {}


def test_a_throttle_key_shared_by_many_tenants_is_ranked_by_their_sum() -> None:
    """Tenants of one name are ranked as one: 4 x 15 waiting outrank 20 tenants of 20 each."""
    metrics = Metrics()
    admission = AdmissionMetrics(metrics)
    waiting = {f"acme{chr(0xDC80 + n)}": 15 for n in range(4)}  # all "acme\ufffd" in Redis
    waiting.update({f"other{n:02d}": 20 for n in range(20)})
    for _ in range(2):  # the second tick names them from what the first learnt
        admission.throttled_tenants(LANE, waiting)
        scraped = _scraped(generate_latest(metrics.registry).decode())
        assert scraped[org_name("acme" + LONE)] == 60
        assert len(scraped) == TOP_TENANTS

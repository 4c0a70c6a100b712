"""Scale-in protection: a member keeps its own Pod's deletion cost equal to its long work."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from redis.asyncio import Redis
from runtime.helpers import eventually, lane_spec, running
from runtime.k8s_api import PodApi, pod, serving
from runtime.owned import Declare

from pipeline.config import RuntimeSettings
from pipeline.envelope import Record
from pipeline.observability.deletion_cost import ANNOTATION, DeletionCost, PodRef
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.runtime.protection import ScaleInProtection
from pipeline.transport.protocol import Transport

OWN = ("pipeline", "consumer-a")
QUICK = RuntimeSettings(commit_interval_ms=100, shutdown_grace_s=5.0, cancel_poll_ms=50)


def _cost(api: PodApi, base: str, token: Path) -> DeletionCost:
    ref = PodRef("pipeline", "consumer-a", base, token_path=token)
    return DeletionCost(ref, client=httpx.AsyncClient(timeout=5.0), min_interval_s=0.0)


async def test_a_busy_member_protects_only_its_own_pod_and_clears_it(
    transport: Transport,
    redis: Redis,
    prefix: str,
    unique: str,
    tmp_path: Path,
    lanes: Declare,
) -> None:
    """Long work raises the Pod's deletion cost while it runs; done or stopped, it drops to 0."""
    token = tmp_path / "token"
    token.write_text("member-token")
    api = PodApi(
        {
            ("pipeline", "consumer-a"): pod("pipeline", "consumer-a"),
            ("pipeline", "consumer-b"): pod("pipeline", "consumer-b"),
        }
    )
    spec = lane_spec(f"long_{unique}", 2, heartbeat_timeout="30s")
    await lanes(spec)
    app = App([spec])
    release = asyncio.Event()
    running_now: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        running_now.append(event)
        await release.wait()

    async with serving(api) as base:
        cost = _cost(api, base, token)
        member = Member(
            app,
            transport,
            f"g-{unique}",
            QUICK,
            redis=redis,
            redis_prefix=prefix,
            deletion_cost=cost,
        )
        producer = transport.producer()
        async with running(member):
            await producer.send_many(spec.name, [Record(b"a", b"1"), Record(b"b", b"2")])
            await eventually(lambda: len(running_now) == 2)
            await eventually(lambda: "2" in api.annotation_values(*OWN, ANNOTATION))
            release.set()
            await eventually(lambda: member.stats.handled == 2)
            await eventually(
                lambda: api.annotation_values("pipeline", "consumer-a", ANNOTATION)[-1] == "0"
            )
        await producer.close()
    values = api.annotation_values("pipeline", "consumer-a", ANNOTATION)
    assert values[0] == "0"  # a member starts unprotected
    assert "2" in values
    assert values[-1] == "0"
    assert {path for path, _, _ in api.calls} == {"/api/v1/namespaces/pipeline/pods/consumer-a"}
    assert {ctype for _, ctype, _ in api.calls} == {"application/merge-patch+json"}
    held = api.pods["pipeline", "consumer-a"]["metadata"]["annotations"]
    assert held == {"kept": "yes", ANNOTATION: "0"}  # other annotations untouched
    assert "annotations" not in api.pods["pipeline", "consumer-b"]["metadata"] or (
        ANNOTATION not in api.pods["pipeline", "consumer-b"]["metadata"]["annotations"]
    )


async def test_protection_lapses_after_its_bound(tmp_path: Path) -> None:
    """A run older than protect_max_s stops counting, so a stuck handler cannot pin its Pod."""
    token = tmp_path / "token"
    token.write_text("member-token")
    api = PodApi({("pipeline", "consumer-a"): pod("pipeline", "consumer-a")})
    async with serving(api) as base:
        protection = ScaleInProtection(_cost(api, base, token), None, max_s=60.0)
        await protection.update([100.0, 150.0], now_s=155.0)
        await protection.update([100.0, 150.0], now_s=200.0)  # the first run is past the bound
        await protection.update([100.0, 150.0], now_s=300.0)
        await protection.close()
    assert api.annotation_values("pipeline", "consumer-a", ANNOTATION) == ["2", "1", "0"]

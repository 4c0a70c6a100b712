"""The dynamic limit formulas of seed 000, and their effect on a real throttle."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis

from pipeline.admission.keys import org_config
from pipeline.admission.limits import (
    LimitPolicy,
    LimitTracker,
    OrgLimits,
    ceiling,
    dynamic_limit,
    earned_base,
    load_org_overrides,
    load_policy,
    pressure_factor,
    store_org_override,
)
from pipeline.admission.throttle import MAX_LIMIT, Throttle
from pipeline.errors import ConfigError


def test_earned_base_is_littles_law_with_a_floor():
    """The base is ceil(R * D / 60) but never below the floor."""
    assert earned_base(2, 600, 3.0) == 30
    assert earned_base(2, 10, 1.0) == 2
    assert earned_base(0, 7, 10.0) == 2  # 70 / 60 rounds up
    assert earned_base(5, 0, 0) == 5
    assert earned_base(0, -3, 5) == 0  # nonsense rates count as none


def test_demand_with_no_finished_job_earns_one_slot_above_a_zero_floor():
    """An org submitting but with no job finished in the window (D unknown) needs one slot."""
    assert earned_base(0, 5, 0.0) == 1
    assert earned_base(0, 0, 0.0) == 0  # no demand, nothing earned
    assert earned_base(3, 5, 0.0) == 3


def test_ceiling_takes_the_larger_burst():
    """The ceiling adds the larger of the burst floor and the burst share of the base."""
    assert ceiling(10, 2, 0.5) == 15
    assert ceiling(2, 4, 0.5) == 6
    assert ceiling(3, 0, 0.5) == 5  # 1.5 rounds up


@pytest.mark.parametrize(
    ("pool_target", "in_flight", "expected"),
    [
        (100, 0, 2.0),
        (100, 25, 2.0),
        (100, 50, 2.0),
        (100, 100, 1.0),
        (100, 200, 0.5),
        (100, 400, 0.25),
        (100, 10_000, 0.25),
    ],
)
def test_pressure_factor_is_clamped(pool_target, in_flight, expected):
    """The factor is pool_target / in_flight clamped to [f_min, f_max], f_max when idle."""
    assert pressure_factor(pool_target, in_flight, 0.25, 2.0) == expected


def test_dynamic_limit_keeps_floor_and_adds_dedicated():
    """Under heavy pressure the floor still holds, and dedicated capacity comes on top."""
    org = OrgLimits(floor=3, burst_floor=2, burst_pct=0.5, dedicated=4)
    relaxed = dynamic_limit(
        org, rate_per_min=600, duration_s=3, pool_target=100, in_flight=50, f_min=0.25, f_max=2.0
    )
    assert relaxed == (30 + 15) * 2 + 4
    squeezed = dynamic_limit(
        org, rate_per_min=0, duration_s=0, pool_target=100, in_flight=10_000, f_min=0.25, f_max=2.0
    )
    assert squeezed == 3 + 4


def test_policy_from_yaml(tmp_path: Path):
    """A YAML file gives the defaults, the per-org settings and the factors."""
    path = tmp_path / "limits.yaml"
    path.write_text("f_min: 0.5\ndefaults: {floor: 1}\norgs:\n  acme: {floor: 8, dedicated: 2}\n")
    policy = load_policy(path)
    assert policy.f_min == 0.5
    assert policy.for_org("acme").floor == 8
    assert policy.for_org("other").floor == 1


@pytest.mark.redis
async def test_higher_submission_rate_raises_the_limit(redis_service, unique):
    """An org submitting faster earns a higher limit on its throttle key, set without redeploy."""
    client = Redis.from_url(redis_service)
    throttle = Throttle(client, prefix=f"p{unique}", namespace="lim", default_limit=1)
    await throttle.start()
    tracker = LimitTracker(client, f"p{unique}")
    now_s = 1_800_000_000.0
    for minute in range(5):
        at = now_s - 60 * minute
        await tracker.record("busy", submitted=300, durations_s=[2.0] * 10, now_s=at)
        await tracker.record("calm", submitted=6, durations_s=[2.0] * 10, now_s=at)
    rate, duration = await tracker.rates("busy", now_s=now_s)
    assert rate == pytest.approx(300)
    assert duration == pytest.approx(2.0)
    policy = LimitPolicy()
    limits = await tracker.recompute(
        throttle, ["busy", "calm"], policy, pool_target=100, in_flight=100, now_s=now_s
    )
    assert limits["busy"] > limits["calm"] >= policy.defaults.floor
    assert (await throttle.status("org:busy")).limit == limits["busy"]
    # A per-org override stored in Redis applies at the next recompute.
    await store_org_override(client, f"p{unique}", "calm", OrgLimits(floor=50))
    policy = await load_org_overrides(client, f"p{unique}", policy)
    limits = await tracker.recompute(
        throttle, ["calm"], policy, pool_target=100, in_flight=100, now_s=now_s
    )
    assert (await throttle.status("org:calm")).limit == limits["calm"] >= 50
    await client.delete(org_config(f"p{unique}"))
    await throttle.close()
    await client.aclose()


@pytest.mark.redis
async def test_a_steady_rate_reads_the_same_at_any_second_of_the_minute(redis_service, unique):
    """A steady 60 jobs a minute reads as 60/min, not 5/6 of it early in each minute."""
    client = Redis.from_url(redis_service)
    tracker = LimitTracker(client, f"p{unique}")
    minute_s = 1_800_000_000.0  # the start of a minute
    for back in range(1, 7):  # six whole minutes of one job a second
        await tracker.record("steady", submitted=60, now_s=minute_s - 60 * back)
    assert (await tracker.rates("steady", now_s=minute_s))[0] == pytest.approx(60)
    await tracker.record("steady", submitted=30, now_s=minute_s + 29)  # half the minute gone
    assert (await tracker.rates("steady", now_s=minute_s + 30))[0] == pytest.approx(60)
    await client.aclose()


@pytest.mark.redis
async def test_an_org_whose_limit_passes_the_throttles_maximum_gets_the_maximum(
    redis_service, unique, caplog
):
    """A limit over 2^31-1 is set as 2^31-1 with a warning, and the orgs after it still get theirs.

    Before, set_limit refused it with ValueError part way: every tick skipped that org and every
    org sorted after it.
    """
    client = Redis.from_url(redis_service)
    throttle = Throttle(client, prefix=f"p{unique}", namespace="lim", default_limit=1)
    await throttle.start()
    tracker = LimitTracker(client, f"p{unique}")
    await store_org_override(client, f"p{unique}", "aaa", OrgLimits(dedicated=2**31))
    policy = await load_org_overrides(client, f"p{unique}", LimitPolicy())
    try:
        limits = await tracker.recompute(
            throttle, ["aaa", "zzz"], policy, pool_target=100, in_flight=100
        )
        assert limits == {"aaa": MAX_LIMIT, "zzz": limits["zzz"]}
        assert (await throttle.status("org:aaa")).limit == MAX_LIMIT
        assert (await throttle.status("org:zzz")).limit == limits["zzz"] >= 2
        (line,) = [r.getMessage() for r in caplog.records if "'aaa'" in r.getMessage()]
        assert "dedicated" in line
        assert str(MAX_LIMIT) in line
    finally:
        await client.delete(org_config(f"p{unique}"))
        await throttle.close()
        await client.aclose()


@pytest.mark.parametrize(
    "text", ["defaults: {burst_pct: .inf}", "f_max: .inf", "orgs: {a: {burst_pct: .inf}}"]
)
def test_a_policy_with_an_infinite_factor_is_refused(tmp_path: Path, text: str):
    """An infinite factor is refused where the policy is loaded, not at every tick."""
    path = tmp_path / "limits.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match="finite"):
        load_policy(path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "cannot read"),
        ("defaults: {floor: -1}\n", "defaults.floor: input should be greater than or equal to 0"),
        ("f_mn: 1\n", "f_mn: unknown field"),
        ("defaults: [1\n", "invalid YAML"),
        ("- floor: 1\n", "expected a mapping"),
        (b"f_min: \xff\n", "cannot read"),
        ("orgs:\n  acme: {floor: 8}\n  acme: {floor: 1}\n", "duplicate key 'acme'"),
    ],
)
def test_a_bad_policy_file_is_one_line_naming_file_and_field(tmp_path: Path, text, problem):
    """A missing, unreadable, malformed or invalid policy file is one ConfigError naming it."""
    path = tmp_path / "limits.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert problem in message
    assert "PIPELINE_THROTTLE__DYNAMIC__POLICY_FILE" in message
    assert "\n" not in message


@pytest.mark.redis
async def test_an_override_with_an_infinite_burst_share_is_skipped(redis_service, unique, caplog):
    """An override whose burst_pct is Infinity is one warning naming the org and the field."""
    client = Redis.from_url(redis_service)
    try:
        await client.hset(org_config(f"p{unique}"), "acme", '{"burst_pct": Infinity}')
        policy = await load_org_overrides(client, f"p{unique}", LimitPolicy())
        assert policy.for_org("acme") == LimitPolicy().defaults
        (line,) = [r.getMessage() for r in caplog.records if "'acme'" in r.getMessage()]
        assert "burst_pct" in line
    finally:
        await client.delete(org_config(f"p{unique}"))
        await client.aclose()

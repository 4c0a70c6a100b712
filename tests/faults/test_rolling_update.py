"""A rolling update, and its rollback: the previous build's members beside this one's in a group.

Opt-in: the previous build is a checkout of an earlier commit (CI has only this one), named by
``FAULTS_OLD_BUILD``, e.g. ``git worktree add /tmp/old-6a37647 6a37647`` and
``FAULTS_OLD_BUILD=/tmp/old-6a37647`` (``docs/operations.md``, upgrading). ``FAULTS_NEW_BUILD``
may name a checkout of the new build too (by default the members run this one).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from faults.crashloop import APP, CrashLoop
from faults.rolling_update import MixedCluster, Rollout, run_rolling_update
from faults.services import KafkaServer, PrivateRedis

OLD = os.environ.get("FAULTS_OLD_BUILD")
NEW = os.environ.get("FAULTS_NEW_BUILD") or None
"""The new build: a checkout of it (a working tree others edit may not import), else this one."""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not OLD, reason="opt-in: FAULTS_OLD_BUILD names a checkout of the previous build"
    ),
]

ENV = {
    "PIPELINE_RUNTIME__MARK_PROCESSED": "false",  # no ingress: the events have no log rows
    "PIPELINE_RUNTIME__COMMIT_INTERVAL_MS": "500",  # the defaults, as deployed
    "PIPELINE_RUNTIME__LIVENESS_MS": "5000",
    "PIPELINE_KAFKA__SESSION_TIMEOUT_MS": "10000",
    "PIPELINE_RUNTIME__SHUTDOWN_GRACE_S": "10",  # as deploy/k8s sets it
    "FAULTS_WORK_MS": "200",  # each run takes a downstream call's time, so runs can meet,
}
RETRY: dict[str, object] = {"tiers": ["200ms", "1s"]}
LOAD = CrashLoop(events=3_000, keys=100, flaky_per_mille=20, produce_s=30.0, kills=0)


@pytest.mark.parametrize("settled", [True, False], ids=["settled", "amid_rebalance"])
@pytest.mark.parametrize("direction", ["upgrade", "rollback"])
async def test_rolling_update(
    direction: str,
    settled: bool,
    tmp_path: Path,
    private_redis: PrivateRedis,
    private_kafka: KafkaServer,
    unique: str,
) -> None:
    """Upgrade: old and new members, the old one replaced by a new one; rollback: the reverse.

    Nothing lost, reordered or overlapping, no key left parked, no crash, a graceful stop; the
    old member stopped once it has partitions again after the surge (``settled``), or as soon as
    the new one polls (``amid_rebalance``), a third into the load.
    """
    new, old = NEW, OLD
    first, by = ((old, new), new) if direction == "upgrade" else ((new, old), old)
    cluster = MixedCluster(
        tmp_path / "cluster",
        "kafka",
        unique,
        redis_url=private_redis.url,
        bootstrap_servers=private_kafka.bootstrap_servers,
        members=2,
        partitions=6,
        retry=RETRY,
        app=APP,
        env=ENV,
        builds=list(first),
    )
    await run_rolling_update(
        cluster, LOAD, Rollout(first=first, replaced=0, by=by, settled=settled)
    )


def _names_long_keys_by_base64(build: str | None) -> bool:
    """Whether ``build`` parks a key over 768 bytes under its base64 (before 9ee14fd)."""
    if build is None:
        return False
    keys = Path(build) / "pipeline" / "retry" / "keys.py"
    text = keys.read_text() if keys.exists() else ""
    return not any(word in text for word in ("sha256", "digest", "headed"))


MIXED_NAMES = pytest.mark.xfail(
    _names_long_keys_by_base64(OLD),
    strict=True,
    reason="a key over 768 bytes is parked under its base64 by 6a37647 (and every build before"
    " 9ee14fd) and under its digest"
    " since the key bound: members of the two builds strand each other's held followers"
    " (lost), and now and then run a stale retry copy beside a first delivery; roll that"
    " change out as a recreate (docs/operations.md, rolling deploys)",
)


@pytest.mark.parametrize(
    "direction",
    [
        pytest.param("upgrade", marks=MIXED_NAMES),
        pytest.param("rollback", marks=MIXED_NAMES),
        "new_only",
        "old_only",
    ],
)
async def test_rolling_update_long_keys(
    direction: str,
    tmp_path: Path,
    private_redis: PrivateRedis,
    private_kafka: KafkaServer,
    unique: str,
) -> None:
    """As :func:`test_rolling_update` (settled), with message keys of 800 bytes.

    A key over 768 bytes names its parked state by its digest in the new build, by its base64
    in the previous one (``pipeline/retry/keys.py``, ``encode_key``). ``new_only`` and
    ``old_only`` restart a member of one build as the others do: the same load, no mixed fleet.
    """
    new, old = NEW, OLD
    first, by = {
        "upgrade": ((old, new), new),
        "rollback": ((new, old), old),
        "new_only": ((new, new), new),
        "old_only": ((old, old), old),
    }[direction]
    cluster = MixedCluster(
        tmp_path / "cluster",
        "kafka",
        unique,
        redis_url=private_redis.url,
        bootstrap_servers=private_kafka.bootstrap_servers,
        members=2,
        partitions=6,
        retry=RETRY,
        app=APP,
        env=ENV,
        builds=list(first),
    )
    rollout = Rollout(first=first, replaced=0, by=by, key_bytes=800)
    await run_rolling_update(cluster, LOAD, rollout)

"""Stable member names: explicit, or the host name and a slot that a dead process gives back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.transport.identity import claim_identity

HOLDER = """
import sys, time
from pipeline.transport.identity import claim_identity
identity = claim_identity(sys.argv[1], host="pod")
print(identity.name, flush=True)
time.sleep(120)
"""


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Slot locks of each test in its own directory (the default when no slot_dir is given)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path


def test_an_explicit_instance_is_used_as_it_is() -> None:
    """--instance NAME is the member's name, with no slot taken."""
    identity = claim_identity("orders", "orders-7")
    assert identity.name == "orders-7"
    assert identity.lock is None


@pytest.mark.parametrize("bad", ["", "has space", "slash/no", "x" * 201 + "é"])
def test_an_instance_with_bad_characters_is_a_config_error(bad: str) -> None:
    """A name Kafka or Redis could not hold is refused with a one-line ConfigError."""
    with pytest.raises(ConfigError, match="--instance"):
        claim_identity("orders", bad)


def test_slot_dir_holds_the_locks(tmp_path: Path) -> None:
    """An explicit slot directory (membership.slot_dir) is where the slot's lock file goes."""
    identity = claim_identity("orders", host="pod", slot_dir=tmp_path / "slots")
    assert identity.name == "pod-0"
    assert (tmp_path / "slots" / "orders.pod.0.lock").is_file()
    identity.release()
    assert not (tmp_path / "slots" / "orders.pod.0.lock").exists()


def test_members_on_one_host_get_distinct_slots_and_a_freed_slot_is_reused() -> None:
    """Two live members of a group on one host never share a name; a released slot comes back."""
    first = claim_identity("orders", host="pod")
    second = claim_identity("orders", host="pod")
    other_group = claim_identity("billing", host="pod")
    assert (first.name, second.name, other_group.name) == ("pod-0", "pod-1", "pod-0")
    first.release()
    again = claim_identity("orders", host="pod")
    assert again.name == "pod-0"
    for identity in (second, other_group, again):
        identity.release()


def test_a_killed_process_gives_its_slot_to_its_replacement() -> None:
    """The kernel drops a kill -9'd member's slot lock: its replacement gets its name back."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, "orders"], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "pod-0"
            while_alive = claim_identity("orders", host="pod")
            assert while_alive.name == "pod-1"
            while_alive.release()
        finally:
            holder.kill()
            holder.wait()
    replacement = claim_identity("orders", host="pod")
    assert replacement.name == "pod-0"
    replacement.release()

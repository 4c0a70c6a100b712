"""free_port: a port below the kernel's ephemeral range that binds now, never given twice."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pipeline.testing.ports import LOWEST, ephemeral_start, free_port


def test_a_port_lies_below_the_ephemeral_range_and_binds() -> None:
    """Fifty ports: distinct, each in LOWEST..ephemeral start, and one binds."""
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(LOWEST <= port < ephemeral_start() for port in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))


def test_a_port_someone_listens_on_is_skipped() -> None:
    """A held port is never given; with none left in the range the call says so."""
    with socket.socket() as held:
        try:
            held.bind(("127.0.0.1", LOWEST))
        except OSError:
            pytest.skip(f"port {LOWEST} is in use on this machine")
        held.listen(1)
        assert free_port(below=LOWEST + 2) == LOWEST + 1
        with pytest.raises(OSError, match="no port in"):
            free_port(below=LOWEST + 2)  # LOWEST is held, LOWEST + 1 was given


def test_the_kernels_range_is_read_and_a_missing_file_falls_back(tmp_path: Path) -> None:
    """The first number of ip_local_port_range; Linux's default where it can't be read."""
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("40000\t60999\n", encoding="ascii")
    assert ephemeral_start(setting) == 40000
    assert ephemeral_start(tmp_path / "absent") == 32768


def test_a_range_leaving_no_room_is_refused_with_what_to_change() -> None:
    """An ephemeral range starting at LOWEST leaves nothing: the error names the setting."""
    with pytest.raises(OSError, match="ip_local_port_range"):
        free_port(below=LOWEST)

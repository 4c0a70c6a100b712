"""A real PgBouncer in transaction pooling mode in front of the test PostgreSQL, for the stores.

Started on a free loopback port with an ini and a plain-text auth file of its own; stopped, and
its process waited for, when the block ends. Tests skip when the ``pgbouncer`` binary is not
installed (Debian: ``apt-get install pgbouncer``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from support import IN_CI

POOL_SIZE = 2
"""Server connections per database and user: fewer than the store's, so clients share them."""


def require_pgbouncer() -> str:
    """The path of the ``pgbouncer`` binary; skip (locally) or fail (under CI=true) without it.

    ``make services`` installs it with PostgreSQL (deploy/local/postgres.sh); Debian puts it in
    /usr/sbin, which a non-root PATH may lack.
    """
    binary = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if binary is None:
        message = (
            "the pgbouncer binary is not installed; `make services` installs it"
            " (Debian: apt-get install pgbouncer)"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return binary


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _quoted(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


@contextmanager
def pgbouncer(
    postgres_url: str, tmp_path: Path, databases: Mapping[str, str] | None = None
) -> Iterator[str]:
    """Run PgBouncer (transaction mode) in front of ``postgres_url``; yield its URL.

    ``databases`` adds aliases of the same database, each name with the extra connection
    options of its ``[databases]`` line (``connect_query='SET search_path = x'``); the URL
    yielded names the real database, the caller swaps the path for an alias.
    """
    binary = require_pgbouncer()
    server = urlsplit(postgres_url)
    userinfo = server.netloc.rsplit("@", 1)[0]
    user, password = unquote(server.username or ""), unquote(server.password or "")
    dbname = server.path.lstrip("/")
    target = f"host={server.hostname} port={server.port or 5432} dbname={dbname}"
    lines = [f"{dbname} = {target}"]
    lines += [f"{alias} = {target} {extra}" for alias, extra in (databases or {}).items()]
    port = _free_port()
    (tmp_path / "userlist.txt").write_text(f"{_quoted(user)} {_quoted(password)}\n")
    ini = tmp_path / "pgbouncer.ini"
    ini.write_text(
        "\n".join(
            [
                "[databases]",
                *lines,
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {port}",
                "unix_socket_dir =",
                "auth_type = plain",
                f"auth_file = {tmp_path / 'userlist.txt'}",
                "pool_mode = transaction",
                f"default_pool_size = {POOL_SIZE}",
                "max_client_conn = 100",
                "log_connections = 0",
                "log_disconnections = 0",
                "log_stats = 0",
                "",
            ]
        )
    )
    # PgBouncer refuses to run as root; it reads its files first, then becomes ``-u`` user.
    as_user = ["-u", "nobody"] if os.geteuid() == 0 else []
    process = subprocess.Popen(
        [binary, *as_user, str(ini)], stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
    )
    said = _wait_until_up(process)
    try:
        yield f"postgresql://{userinfo}@127.0.0.1:{port}/{dbname}"
    finally:
        process.terminate()
        process.wait()
        said.join()


def _wait_until_up(process: subprocess.Popen[str]) -> threading.Thread:
    """Read PgBouncer's log until it says it is up; keep draining it in a thread after that."""
    assert process.stderr is not None
    log: list[str] = []
    for line in process.stderr:
        log.append(line)
        if "process up" in line:
            break
    else:
        process.wait()
        process.stderr.close()
        pytest.fail(f"pgbouncer did not start: {''.join(log)}")
    stderr = process.stderr

    def drain() -> None:
        with stderr:
            for _ in stderr:
                pass

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    return thread

"""Redis refusing the credentials or TLS, and Kafka refusing the client's security properties.

Each is one line that says what failed, where (password hidden) and what to change: never
"start it", since the service runs. The TLS Redis is a redis-server of this module's own.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from ingress.redis_server import password_redis as private_password_redis

from pipeline.config import load_settings
from pipeline.runtime.run import _address
from pipeline.testing.ports import free_port

SECRET = "wr0ng-pw-never-shown"  # noqa: S105 - a test value that must never be printed


def pipeline(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline ARGS`` in a subprocess with ``env`` added to the environment."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single error line of a failed command (no traceback, exit 1)."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@dataclass
class TlsRedis:
    """A redis-server listening only on a TLS port, with the CA that signed its certificate."""

    port: int
    ca: Path


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """A redis-server of this module's own on a free TLS-only loopback port; killed at the end."""
    if shutil.which("redis-server") is None or shutil.which("openssl") is None:
        pytest.skip("redis-server and openssl are needed; run `make services`")
    tmp = tmp_path_factory.mktemp("tls-redis")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp, check=True, capture_output=True)

    ca = ["-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-extfile", "ext.cnf"]
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "1")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "server.key", "-out", "server.csr")  # fmt: skip
    (tmp / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n", encoding="utf-8")
    openssl("x509", "-req", "-in", "server.csr", "-out", "server.crt", "-days", "1", *ca)
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(tmp / "server.crt"), "--tls-key-file", str(tmp / "server.key"),
         "--tls-ca-cert-file", str(tmp / "ca.crt"), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--dir", str(tmp)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        context = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
        deadline = time.monotonic() + 10
        while True:
            try:
                with (
                    socket.create_connection(("127.0.0.1", port), timeout=0.5) as raw,
                    context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
                ):
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"the TLS redis-server on {port} did not start"
            time.sleep(0.05)
        yield TlsRedis(port, tmp / "ca.crt")
    finally:
        process.kill()
        process.wait(timeout=10)


def test_tls_redis_with_its_ca_in_the_url_is_used(tls_redis: TlsRedis) -> None:
    """A rediss:// URL carrying the CA as the docs say (?ssl_ca_certs=) reaches the TLS Redis."""
    url = f"rediss://127.0.0.1:{tls_redis.port}/0?ssl_ca_certs={tls_redis.ca}"
    result = pipeline("topics", "list", "-t", "redis", env={"PIPELINE_REDIS__URL": url})
    assert result.returncode == 0, result.stderr


def test_tls_redis_without_its_ca_says_to_give_the_ca(tls_redis: TlsRedis) -> None:
    """A certificate Redis's client cannot verify is a TLS failure whose fix is the CA."""
    url = f"rediss://app:{SECRET}@127.0.0.1:{tls_redis.port}/0"
    result = pipeline("status", "-t", "redis", env={"PIPELINE_REDIS__URL": url})
    line = one_line(result)
    assert f"rediss://app:***@127.0.0.1:{tls_redis.port}/0" in line
    assert "TLS" in line
    assert "ssl_ca_certs" in line
    assert "make services" not in line
    assert SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize("command", [("status",), ("produce", "messages", "--value", "{}")])
def test_a_wrong_password_says_to_fix_the_credentials(
    redis_service: str, command: tuple[str, ...]
) -> None:
    """Redis refusing the URL's user and password says so, and the fix is the credentials."""
    user = f"nobody-{uuid.uuid4().hex[:8]}"
    address = urlsplit(redis_service)
    url = f"redis://{user}:{SECRET}@{address.hostname}:{address.port or 6379}/0"
    result = pipeline(*command, "-t", "redis", env={"PIPELINE_REDIS__URL": url})
    line = one_line(result)
    assert f"redis://{user}:***@{address.hostname}:{address.port or 6379}/0" in line
    assert "refused the credentials" in line
    assert "PIPELINE_REDIS__URL" in line
    assert "make services" not in line
    assert SECRET not in result.stdout + result.stderr


def test_kafka_security_properties_are_named_when_the_broker_does_not_answer(
    kafka_service: str,
) -> None:
    """A security.protocol the broker does not speak names PIPELINE_KAFKA__CLIENT's keys only."""
    client = f'{{"security.protocol": "SSL", "ssl.key.password": "{SECRET}"}}'
    result = pipeline("topics", "list", "-t", "kafka", env={"PIPELINE_KAFKA__CLIENT": client})
    line = one_line(result)
    assert kafka_service in line
    assert "PIPELINE_KAFKA__BOOTSTRAP_SERVERS" in line
    assert "PIPELINE_KAFKA__CLIENT (security.protocol, ssl.key.password)" in line
    assert SECRET not in result.stdout + result.stderr


def test_a_password_in_the_url_query_is_not_printed(redis_service: str) -> None:
    """redis-py also reads ``?username=&password=``: the refusal line masks that password too."""
    address = urlsplit(redis_service)
    user = f"nobody-{uuid.uuid4().hex[:8]}"
    url = f"redis://{address.hostname}:{address.port or 6379}/0?username={user}&password={SECRET}"
    result = pipeline("status", "-t", "redis", env={"PIPELINE_REDIS__URL": url})
    line = one_line(result)
    assert "refused the credentials" in line
    assert "password=***" in line
    assert SECRET not in result.stdout + result.stderr


def test_the_members_start_line_masks_a_query_password() -> None:
    """The address ``pipeline consume`` logs when it starts shows no password, in either place."""
    for url in (
        f"redis://app:{SECRET}@10.0.0.5:6380/2",
        f"redis://10.0.0.5:6380/2?password={SECRET}",
    ):
        shown = _address(load_settings(redis={"url": url}), "redis")
        assert SECRET not in shown
        assert "10.0.0.5:6380/2" in shown


@pytest.fixture
def password_redis() -> Iterator[int]:
    """A redis-server of this test's own that requires a password; its port."""
    with private_password_redis(SECRET) as port:
        yield port


def test_a_password_left_out_says_to_give_the_credentials(password_redis: int) -> None:
    """A URL without the password a Redis requires: the credentials, not "start it".

    redis-py reports it as "HELLO must be called with the client already authenticated" (the
    NOAUTH prefix stripped), which read as Redis not running.
    """
    url = f"redis://127.0.0.1:{password_redis}/0"
    result = pipeline("status", "-t", "redis", env={"PIPELINE_REDIS__URL": url})
    line = one_line(result)
    assert "refused the credentials" in line
    assert "PIPELINE_REDIS__URL" in line
    assert "make services" not in line

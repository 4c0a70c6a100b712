"""Private service instances the fault suite may kill, pause and restart.

The shared services (Redis on 6379, Kafka on 9092, PostgreSQL on 5432) are used by other test
runs at the same time and are never touched here. Each scenario gets its own ``redis-server``
(reusing ``tests/ingress/redis_server.py``), and the Kafka scenarios share one single-node KRaft
broker started from the jars ``deploy/local/kafka.sh`` cached in ``~/.cache/pipeline``, on free
loopback ports with a temporary data directory.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from ingress.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
KAFKA_DIR = ROOT / "deploy" / "local" / "kafka"
CACHE_DIR = Path(
    os.environ.get("PIPELINE_CACHE_DIR")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pipeline"
)

__all__ = ["KafkaServer", "PrivateRedis", "free_port", "kafka_libs", "port_open"]


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on the loopback ``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class PrivateRedis(RedisServer):
    """A private ``redis-server`` (append-only file, fsync always) that can also be killed."""

    def kill(self) -> None:
        """``kill -9`` the server: acknowledged writes survive in the fsynced append-only file."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
            self.process = None

    def restart(self) -> None:
        """Kill the server and start it again on the same port and files."""
        self.kill()
        self.start()


def kafka_libs() -> Path | None:
    """The cached Kafka jar directory (``~/.cache/pipeline/kafka-<version>/libs``), if any."""
    pom = (KAFKA_DIR / "pom.xml").read_text(encoding="utf-8")
    version = pom.split("<kafka.version>", 1)[1].split("<", 1)[0]
    libs = CACHE_DIR / f"kafka-{version}" / "libs"
    return libs if (libs / f"kafka_2.13-{version}.jar").is_file() else None


class KafkaServer:
    """A single-node KRaft broker (broker and controller in one JVM) on free loopback ports."""

    def __init__(self, directory: Path, libs: Path) -> None:
        """Describe a broker keeping its data and logs in ``directory``; nothing starts yet."""
        self.directory = directory
        self.libs = libs
        self.port = free_port()
        self.controller_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._formatted = False

    @property
    def bootstrap_servers(self) -> str:
        """The broker's bootstrap address."""
        return f"127.0.0.1:{self.port}"

    def _java(self, *args: str, heap_mb: int) -> list[str]:
        return [
            "java",
            f"-Xms{heap_mb // 2}m",
            f"-Xmx{heap_mb}m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={self.directory / 'logs'}",
            f"-Dlog4j2.configurationFile={KAFKA_DIR / 'log4j2.properties'}",
            "-cp",
            f"{self.libs}/*",
            *args,
        ]

    def _configure(self) -> Path:
        (self.directory / "logs").mkdir(parents=True, exist_ok=True)
        template = (KAFKA_DIR / "server.properties.in").read_text(encoding="utf-8")
        properties = self.directory / "server.properties"
        properties.write_text(
            template.replace("@DATA_DIR@", str(self.directory / "data"))
            .replace("@CONTROLLER_PORT@", str(self.controller_port))
            .replace("@PORT@", str(self.port)),
            encoding="utf-8",
        )
        if not self._formatted:
            cluster_id = "-"
            while cluster_id.startswith("-"):  # a leading dash would read as an option
                cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            subprocess.run(
                self._java(
                    "kafka.tools.StorageTool",
                    "format",
                    "--standalone",
                    "-t",
                    cluster_id,
                    "-c",
                    str(properties),
                    heap_mb=128,
                ),
                check=True,
                capture_output=True,
                timeout=120,
            )
            self._formatted = True
        return properties

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the broker (formatting its data directory the first time) and wait until ready."""
        properties = self._configure()
        log = self.directory / "logs" / "server.log"
        log.write_text("", encoding="utf-8")
        stdout = (self.directory / "logs" / "stdout.log").open("ab")
        self.process = subprocess.Popen(
            self._java("kafka.Kafka", str(properties), heap_mb=384),
            stdout=stdout,
            stderr=subprocess.STDOUT,
        )
        stdout.close()
        deadline = time.monotonic() + timeout_s
        while not (port_open(self.port) and "Kafka Server started" in log.read_text("utf-8")):
            if self.process.poll() is not None:
                raise AssertionError(f"private kafka exited at start; see {self.directory}/logs")
            if time.monotonic() > deadline:
                raise AssertionError(f"private kafka not ready after {timeout_s}s")
            time.sleep(0.1)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the broker (SIGTERM, a controlled shutdown; SIGKILL past ``timeout_s``)."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGCONT)  # a paused broker cannot shut down
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        """Stop the broker and start it again on the same ports and data."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP the broker: connections stay open but nothing answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused broker."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

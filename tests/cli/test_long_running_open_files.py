"""Every long-running command runs with its soft open-file limit raised to the hard one.

Started as systemd starts services (a soft limit far under the hard one; here 256 under 4096),
``pipeline consume``, ``pipeline sweep --loop`` and the registry server kept the soft limit they
were given. Each now raises it at its start, in the one entry point every command goes through
(:func:`pipeline.cli.main`, and ``python -m pipeline.registry``'s): each test starts the real
command, waits for it to serve, and reads its limits from ``/proc/PID/limits``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from cli.limits_sandbox import limited, open_file_limits
from runtime.helpers import eventually
from support import IDLE_APP, cli_environment

from pipeline.testing.ports import free_port

PIPELINE = Path(sys.executable).with_name("pipeline")
SOFT, HARD = 256, 4096


def _environment(**extra: str) -> dict[str, str]:
    """This process's environment without its ``PIPELINE_`` variables, plus ``extra``."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")} | extra


@contextmanager
def _started(
    argv: Sequence[str], env: dict[str, str], cwd: Path
) -> Iterator[subprocess.Popen[str]]:
    """``argv`` started under ``SOFT:HARD`` open files; SIGTERM-ed and reaped at the end."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limited(SOFT, HARD),  # noqa: PLW1509 - only sets a limit, before exec
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _healthy(proc: subprocess.Popen[str], port: int) -> bool:
    """Whether ``proc``'s metrics port answers ``/healthz`` (it failing ends the wait)."""
    assert proc.poll() is None, proc.communicate()[1]
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    except httpx.TransportError:  # not listening yet
        return False


async def _serving(proc: subprocess.Popen[str], port: int) -> None:
    """Until ``proc`` answers ``/healthz`` on ``port``; failing, with what it logged so far."""
    try:
        await eventually(lambda: _healthy(proc, port), timeout_s=60)
    except AssertionError as exc:
        proc.terminate()
        raise AssertionError(f"{exc}; its log: {proc.communicate(timeout=60)[1]}") from None


@pytest.mark.parametrize(
    "argv",
    [[str(PIPELINE)], [sys.executable, "-m", "pipeline.registry"]],
    ids=["pipeline registry serve", "python -m pipeline.registry"],
)
def test_the_registry_server(argv: list[str], tmp_path: Path) -> None:
    """The registry, from either entry point, serves with the hard limit as its soft one."""
    store = f"sqlite:///{tmp_path / 'registry.db'}"
    command = [*argv, "registry", "serve", "--port", "0", "--store", store]
    with _started(command, _environment(), tmp_path) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "registry listening on" in line, line + proc.communicate()[1]
        assert open_file_limits(proc.pid) == (HARD, HARD)


async def test_the_sweeper_loop(tmp_path: Path, redis_service: str) -> None:
    """``pipeline sweep --loop`` sweeps with the hard limit as its soft one."""
    port = free_port()
    env = cli_environment(
        tmp_path,
        PIPELINE_TRANSPORT="redis",
        PIPELINE_REDIS__URL=redis_service,
        PIPELINE_INGRESS__METRICS_PORT=str(port),
    )
    with _started([str(PIPELINE), "sweep", "--loop"], env, tmp_path) as proc:
        await _serving(proc, port)
        assert open_file_limits(proc.pid) == (HARD, HARD)


async def test_a_consumer(tmp_path: Path, redis_service: str, unique: str) -> None:
    """``pipeline consume`` (through :mod:`pipeline.runtime.run`) runs with the hard limit."""
    lane = f"nofile_{unique}"
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / f"{lane}.yaml").write_text(f"name: {lane}\npartitions: 1\n")
    (tmp_path / f"nofile_{unique}.py").write_text(IDLE_APP.format(lane=lane))
    port = free_port()
    env = _environment(
        PIPELINE_TRANSPORT="redis",
        PIPELINE_REDIS__URL=redis_service,
        PIPELINE_TOPICS_DIR=str(tmp_path / "topics"),
        PIPELINE_RUNTIME__METRICS_PORT=str(port),
    )
    argv = [str(PIPELINE), "consume", f"nofile_{unique}:app", "-g", f"g-{unique}"]
    with _started(argv, env, tmp_path) as proc:
        await _serving(proc, port)
        assert open_file_limits(proc.pid) == (HARD, HARD)

"""Every long-running command runs with its soft open-file limit raised to the hard one.

Started as systemd starts services (a soft limit far under the hard one; here 256 under 4096),
``pipeline consume``, ``pipeline sweep --loop`` and the registry server kept the soft limit they
were given. Each now raises it at its start, in the one entry point every command goes through
(:func:`pipeline.cli.main`, and ``python -m pipeline.registry``'s): each test starts the real
command, waits for it to serve, and reads its limits from ``/proc/PID/limits``.

Where the system refuses the raise (a seccomp filter answering EPERM to ``setrlimit``), every
command, ``--help`` included, printed a warning, and the stand-alone entries of the registry and
the ingress printed it bare (logging was not configured yet). Now the long-running commands log
one formatted line naming themselves, and short commands say nothing.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from cli.limits_sandbox import limited, open_file_limits, require_seccomp
from runtime.helpers import eventually
from support import IDLE_APP, cli_environment, run_pipeline

from pipeline.testing.ports import free_port

PIPELINE = Path(sys.executable).with_name("pipeline")
SOFT, HARD = 256, 4096
REGISTRY = [sys.executable, "-m", "pipeline.registry"]
INGRESS = [sys.executable, "-m", "pipeline.ingress.cli"]
REFUSED = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING pipeline\.descriptors open-file limit:"
    r" could not raise the soft limit from 256 to the hard limit 4096 \(EPERM: [^)]*\);"
    r" pipeline registry serve runs with 256 descriptors: raise the soft limit before the start"
    r" \(ulimit -n, LimitNOFILE=\) for more$"
)


def _environment(**extra: str) -> dict[str, str]:
    """This process's environment without its ``PIPELINE_`` variables, plus ``extra``."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")} | extra


@contextmanager
def _started(
    argv: Sequence[str], env: dict[str, str], cwd: Path, *, frozen: bool = False
) -> Iterator[subprocess.Popen[str]]:
    """``argv`` started under ``SOFT:HARD`` open files; SIGTERM-ed and reaped at the end.

    ``frozen``: the system refuses the command's raise of its limit.
    """
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limited(SOFT, HARD, frozen=frozen),  # noqa: PLW1509 - only sets a limit, before exec
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
        PIPELINE_REDIS__KEY_PREFIX=f"t{unique}",  # its topics and keys: deleted after the test
        PIPELINE_TOPICS_DIR=str(tmp_path / "topics"),
        PIPELINE_RUNTIME__METRICS_PORT=str(port),
    )
    # Applied first: a member whose topic is missing exits at its start, sometimes before the
    # wait below sees it serve.
    applied = await asyncio.to_thread(run_pipeline, "topics", "apply", env=env, cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    argv = [str(PIPELINE), "consume", f"nofile_{unique}:app", "-g", f"g-{unique}"]
    with _started(argv, env, tmp_path) as proc:
        await _serving(proc, port)
        assert open_file_limits(proc.pid) == (HARD, HARD)


@pytest.mark.parametrize("argv", [[str(PIPELINE)], REGISTRY], ids=["pipeline", "python -m"])
def test_a_registry_server_whose_raise_is_refused_says_so_once(
    argv: list[str], tmp_path: Path
) -> None:
    """EPERM from setrlimit: the server serves under 256, and its log has one formatted line."""
    require_seccomp()
    store = f"sqlite:///{tmp_path / 'registry.db'}"
    command = [*argv, "registry", "serve", "--port", "0", "--store", store]
    with _started(command, _environment(), tmp_path, frozen=True) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "registry listening on" in line, line + proc.communicate()[1]
        assert open_file_limits(proc.pid) == (SOFT, HARD)
        proc.terminate()
        _, stderr = proc.communicate(timeout=60)
    refused = [line for line in stderr.splitlines() if "open-file limit" in line]
    assert len(refused) == 1, stderr
    assert REFUSED.match(refused[0]), refused[0]


@pytest.mark.parametrize(
    "argv",
    [
        [str(PIPELINE), "--help"],
        [str(PIPELINE), "consume", "--help"],
        [str(PIPELINE), "topics", "list", "--help"],
        [*REGISTRY, "--help"],
        [*REGISTRY, "registry", "serve", "--help"],
        [*INGRESS, "--help"],
        [*INGRESS, "ingress", "serve", "--help"],
    ],
    ids=lambda argv: " ".join(Path(arg).name for arg in argv[-3:]),
)
def test_a_short_command_whose_raise_is_refused_says_nothing(
    argv: list[str], tmp_path: Path
) -> None:
    """``--help`` and the like open a handful of descriptors: the refusal is not worth a line."""
    require_seccomp()
    done = subprocess.run(
        argv,
        cwd=tmp_path,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=limited(SOFT, HARD, frozen=True),
    )
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout
    assert done.stderr == ""

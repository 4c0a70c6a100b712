"""The ingress raises its soft open-file limit to the hard one, and bounds connections from it.

Started with a soft limit of 256 under a hard one of 4096 (as systemd starts services: 1024
under 524288), the ingress kept 256: its default connection bound was 128 where the hard limit
allowed 3968. Now every command raises its soft limit to the hard one at start
(:mod:`pipeline.descriptors`), and the bound's default is that limit less
:data:`~pipeline.ingress.service.FD_RESERVE`, at most
:data:`~pipeline.ingress.service.CONNECTIONS_CAP`. The tests show, on a real ingress whose limits
are read from ``/proc/PID/limits`` and whose bound is read from its start line:

- under 256:4096 the ingress runs with 4096 and bounds connections at 3968;
- under a hard limit above the cap the bound is the cap, not the limit less the reserve;
- ``--workers 2``: the workers inherit the supervisor's raised limit, and each bounds at 3968;
- an ingress whose raise the system refuses (a seccomp filter answering EPERM) still starts and
  serves, with one formatted warning line naming it, its limit and bound those it was given.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from cli.limits_sandbox import hard_limit_at_least, limited, open_file_limits, require_seccomp
from ingress.helpers import ROOT, ingress_env, listening_url, start_ingress, stopped
from ingress.supervised import workers_of, workers_setup

from pipeline.config import Settings
from pipeline.ingress.service import CONNECTIONS_CAP, FD_RESERVE

BOUND_LINE = re.compile(r"ingress: at most (\d+) client connections")


@contextmanager
def _ingress(
    tmp_path: Path, redis_url: str, preexec_fn: Callable[[], None]
) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """An ingress with no sources, logging at INFO into a file; it, its URL and its log."""
    (tmp_path / "sources.yaml").write_text("sources: {}\n", encoding="utf-8")
    env = ingress_env(tmp_path, redis_url, ROOT / "topics", PIPELINE_LOG_LEVEL="INFO")
    log = tmp_path / "stderr.log"
    with log.open("w", encoding="utf-8") as stderr:
        proc = start_ingress(env, cwd=tmp_path, stderr=stderr, preexec_fn=preexec_fn)
    with stopped(proc):
        yield proc, listening_url(proc, log), log


def _bound(log: Path) -> int:
    """The connection bound the ingress logged at start (it logs it before it listens)."""
    found = BOUND_LINE.findall(log.read_text(encoding="utf-8"))
    assert len(found) == 1, log.read_text(encoding="utf-8")
    return int(found[0])


def test_the_ingress_raises_its_soft_limit_and_bounds_connections_from_it(
    tmp_path: Path, redis_service: str
) -> None:
    """Under 256:4096 it runs with 4096 descriptors and bounds connections at 4096 less 128."""
    with _ingress(tmp_path, redis_service, limited(256, 4096)) as (proc, _url, log):
        assert open_file_limits(proc.pid) == (4096, 4096)
        assert _bound(log) == 4096 - FD_RESERVE


def test_the_default_bound_stops_at_the_cap(tmp_path: Path, redis_service: str) -> None:
    """A hard limit far above the cap gives the cap, not the limit less the reserve."""
    hard = hard_limit_at_least(CONNECTIONS_CAP + FD_RESERVE + 1000)
    with _ingress(tmp_path, redis_service, limited(256, hard)) as (proc, _url, log):
        assert open_file_limits(proc.pid) == (hard, hard)
        assert _bound(log) == CONNECTIONS_CAP


def test_an_ingress_whose_raise_is_refused_still_serves(tmp_path: Path, redis_service: str) -> None:
    """EPERM from setrlimit: one warning line, the limit it was given, and it serves."""
    require_seccomp()
    with _ingress(tmp_path, redis_service, limited(256, 4096, frozen=True)) as (proc, url, log):
        assert open_file_limits(proc.pid) == (256, 4096)
        assert _bound(log) == 256 - FD_RESERVE
        assert httpx.get(f"{url}/healthz", timeout=20).status_code == 200
    warnings = [line for line in log.read_text(encoding="utf-8").splitlines() if "WARNING" in line]
    raised = [line for line in warnings if "open-file limit" in line]
    assert len(raised) == 1, warnings
    assert re.match(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING pipeline\.descriptors open-file limit:"
        r" could not raise the soft limit from 256 to the hard limit 4096 \(EPERM: [^)]*\);"
        r" pipeline ingress serve runs with 256 descriptors, and its default connection bound"
        r" follows it: raise the soft limit before the start \(ulimit -n, LimitNOFILE=\) for more$",
        raised[0],
    ), raised[0]


async def test_workers_inherit_the_raised_limit(
    tmp_path: Path, settings: Settings, redis_service: str, postgres_service: str, unique: str
) -> None:
    """``--workers 2`` under 256:4096: the supervisor and both workers run with 4096."""
    async with workers_setup(
        tmp_path, settings, redis_service, postgres_service, unique, "nofile-secret"
    ) as setup:
        env = setup.env | {"PIPELINE_LOG_LEVEL": "INFO"}
        log = tmp_path / "stderr.log"
        with log.open("w", encoding="utf-8") as stderr:
            proc = start_ingress(
                env, "--workers", "2", stderr=stderr, preexec_fn=limited(256, 4096)
            )
        with stopped(proc):
            listening_url(proc, log)
            workers = workers_of(proc)
            assert len(workers) == 2
            limits = [open_file_limits(pid) for pid in (proc.pid, *(w.pid for w in workers))]
    assert limits == [(4096, 4096)] * 3
    bounds = BOUND_LINE.findall(log.read_text(encoding="utf-8"))
    assert bounds == [str(4096 - FD_RESERVE)] * 2, log.read_text(encoding="utf-8")

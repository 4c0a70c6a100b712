"""A refused webhook leaves one INFO line naming its source and why; a flood of them, a few.

A 401 logged ``webhook rejected from source S: REASON``, but a 400 (a body that is not JSON, a
BOM before it), a 413 and a 408 of a stalled body logged nothing at any level: an operator
looking into a provider's failed deliveries saw nothing. Each now logs ``webhook refused from
source S: REASON`` at INFO. None of the door's INFO lines (the 401's and the head's 431 neither)
were backed off: :class:`~pipeline.log_repeats.RepeatFilter` lets anything below WARNING through,
so a flood of bad requests at ``PIPELINE_LOG_LEVEL=INFO`` was a line each. Alike ones (same
source and reason, or same door refusal) are now the first line, then one after 1 s, 2 s, 4 s
... saying how many were held back. Served over loopback by the ingress's own HTTP layer, its
events on Redis.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from hostile.ingress_server import Running, raw_request, running_ingress, status_of

from pipeline.ingress.app import Refusals
from pipeline.log_repeats import RepeatFilter

SOURCES = {
    "plain": {"scheme": "none", "tenant": {"pointer": "/tenant"}, "max_body_bytes": 1024},
    "other": {"scheme": "none", "tenant": {"pointer": "/tenant"}},
}
LOGGERS = ("pipeline.ingress.app", "pipeline.ingress.http")


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        """At 1000 s."""
        self.now_s = 1000.0

    def __call__(self) -> float:
        """The time it was set to."""
        return self.now_s


def lines(caplog: pytest.LogCaptureFixture, start: str) -> list[logging.LogRecord]:
    """The door's INFO records whose text begins with ``start``."""
    return [
        r
        for r in caplog.records
        if r.name in LOGGERS and r.levelno == logging.INFO and r.getMessage().startswith(start)
    ]


def frozen(ingress: Running) -> Clock:
    """Back off the served app's refusal lines by a clock the test moves."""
    clock = Clock()
    ingress.built.app.refusals = Refusals(RepeatFilter(clock=clock))
    return clock


@pytest.fixture
def info(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The door's loggers captured at INFO."""
    for name in LOGGERS:
        caplog.set_level(logging.INFO, logger=name)
    return caplog


async def test_a_malformed_body_is_logged_once_then_backed_off(
    tmp_path: Path, info: pytest.LogCaptureFixture
) -> None:
    """Three bodies not JSON: one line; a second later the next says 2 were held back."""
    async with running_ingress(tmp_path, SOURCES) as ingress:
        clock = frozen(ingress)
        async with httpx.AsyncClient(base_url=ingress.url) as http:
            for body in (b"not json", b"\xef\xbb\xbf{}", b"{"):
                assert (await http.post("/hooks/plain", content=body)).status_code == 400
            assert (await http.post("/hooks/other", content=b"nope")).status_code == 400
            clock.now_s += 1.0
            assert (await http.post("/hooks/plain", content=b"x")).status_code == 400
    refused = lines(info, "webhook refused from source")
    assert [r.getMessage() for r in refused] == [
        "webhook refused from source plain: body is not JSON",
        "webhook refused from source other: body is not JSON",
        "webhook refused from source plain: body is not JSON [2 more like this in the last 1s]",
    ]
    assert (refused[0].source, refused[0].reason) == ("plain", "body is not JSON")  # type: ignore[attr-defined]


async def test_a_rejected_signature_flood_is_backed_off_too(
    tmp_path: Path, info: pytest.LogCaptureFixture
) -> None:
    """The 401's INFO line, alike ones held back the same way."""
    github = {"github": {"scheme": "github", "secrets": ["s3cret"]}}
    async with running_ingress(tmp_path, github) as ingress:
        frozen(ingress)
        async with httpx.AsyncClient(base_url=ingress.url) as http:
            for _ in range(3):
                assert (await http.post("/hooks/github", content=b"{}")).status_code == 401
    assert len(lines(info, "webhook rejected from source github")) == 1


async def test_a_body_over_the_cap_is_logged(
    tmp_path: Path, info: pytest.LogCaptureFixture
) -> None:
    """413, declared or counted as it comes: one line, naming the cap's setting."""
    async with running_ingress(tmp_path, SOURCES) as ingress:
        clock = frozen(ingress)
        async with httpx.AsyncClient(base_url=ingress.url) as http:
            assert (await http.post("/hooks/plain", content=b"x" * 2048)).status_code == 413
            clock.now_s += 1.0

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(4):
                    yield b"y" * 512

            answer = await http.post("/hooks/plain", content=chunks())
            assert answer.status_code == 413
    cap = "over 1024 bytes, sources.plain.max_body_bytes"
    assert [r.getMessage() for r in lines(info, "webhook refused from source")] == [
        f"webhook refused from source plain: body too large ({cap})"
    ] * 2


async def test_a_stalled_body_is_logged(tmp_path: Path, info: pytest.LogCaptureFixture) -> None:
    """408 of a body that stopped coming: one line with the source."""
    async with running_ingress(tmp_path, SOURCES, body_timeout_s=0.2) as ingress:
        head = b"POST /hooks/plain HTTP/1.1\r\nHost: ingress\r\nContent-Length: 100\r\n\r\n{"
        assert status_of(await raw_request(ingress.port, head)) == 408
    assert [r.getMessage() for r in lines(info, "webhook refused from source")] == [
        "webhook refused from source plain: body not received in time"
    ]


async def test_oversized_heads_are_backed_off(
    tmp_path: Path, info: pytest.LogCaptureFixture
) -> None:
    """431s at the door (no source known yet): one line for the flood."""
    async with running_ingress(tmp_path, SOURCES) as ingress:
        frozen(ingress)
        head = b"POST /hooks/plain HTTP/1.1\r\nHost: ingress\r\nX-Pad: %s\r\n\r\n" % (b"p" * 70_000)
        for _ in range(3):
            assert status_of(await raw_request(ingress.port, head)) == 431
    assert len(lines(info, "request head over")) == 1

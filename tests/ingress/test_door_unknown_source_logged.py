"""A 404, 403 or 405 at the ingress leaves one INFO line saying why; a flood of them, a few.

A provider configured with a wrong URL (``/hooks/githb``) got 404 and the ingress logged nothing
at any level: an operator looking into why a provider's deliveries fail saw nothing. A refused
handshake (403) and a method other than GET, HEAD or POST (405) were silent too. Each now logs
one INFO line through the same backoff as the other refusals, judged by a fixed repeat key (one
for unknown sources, one for other paths; a configured source and its reason for 403 and 405),
so a flood of random paths is a few lines and adds nothing to the filter's table. What the
request sent is shown cut and escaped; a verify token never. Served over loopback by the
ingress's own HTTP layer, its events on Redis.
"""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from hostile.ingress_server import Running, raw_request, running_ingress, status_of

from pipeline.ingress.refusals import Refusals
from pipeline.log_repeats import RepeatFilter

SOURCES = {
    "plain": {"scheme": "none", "tenant": {"pointer": "/tenant"}},
    "whatsapp": {"scheme": "meta", "secrets": ["app-secret"], "verify_token": "let-me-in"},
    "other": {"scheme": "none", "tenant": {"pointer": "/tenant"}},
}
LOGGERS = ("pipeline.ingress.app", "pipeline.ingress.http")
FLOOD = 1000


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        """At 1000 s."""
        self.now_s = 1000.0

    def __call__(self) -> float:
        """The time it was set to."""
        return self.now_s


def lines(caplog: pytest.LogCaptureFixture, start: str) -> list[str]:
    """The door's INFO lines that begin with ``start``."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name in LOGGERS and r.levelno == logging.INFO and r.getMessage().startswith(start)
    ]


def frozen(ingress: Running) -> tuple[Clock, RepeatFilter]:
    """Back off the served app's refusal lines by a clock the test moves; the filter."""
    clock = Clock()
    repeats = RepeatFilter(clock=clock)
    ingress.built.app.refusals = Refusals(repeats)
    return clock, repeats


@pytest.fixture
def info(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The door's loggers captured at INFO."""
    for name in LOGGERS:
        caplog.set_level(logging.INFO, logger=name)
    return caplog


async def test_an_unknown_source_is_named_with_the_sources_there_are(
    tmp_path: Path, info: pytest.LogCaptureFixture
) -> None:
    """A delivery to /hooks/githb: 404, and a line naming 'githb' and the configured sources."""
    async with running_ingress(tmp_path, SOURCES) as ingress:
        frozen(ingress)
        async with httpx.AsyncClient(base_url=ingress.url) as http:
            answer = await http.post("/hooks/githb", content=b'{"tenant": "t"}')
            assert answer.status_code == 404
    assert lines(info, "webhook refused:") == [
        "webhook refused: no source named 'githb' (sources: other, plain, whatsapp)"
    ]


async def test_a_path_outside_the_hooks_is_named_too(
    tmp_path: Path, info: pytest.LogCaptureFixture
) -> None:
    """/hook/plain (a provider's URL without the s): 404, and a line saying where webhooks go."""
    async with running_ingress(tmp_path, SOURCES) as ingress:
        frozen(ingress)
        async with httpx.AsyncClient(base_url=ingress.url) as http:
            assert (await http.post("/hook/plain", content=b"{}")).status_code == 404
    assert lines(info, "request refused:") == [
        (
            "request refused: no such path '/hook/plain'"
            " (webhooks are POST /hooks/<source>; sources: other, plain, whatsapp)"
        )
    ]


async def test_what_the_request_sent_is_cut_and_escaped(
    tmp_path: Path, info: pytest.LogCaptureFixture
) -> None:
    """A name with a terminal escape and 5,000 characters: 64 of them, escaped."""
    async with running_ingress(tmp_path, SOURCES) as ingress:
        frozen(ingress)
        target = b"/hooks/%1b%5b31mevil" + b"a" * 5000
        head = b"GET %s HTTP/1.1\r\nHost: ingress\r\nConnection: close\r\n\r\n" % target
        assert status_of(await raw_request(ingress.port, head)) == 404
    [line] = lines(info, "webhook refused:")
    name = "\\x1b[31mevil" + "a" * (64 - len("\x1b[31mevil"))
    assert line == f"webhook refused: no source named '{name}'... (sources: other, plain, whatsapp)"
    assert "\x1b" not in line


async def test_a_long_list_of_sources_is_cut(
    tmp_path: Path, info: pytest.LogCaptureFixture
) -> None:
    """Forty sources: the line names the first few and how many more there are."""
    many = {f"provider-number-{i:02}": {"scheme": "none"} for i in range(40)}
    async with running_ingress(tmp_path, many) as ingress:
        frozen(ingress)
        async with httpx.AsyncClient(base_url=ingress.url) as http:
            assert (await http.get("/hooks/nope")).status_code == 404
    [line] = lines(info, "webhook refused:")
    assert line.startswith(
        "webhook refused: no source named 'nope' (sources: provider-number-00, provider-number-01"
    )
    assert line.endswith(" more)")
    assert len(line) < 400


async def test_a_flood_of_random_paths_is_a_few_lines_and_keeps_nothing_per_path(
    tmp_path: Path, info: pytest.LogCaptureFixture
) -> None:
    """1,000 distinct unknown sources and 1,000 other paths: a line each kind, one key each."""
    async with running_ingress(tmp_path, SOURCES) as ingress:
        clock, repeats = frozen(ingress)
        async with httpx.AsyncClient(base_url=ingress.url) as http:
            for i in range(FLOOD):
                assert (await http.get(f"/hooks/random-{i}")).status_code == 404
                assert (await http.post(f"/x/{i}", content=b"{}")).status_code == 404
            assert repeats.kept == 2
            clock.now_s += 1.0
            assert (await http.get("/hooks/last")).status_code == 404
            assert repeats.kept == 2
    assert lines(info, "webhook refused:") == [
        "webhook refused: no source named 'random-0' (sources: other, plain, whatsapp)",
        (
            f"webhook refused: no source named 'last' (sources: other, plain, whatsapp)"
            f" [{FLOOD - 1} more like this in the last 1s]"
        ),
    ]
    assert len(lines(info, "request refused:")) == 1


async def test_a_refused_handshake_says_why_never_the_token(
    tmp_path: Path, info: pytest.LogCaptureFixture
) -> None:
    """403: a wrong token, and a source with none set; each once, however often it comes."""
    async with running_ingress(tmp_path, SOURCES) as ingress:
        clock, _ = frozen(ingress)
        async with httpx.AsyncClient(base_url=ingress.url) as http:
            wrong = "/hooks/whatsapp?hub.mode=subscribe&hub.verify_token=guess&hub.challenge=1"
            for _ in range(3):
                assert (await http.get(wrong)).status_code == 403
            assert (await http.head("/hooks/plain")).status_code == 403
            clock.now_s += 1.0
            lost = "/hooks/whatsapp?hub.mode=unsubscribe&hub.verify_token=x&hub.challenge=1"
            assert (await http.get(lost)).status_code == 403
    assert lines(info, "webhook refused from source") == [
        (
            "webhook refused from source whatsapp: handshake refused"
            " (hub.verify_token is not the source's verify_token)"
        ),
        (
            "webhook refused from source plain: handshake refused"
            " (no verify_token is set: sources.plain.verify_token)"
        ),
        (
            "webhook refused from source whatsapp: handshake refused"
            " (hub.mode is not 'subscribe') [2 more like this in the last 1s]"
        ),
    ]
    assert not any("guess" in r.getMessage() for r in info.records)


async def test_a_method_not_allowed_is_named(
    tmp_path: Path, info: pytest.LogCaptureFixture
) -> None:
    """405: the method named, what is allowed; a flood of methods on one source, one line."""
    async with running_ingress(tmp_path, SOURCES) as ingress:
        frozen(ingress)
        async with httpx.AsyncClient(base_url=ingress.url) as http:
            for method in ("PUT", "DELETE", "PATCH", "OPTIONS") * 3:
                answer = await http.request(method, "/hooks/plain")
                assert answer.status_code == 405
    assert lines(info, "webhook refused from source") == [
        "webhook refused from source plain: method not allowed ('PUT'; allowed: GET, HEAD, POST)"
    ]

"""`pipeline consume` warns at start when its Redis persists nothing held followers need."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from ingress.redis_server import private_redis
from redis.asyncio import Redis
from runtime.helpers import consume_until_logged, idle_lane, the_line

from pipeline.runtime import App, Context
from pipeline.runtime.app import Lane
from pipeline.runtime.persistence import warn_if_not_persisting
from pipeline.topics.spec import TopicSpec

NO_PERSISTENCE = ("--appendonly", "no", "--save", "")


async def persistence_line(lanes: list[Lane], *options: str) -> str | None:
    """What :func:`warn_if_not_persisting` says of a private redis-server run with ``options``."""
    with private_redis(*options) as url:
        client = Redis.from_url(url)
        try:
            return await warn_if_not_persisting(client, url, lanes)
        finally:
            await client.aclose()


async def test_consume_warns_once_when_its_redis_persists_nothing(
    tmp_path: Path, unique: str
) -> None:
    """Appendonly no, save "": one WARNING line: the URL, what a restart loses, the fix."""
    name = f"persist_{unique}"
    with private_redis(*NO_PERSISTENCE) as url:
        lines = await consume_until_logged(tmp_path, name, url, "persists nothing")
    line = the_line(lines, "persists nothing")
    assert "WARNING" in line
    assert url in line
    assert f"held followers of parked keys (lanes {name})" in line
    assert "whose offsets are committed" in line
    assert "set appendonly yes and appendfsync everysec" in line


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(("--appendonly", "yes", "--save", ""), id="appendonly"),
        pytest.param(("--appendonly", "no", "--save", "3600 1"), id="snapshots"),
        pytest.param((*NO_PERSISTENCE, "--rename-command", "CONFIG", ""), id="config-refused"),
    ],
)
async def test_no_word_when_redis_persists_or_refuses_config(
    options: tuple[str, ...], tmp_path: Path, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An append-only file, snapshots, or CONFIG refused (as managed Redis do): nothing logged."""
    lanes = [idle_lane(f"held_{unique}", retry={"tiers": ["1s"]})]
    with caplog.at_level(logging.WARNING, logger="pipeline.runtime.persistence"):
        assert await persistence_line(lanes, "--dir", str(tmp_path), *options) is None
    assert not caplog.records


async def test_lanes_keeping_nothing_only_in_redis_get_no_word(
    unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Unordered or without retry tiers, nothing debounced: a restart loses no message."""
    lanes = [
        idle_lane(f"plain_{unique}"),
        idle_lane(f"free_{unique}", ordered=False, retry={"tiers": ["1s"]}),
    ]
    with caplog.at_level(logging.WARNING, logger="pipeline.runtime.persistence"):
        assert await persistence_line(lanes, *NO_PERSISTENCE) is None
    assert not caplog.records


async def test_debounced_lanes_are_named_with_their_buffers(unique: str) -> None:
    """A debounced lane: its buffers are what a restart loses."""
    name = f"deb_{unique}"
    quiet = {"key": "conversation_id", "quiet_s": 3600, "max_wait_s": 3600}
    app = App([TopicSpec.model_validate({"name": name, "partitions": 1, "debounce": quiet})])

    @app.handler(name)
    async def turn(events: list[bytes], ctx: Context) -> None:
        """Never called."""

    line = await persistence_line([app.lanes[name]], *NO_PERSISTENCE)
    assert line is not None
    assert f"debounce buffers (lanes deb_{unique})" in line

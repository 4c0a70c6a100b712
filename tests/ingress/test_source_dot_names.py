"""A source named ``.`` or ``..`` is refused at start: no HTTP client can reach its door.

The name pattern (letters, digits, ``.``, ``_``, ``-``) let both through, but ``/hooks/.`` and
``/hooks/..`` are dot-segments that clients remove before sending (RFC 3986 5.2.4): the
provider's deliveries went to ``/hooks/`` or ``/`` and were answered 404, while the ingress
started as if the source were served. Other names with dots (``...``, ``.hidden``) are paths
like any other and stay allowed.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from ingress.helpers import write_sources

from pipeline.errors import ConfigError
from pipeline.ingress.settings import load_source, load_sources

TOPICS = {"messages"}
PLAIN = {"scheme": "none", "topic": "messages"}


@pytest.mark.parametrize("name", [".", ".."])
def test_a_dot_segment_name_is_refused_in_one_line(tmp_path: Path, name: str) -> None:
    """load_sources (serve) and load_source (send) both say why and what to do."""
    path = write_sources(tmp_path / "sources.yaml", {name: PLAIN, "fine": PLAIN})
    expected = (
        f"{path}: sources.{name}: '.' and '..' are path steps HTTP clients remove from"
        f" /hooks/{name}; choose another name"
    )
    with pytest.raises(ConfigError) as serving:
        load_sources(path, TOPICS)
    assert str(serving.value).splitlines()[1:] == [f"  {expected}"]
    with pytest.raises(ConfigError) as sending:
        load_source(path, TOPICS, name)
    assert expected in str(sending.value)


@pytest.mark.parametrize("name", [".", ".."])
def test_clients_never_send_a_dot_segment_path(name: str) -> None:
    """Why: the URL an HTTP client sends for /hooks/{name} is not that path."""
    assert httpx.URL(f"http://127.0.0.1/hooks/{name}").path != f"/hooks/{name}"


@pytest.mark.parametrize("name", ["...", ".hidden", "a.b", "x.."])
def test_other_names_with_dots_are_served(tmp_path: Path, name: str) -> None:
    """A dot inside or around a longer name is an ordinary path step."""
    path = write_sources(tmp_path / "sources.yaml", {name: PLAIN})
    assert set(load_sources(path, TOPICS)) == {name}
    assert httpx.URL(f"http://127.0.0.1/hooks/{name}").path == f"/hooks/{name}"

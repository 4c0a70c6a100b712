"""A refused basic credential names its user only when the registry has that user."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pipeline.config import AuthSettings, BasicUser
from pipeline.registry.server.api import create_app
from pipeline.registry.server.serve import BackgroundServer
from pipeline.registry.stores.sqlite.store import SqliteSchemaStore

PASSWORD = "admin-s3cret-pw"  # noqa: S105 - test credential
TYPED_AS_USER = "typed-as-user-s3cret"


@pytest.fixture
def protected_url(tmp_path: Path) -> Iterator[str]:
    """A registry with one basic user, ``admin``."""
    auth = AuthSettings(users=(BasicUser(username="admin", password=PASSWORD, role="write"),))
    store = SqliteSchemaStore(str(tmp_path / "r.db"))
    with BackgroundServer(create_app(store, auth=auth)) as server:
        yield server.url


def refusals(caplog: pytest.LogCaptureFixture) -> str:
    """The registry's own log lines so far."""
    return "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("pipeline"))


@pytest.mark.parametrize(
    "credential",
    [TYPED_AS_USER, f"{TYPED_AS_USER}:", f"{TYPED_AS_USER}:{PASSWORD}"],
    ids=["no colon", "empty password", "unknown user"],
)
def test_an_unknown_user_is_not_named(
    credential: str, protected_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A secret sent where the user name goes (no ':', or as the user) is not logged."""
    caplog.set_level(logging.INFO, logger="pipeline")
    encoded = base64.b64encode(credential.encode()).decode()
    answer = httpx.get(f"{protected_url}/subjects", headers={"Authorization": f"Basic {encoded}"})
    assert answer.status_code == 401
    logged = refusals(caplog)
    assert TYPED_AS_USER not in logged
    assert "bad basic credentials for a user not configured" in logged


def test_a_configured_user_with_a_wrong_password_is_named(
    protected_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A configured user's wrong password is logged by the user's name, not the password."""
    caplog.set_level(logging.INFO, logger="pipeline")
    answer = httpx.get(f"{protected_url}/subjects", auth=("admin", "wrong-" + PASSWORD))
    assert answer.status_code == 401
    logged = refusals(caplog)
    assert "bad basic credentials for user 'admin'" in logged
    assert PASSWORD not in logged

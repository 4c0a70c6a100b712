"""A PostgreSQL log store that cannot log in says why at once, naming the variable to fix."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from pipeline.logstore import LogStoreError
from pipeline.logstore.postgres import PostgresLogStore


async def test_a_wrong_password_is_one_error_with_the_servers_reason(postgres_service: str) -> None:
    """Opening with a wrong password raises the server's reason and PIPELINE_POSTGRES__URL."""
    url = urlsplit(postgres_service)
    wrong = url._replace(netloc=f"{url.username}:wrong-password@{url.hostname}:{url.port}")
    store = PostgresLogStore(wrong.geturl(), schema="public")
    with pytest.raises(LogStoreError) as caught:
        await store.open()
    message = str(caught.value)
    assert "PIPELINE_POSTGRES__URL" in message
    assert "password authentication failed" in message
    assert message.endswith(
        "set the user and password the server expects in PIPELINE_POSTGRES__URL"
    )
    assert "\n" not in message
    assert "wrong-password" not in message

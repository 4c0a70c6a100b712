"""Registry settings: a section for the root settings, loadable on its own for now.

:class:`~pipeline.config.RegistrySettings` is the registry's section of the root settings;
:func:`load_registry_settings` also reads it alone from the environment, with the same names::

    PIPELINE_REGISTRY__HOST=127.0.0.1
    PIPELINE_REGISTRY__PORT=8081
    PIPELINE_REGISTRY__STORE=sqlite:///registry.db      # or postgresql://user:pw@host/db
    PIPELINE_REGISTRY__URL=http://127.0.0.1:8081        # where clients (serde, CLI) find it
    PIPELINE_REGISTRY__DEFAULT_COMPATIBILITY=BACKWARD
    PIPELINE_REGISTRY__REPLICAS=2                       # more than 1 refuses SQLite at start
    PIPELINE_REGISTRY__REQUIRE_AUTH=true                # refuse to serve without credentials
    PIPELINE_REGISTRY__AUTH__USERS='[{"username": "ci", "password": "...", "role": "write"}]'
    PIPELINE_REGISTRY__AUTH__TOKENS='[{"name": "reader", "token": "...", "role": "read"}]'
"""

from __future__ import annotations

import json
import os
from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from pipeline.config import RegistrySettings, setting_reason
from pipeline.errors import ConfigError

ENV_PREFIX = "PIPELINE_REGISTRY__"


def startup_problem(settings: RegistrySettings) -> str | None:
    """Why a registry server must not start with ``settings``, in one line, or None.

    Only the server calls this: every process reads the registry section, and a consumer
    sharing the registry's replica count but not its store must still start.
    """
    if settings.replicas > 1 and settings.store.startswith("sqlite:"):
        return (
            f"PIPELINE_REGISTRY__REPLICAS={settings.replicas} but PIPELINE_REGISTRY__STORE is "
            "SQLite: each replica would hand out its own schema ids; point every replica at one "
            "PIPELINE_REGISTRY__STORE=postgresql://user:password@host/db"
        )
    if settings.require_auth and not settings.auth.enabled:
        return (
            "PIPELINE_REGISTRY__REQUIRE_AUTH is set but no credentials are configured: set "
            "PIPELINE_REGISTRY__AUTH__USERS or PIPELINE_REGISTRY__AUTH__TOKENS"
        )
    return _credentials_problem(settings)


def _credentials_problem(settings: RegistrySettings) -> str | None:
    """Why the configured users or tokens cannot be used as written, in one line, or None.

    A user named twice (the later entry replaced the earlier, whose password was then refused),
    a user name with ``:`` (basic auth splits ``user:password`` at the first one: that user could
    never sign in), an empty password or token (an unset variable in a manifest: ``ci:`` would
    be let in). The line never holds a secret.
    """
    users = f"{ENV_PREFIX}AUTH__USERS"
    seen: set[str] = set()
    for i, user in enumerate(settings.auth.users):
        if user.username in seen:
            return f"{users} names user {user.username!r} twice: give each user one entry"
        seen.add(user.username)
        if ":" in user.username:
            return (
                f"{users}[{i}]: user name {user.username!r} holds ':', which basic auth reads as"
                " the end of the user name: no client could sign in as it; rename it"
            )
        if not user.password.get_secret_value():
            return f"{users}[{i}]: user {user.username!r} has an empty password; give it one"
    tokens = f"{ENV_PREFIX}AUTH__TOKENS"
    for i, token in enumerate(settings.auth.tokens):
        if not token.token.get_secret_value():
            return f"{tokens}[{i}]: token {token.name!r} is an empty token; give it a secret"
    return None


_JSON_VARIABLES = ("AUTH", "AUTH__USERS", "AUTH__TOKENS")
"""The ``PIPELINE_REGISTRY__*`` variables read as JSON (pydantic-settings parses them)."""


def _not_json() -> str:
    """Which JSON variable does not parse, and where, for a :class:`SettingsError`.

    Never its value: a users or tokens list holds secrets.
    """
    for name in _JSON_VARIABLES:
        variable = f"{ENV_PREFIX}{name}"
        value = os.environ.get(variable)
        if value is None:
            continue
        try:
            json.loads(value)
        except json.JSONDecodeError as exc:
            return (
                f"{variable} is not valid JSON ({exc.msg} at line {exc.lineno} column"
                f" {exc.colno}); write it as a JSON list, as docs/registry.md#authentication shows"
            )
    return f"a {ENV_PREFIX}* variable that holds JSON is not valid JSON"


class _RegistryEnv(BaseSettings):
    """Reads ``PIPELINE_REGISTRY__*`` into one :class:`RegistrySettings` section."""

    model_config = SettingsConfigDict(
        env_prefix="PIPELINE_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    registry: RegistrySettings = Field(default_factory=RegistrySettings)


def load_registry_settings(**overrides: Any) -> RegistrySettings:
    """Registry settings from ``PIPELINE_REGISTRY__*`` with ``overrides`` (e.g. CLI options) on top.

    Raises:
        ConfigError: a setting is invalid; the message names each variable at fault.
    """
    try:
        return _RegistryEnv(registry=overrides).registry
    except SettingsError:  # a JSON variable that does not parse; its text may hold secrets
        raise ConfigError(f"invalid registry configuration: {_not_json()}") from None
    except ValidationError as exc:
        problems = [
            f"PIPELINE_{'__'.join(str(p).upper() for p in err['loc'])}: {setting_reason(err)}"
            for err in exc.errors()
        ]
        if len(problems) == 1:  # the common case: one line, as load_settings gives it
            raise ConfigError(f"invalid registry configuration: {problems[0]}") from None
        raise ConfigError(
            f"invalid registry configuration ({len(problems)} problems):\n  "
            + "\n  ".join(problems)
        ) from None

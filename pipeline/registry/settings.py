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

from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

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
    return None


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

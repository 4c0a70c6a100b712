"""Registry settings: a section for the root settings, loadable on its own for now.

:class:`RegistrySettings` is a plain section (``extra="forbid"``, frozen) meant to become
``Settings.registry``; until then :func:`load_registry_settings` reads it from the environment
with the same names the root settings will use::

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

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipeline.errors import ConfigError
from pipeline.registry.auth import AuthSettings
from pipeline.registry.compat import Compatibility

ENV_PREFIX = "PIPELINE_REGISTRY__"


class RegistrySettings(BaseModel):
    """Where the registry listens, what it stores in, and who may use it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8081, ge=0, le=65_535)
    """0 picks a free port (the chosen one is printed at start)."""
    store: str = "sqlite:///registry.db"
    """``sqlite:///relative.db``, ``sqlite:////absolute/path.db`` or ``postgresql://...``."""
    url: str = "http://127.0.0.1:8081"
    """The registry as clients reach it (serde, ``schemas`` commands)."""
    default_compatibility: Compatibility = Compatibility.BACKWARD
    pool_max: int = Field(default=10, ge=1)
    """PostgreSQL connections per registry process."""
    max_body_bytes: int = Field(default=1_048_576, ge=1_024)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    client_username: str | None = None
    """Basic-auth user the serde and CLI present to a protected registry."""
    client_password: SecretStr | None = None
    client_token: SecretStr | None = None
    """Bearer token the serde and CLI present (instead of basic auth)."""
    timeout_s: float = Field(default=10.0, gt=0)
    """Client HTTP timeout."""
    replicas: int = Field(default=1, ge=1)
    """How many registry processes serve ``store``, this one included (the Deployment's count)."""
    require_auth: bool = False
    """Refuse to serve when no user or token is configured (the manifests set it)."""

    @field_validator("store")
    @classmethod
    def _store_scheme(cls, value: str) -> str:
        if not value.startswith(("sqlite://", "postgresql://", "postgres://")):
            raise ValueError("expected sqlite:///path or postgresql://user:password@host/db")
        return value

    @field_validator("url")
    @classmethod
    def _url_scheme(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("expected http://host:port or https://host:port")
        return value.rstrip("/")


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
            f"PIPELINE_{'__'.join(str(p).upper() for p in err['loc'])}: {err['msg']}"
            for err in exc.errors()
        ]
        raise ConfigError("invalid registry configuration:\n  " + "\n  ".join(problems)) from None

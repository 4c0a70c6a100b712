"""Optional authentication: HTTP basic users and bearer tokens, each read-only or read-write.

With no users and no tokens configured the registry is open (the default, for loopback use).
Otherwise every request needs ``Authorization: Basic <base64 user:password>`` or
``Authorization: Bearer <token>``:

* a missing or wrong credential answers 401 (error code 40101) with a ``WWW-Authenticate``
  challenge;
* a ``read`` principal may do every GET plus the two read-only POSTs (schema lookup and the
  compatibility test); anything that changes state needs ``write`` and otherwise answers 403
  (40301).

Secrets are :class:`pydantic.SecretStr` (masked in ``repr`` and settings dumps), compared in
constant time, and never logged: a refusal logs the scheme and, for basic auth, the user name.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging

from pipeline.config import AuthSettings, Role
from pipeline.registry.errors import Forbidden, Unauthorized

log = logging.getLogger(__name__)
CHALLENGE = 'Basic realm="schema-registry", Bearer realm="schema-registry"'


class Authenticator:
    """Checks an ``Authorization`` header against :class:`AuthSettings`."""

    def __init__(self, settings: AuthSettings) -> None:
        """Index the configured users and tokens."""
        self.enabled = settings.enabled
        self._users = {u.username: u for u in settings.users}
        self._tokens = settings.tokens

    def authorize(self, header: str | None, *, write: bool) -> str:
        """The principal's name if it may perform the request.

        Args:
            header: the request's ``Authorization`` header, if any.
            write: whether the request changes state.

        Raises:
            Unauthorized: no valid credential.
            Forbidden: a valid credential with only the ``read`` role on a write.
        """
        if not self.enabled:
            return "anonymous"
        scheme, _, credential = (header or "").partition(" ")
        scheme = scheme.lower()
        if scheme == "basic":
            name, role = self._basic(credential.strip())
        elif scheme == "bearer":
            name, role = self._bearer(credential.strip())
        else:
            log.warning("registry request refused: no supported Authorization scheme")
            raise Unauthorized("Unauthorized: credentials are required")
        if write and role != "write":
            log.warning("registry write refused for read-only principal %s", name)
            raise Forbidden(f"Forbidden: {name} may not change the registry")
        return name

    def _basic(self, credential: str) -> tuple[str, Role]:
        try:
            decoded = base64.b64decode(credential, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            decoded = ""
        username, sep, password = decoded.partition(":")
        user = self._users.get(username)
        # Compare even for an unknown user, so timing does not tell which user names exist.
        expected = user.password.get_secret_value() if user else "\x00unknown-user"
        if not sep or not hmac.compare_digest(password.encode(), expected.encode()) or not user:
            # Only a configured user is named: the caller chose the rest, and a credential
            # without its ':' (or a password typed as the user) is all secret.
            log.warning(
                "registry request refused: bad basic credentials for %s",
                f"user {username!r}" if user else "a user not configured",
            )
            raise Unauthorized("Unauthorized: invalid username or password")
        return user.username, user.role

    def _bearer(self, credential: str) -> tuple[str, Role]:
        found = None
        for token in self._tokens:  # every token compared: constant time per request
            if hmac.compare_digest(credential.encode(), token.token.get_secret_value().encode()):
                found = token
        if found is None:
            log.warning("registry request refused: unknown bearer token")
            raise Unauthorized("Unauthorized: invalid bearer token")
        return f"token:{found.name}", found.role

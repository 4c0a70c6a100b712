"""Flags shown as flags in ``--help``: ``--json``, not ``--json <bool>``.

Typer 0.29's rich help prints every option's type next to it, a flag's too (``<bool>``), so
``--json``, ``--dry-run`` or ``--help`` itself read as options that take a value. No option
declaration avoids it for the options typer and click add (``--help``, the completion ones),
so :func:`show_flags_as_flags` makes the help of every command print a flag without a type,
as click's own help does. A flag's declaration is unchanged: it takes no value either way.

Typer before 0.29 has no ``TyperOption.display_type_rich`` (the requirement allows 0.12 on):
its help prints no type for a flag, so there is nothing to change and nothing is patched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typer.core import TyperOption

__all__ = ["show_flags_as_flags"]

_TypeShown = Callable[[TyperOption, Any], "str | None"]  # typer's own click's context

_typed: _TypeShown | None = getattr(TyperOption, "display_type_rich", None)


def _flag_untyped(option: TyperOption, ctx: Any) -> str | None:  # typer's own click's context
    """No type for a flag (``--json``, ``--log/--no-log``, ``--help``), typer's for the rest."""
    if (option.is_flag and not option.count) or _typed is None:
        return None
    return _typed(option, ctx)


def show_flags_as_flags() -> None:
    """Make the help of every command print its flags without a type (idempotent).

    Nothing to do on a typer whose help prints no option's type (before 0.29).
    """
    if _typed is not None:
        TyperOption.display_type_rich = _flag_untyped  # type: ignore[method-assign,assignment]

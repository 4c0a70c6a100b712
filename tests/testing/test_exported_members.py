"""pipeline.testing exports exactly what its __all__ lists."""

from __future__ import annotations

import pipeline.testing


def test_the_public_names_are_all_listed() -> None:
    """Every public name of the package is in __all__, and every listed name exists."""
    public = {
        name
        for name, value in vars(pipeline.testing).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith("pipeline.")
    }
    assert public == set(pipeline.testing.__all__)

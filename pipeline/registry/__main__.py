"""``python -m pipeline.registry registry serve`` or ``... schemas push``, before the root CLI."""

from pipeline.registry.cli import main

main()

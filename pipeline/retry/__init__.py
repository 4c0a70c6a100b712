"""Retry tiers and dead letters: what happens to a message whose handler failed."""

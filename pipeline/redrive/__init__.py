"""Redrive: put dead-lettered messages back on the topic they came from, selectively."""

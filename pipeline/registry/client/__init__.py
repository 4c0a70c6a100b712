"""The registry as its users see it: the HTTP client, the wire format, serdes, event models."""

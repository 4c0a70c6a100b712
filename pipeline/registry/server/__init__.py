"""The registry server: the rules over a store (service), the REST API, auth, and uvicorn."""

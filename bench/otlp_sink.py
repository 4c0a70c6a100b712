"""An OTLP/HTTP sink for the benchmarks: answers every export 200 and keeps nothing.

Run as its own process (``python bench/otlp_sink.py``) so the benchmarked process pays for
making and exporting its spans, not for receiving them; it prints its port on the first line.
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Sink(BaseHTTPRequestHandler):
    """Reads the body, answers an empty ExportTraceServiceResponse."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        """Drain the request and answer 200."""
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        """Quiet."""


def main() -> None:
    """Serve on a free loopback port until killed."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())

"""A host name the resolver could not look up now is not a host name that does not exist.

``getaddrinfo``'s ``EAI_AGAIN`` ("Temporary failure in name resolution": the DNS server did not
answer) was told apart from nothing: obstore's "dns error" said the host name does not resolve
and to check ``AWS_ENDPOINT_URL``, an endpoint that may well be right; httpx's (presigned writes
and deletes) fell through to the bare error. Both now say the lookup failed for now and to check
this host's DNS, and neither prints the presigned query nor a user name or password of the
endpoint. The texts are the clients' own (no resolver here can be made to fail on demand).
"""

from __future__ import annotations

import pytest

from pipeline.offload.errors import unanswered

URL = "https://user:secret@s3.example.com:9443/bucket/k?X-Amz-Signature=abc&X-Amz-Credential=id"
OBSTORE_AGAIN = (
    "Generic S3 error: ... - HTTP error: error sending request\n"
    'ConnectError("dns error", Custom { kind: Uncategorized, error: "failed to lookup address'
    ' information: Temporary failure in name resolution" })'
)
HTTPX_AGAIN = "ConnectError: [Errno -3] Temporary failure in name resolution"
OBSTORE_UNKNOWN = (
    'ConnectError("dns error", Custom { kind: Uncategorized, error: "failed to lookup address'
    ' information: Name or service not known" })'
)
HTTPX_UNKNOWN = "ConnectError: [Errno -2] Name or service not known"
AGAIN = (
    "cannot reach S3 at https://s3.example.com:9443: its host name could not be looked up now"
    " (the DNS resolver did not answer); check this host's DNS, then AWS_ENDPOINT_URL"
)
UNKNOWN = (
    "cannot reach S3 at https://s3.example.com:9443: its host name does not resolve; check"
    " AWS_ENDPOINT_URL (or AWS_REGION for AWS)"
)


@pytest.mark.parametrize(
    ("detail", "said"),
    [
        (OBSTORE_AGAIN, AGAIN),
        (HTTPX_AGAIN, AGAIN),
        (OBSTORE_UNKNOWN, UNKNOWN),
        (HTTPX_UNKNOWN, UNKNOWN),
    ],
)
def test_a_lookup_that_failed_for_now_says_so(detail: str, said: str) -> None:
    """Each client's words for each case: the right advice, no query, no user or password."""
    line = unanswered(detail, URL)
    assert line == said
    assert "secret" not in line
    assert "X-Amz" not in line

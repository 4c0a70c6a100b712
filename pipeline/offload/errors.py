"""What can go wrong with an offloaded payload, each error choosing what happens to the message.

::

    PipelineError
    ├── OffloadError            the payload store failed (retried: a store outage passes)
    └── HandlerOutcome
        ├── Retry
        │   └── ReferenceRefused   this member cannot resolve the reference (no store on the
        │                          lane, an unknown reference format): another member may
        ├── DeadLetter
        │   ├── PayloadMissing     the object is gone: dead letter ``payload_missing``
        │   └── PayloadCorrupt     the object's digest or size differs: ``payload_corrupt``

The two dead letters carry their reason in :attr:`dead_reason`, which the runtime's routing
writes as the dead letter's ``pl-dead-reason``.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pipeline.errors import DeadLetter, PipelineError, Retry

METADATA_HOST = "169.254.169.254"
"""The instance metadata service, where the S3 client looks for credentials last."""

REFUSED_CREDENTIALS = (
    "the store refused the credentials: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    " (and AWS_SESSION_TOKEN for temporary ones), and that the key may use the bucket; to a"
    " key without s3:ListBucket a read's 403 also means the object does not exist"
)
"""What a 403 from the store means and what to check (never the key itself)."""

ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL"
"""Where an S3-compatible service other than AWS's is found."""

NO_SUCH_BUCKET = "NoSuchBucket"
"""S3's error code of a request in a bucket that does not exist (in its XML answer)."""

_FORBIDDEN = "403 Forbidden"
_UNSENT = "error sending request"  # obstore's first line of a request that got no answer
_REQUEST_URL = re.compile(r"Error performing [A-Z]+ (\S+)")
_NOT_TLS = (
    "InvalidContentType",  # rustls: the first bytes back are no TLS record (a plain HTTP port)
    "CorruptMessage",
    "WRONG_VERSION_NUMBER",  # OpenSSL's words for the same
    "record layer failure",
    "packet length too long",
)
_TLS = ("tls", "ssl", "certificate", "handshake")
_REFUSED = ("ConnectionRefused", "Connection refused")
_DNS_AGAIN = "temporary failure in name resolution"  # EAI_AGAIN (glibc, musl, macOS), lower case
_NO_HOST = ("dns error", "Name or service not known", "failed to lookup address", "nodename nor")
_S3_CODE = re.compile(r"<Code>([^<]{1,100})</Code>")


class OffloadError(PipelineError):
    """The payload store could not be reached or refused an operation."""


class ReferenceRefused(Retry):
    """This member cannot resolve a payload reference; it goes to a retry tier for another."""


class PayloadMissing(DeadLetter):
    """The referenced object does not exist (deleted, or never written to this store)."""

    dead_reason = "payload_missing"


class PayloadCorrupt(DeadLetter):
    """The referenced object's size or SHA-256 differs from the reference's."""

    dead_reason = "payload_corrupt"


def client_error_text(exc: BaseException) -> str:
    """A store client's error as one line: obstore's first line, without its debug dump.

    A request that got no answer (obstore's "error sending request") says why, from the dump:
    see :func:`unanswered`.

    When the client fell back to the instance metadata service for credentials, the line says
    which variables to set (no ``AWS_ACCESS_KEY_ID`` was given); when the store answered 403
    (a wrong secret, an unknown key id, a key without access), it keeps the store's error code
    of its XML answer, not the answer, and says which variables to check.
    """
    whole = str(exc).strip()
    lines = whole.splitlines()
    text = lines[0].strip() if lines else type(exc).__name__
    if text.endswith(_UNSENT) and (url := _REQUEST_URL.search(text)) is not None:
        said = unanswered(whole, url[1])
        if said is not None:
            return said
    if _FORBIDDEN in text and METADATA_HOST not in text:  # its XML answer follows: the code
        code = _S3_CODE.search(text)
        text = text.split(_FORBIDDEN, 1)[0] + _FORBIDDEN + (f" {code[1]}" if code else "")
        return f"{text} ({REFUSED_CREDENTIALS})"
    if METADATA_HOST in text:
        text += (
            " (no credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run"
            " where the instance metadata service serves them)"
        )
    return text


def bucket_missing(url: str) -> str:
    """What a ``NoSuchBucket`` answer means for the store ``url`` and what to do, as one line."""
    bucket = urlsplit(url).netloc
    return (
        f"bucket {bucket} does not exist ({NO_SUCH_BUCKET}); create it, or correct the bucket in"
        f" the lanes' offload.store (and {ENDPOINT_VARIABLE}, if it names another service)"
    )


def no_such_bucket(exc: BaseException) -> bool:
    """Whether the client's error ``exc`` is S3's answer that the bucket does not exist."""
    return f"<Code>{NO_SUCH_BUCKET}</Code>" in str(exc)


def refused_credentials(text: str) -> bool:
    """Whether an :class:`OffloadError`'s text says the store refused the credentials (403)."""
    return REFUSED_CREDENTIALS in text


def unanswered(detail: str, url: str) -> str | None:
    """Why a request to ``url`` got no answer, and what to do, from the client's ``detail``.

    A TLS handshake that failed (an ``https://`` endpoint whose port speaks plain HTTP, or an
    untrusted certificate), a connection refused, a host name that does not resolve or that the
    resolver could not look up for now (``EAI_AGAIN``: the name may be right); None for
    anything else. Only the endpoint (scheme, host, port) of ``url`` is printed: a presigned
    URL's query carries a short-lived credential.
    """
    parts = urlsplit(url)
    endpoint = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    if any(sign in detail for sign in _NOT_TLS):
        plain = f"http://{parts.netloc.rpartition('@')[2]}"
        return (
            f"TLS handshake with S3 at {endpoint} failed: the port does not speak TLS? If the"
            f" service there serves plain HTTP (a local S3Proxy or MinIO), set"
            f" {ENDPOINT_VARIABLE}={plain}"
        )
    if any(sign in detail for sign in _REFUSED):
        return (
            f"cannot reach S3 at {endpoint}: connection refused; start it, or set"
            f" {ENDPOINT_VARIABLE} to where it runs"
        )
    if _DNS_AGAIN in detail.lower():  # the name may be right: the resolver gave no answer
        return (
            f"cannot reach S3 at {endpoint}: its host name could not be looked up now (the DNS"
            f" resolver did not answer); check this host's DNS, then {ENDPOINT_VARIABLE}"
        )
    if any(sign in detail for sign in _NO_HOST):
        return (
            f"cannot reach S3 at {endpoint}: its host name does not resolve; check"
            f" {ENDPOINT_VARIABLE} (or AWS_REGION for AWS)"
        )
    if any(sign in detail.lower() for sign in _TLS):
        return (
            f"TLS handshake with S3 at {endpoint} failed: check that this host trusts its"
            f" certificate, and that {ENDPOINT_VARIABLE} names its TLS port"
        )
    return None

"""A lane's ``offload:`` declaration: above what size its payloads travel by reference, and where.

``topics/*.yaml``::

    offload:
      above: 256KiB                       # default; B, KiB, MiB (or KB, MB) or a byte count
      store: s3://pipeline/payloads       # or file:///mnt/shared/payloads

Kept apart from :mod:`pipeline.topics.spec`, which only names the field.
"""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import urlparse

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictStr, field_validator

__all__ = ["DEFAULT_ABOVE_BYTES", "OffloadPolicy", "format_size_bytes", "parse_size_bytes"]

DEFAULT_ABOVE_BYTES = 256 * 1024
"""Payloads larger than this go to the store when ``above`` is not given."""
SIZE_HINT = "expected a size like 256KiB, 1MiB, 500000B or a byte count"
_SIZE = re.compile(r"(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?")
_UNITS = {
    None: 1,
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
}
_SCHEMES = ("s3", "file")


def parse_size_bytes(value: Any) -> int:
    """Parse ``"256KiB"``, ``"1MiB"``, ``"500KB"`` or an int of bytes into bytes (> 0).

    Raises:
        ValueError: another form, or zero.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{SIZE_HINT} (got {value!r})")  # noqa: TRY004 - pydantic wants ValueError
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"{SIZE_HINT} (got {value!r})")
        size = int(match[1]) * _UNITS[match[2]]
    if size <= 0:
        raise ValueError(f"a size must be larger than zero (got {value!r})")
    return size


def format_size_bytes(size_bytes: int) -> str:
    """A byte count in the coarsest binary unit that divides it (``65536`` -> ``64KiB``)."""
    for unit in ("GiB", "MiB", "KiB"):
        if size_bytes % _UNITS[unit] == 0:
            return f"{size_bytes // _UNITS[unit]}{unit}"
    return f"{size_bytes}B"


class OffloadPolicy(BaseModel):
    """Payloads of a lane above ``above_bytes`` are written to ``store`` and travel by reference.

    Attributes:
        above_bytes: payloads strictly larger than this are offloaded (YAML key ``above``).
        store: ``s3://bucket/prefix`` (credentials and endpoint from the usual ``AWS_*``
            variables) or ``file:///absolute/dir`` (a volume every member mounts).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    above_bytes: Annotated[int, BeforeValidator(parse_size_bytes)] = Field(
        default=DEFAULT_ABOVE_BYTES, alias="above"
    )
    store: StrictStr

    @field_validator("store")
    @classmethod
    def _store_url(cls, store: str) -> str:
        url = urlparse(store)
        if url.scheme not in _SCHEMES:
            raise ValueError(f"expected s3://bucket/prefix or file:///absolute/dir (got {store!r})")
        if url.scheme == "s3" and not url.netloc:
            raise ValueError(f"an s3 store names its bucket: s3://bucket/prefix (got {store!r})")
        if url.scheme == "file" and (url.netloc or not url.path.startswith("/")):
            raise ValueError(f"a file store is an absolute path: file:///dir (got {store!r})")
        return store.rstrip("/")

"""TestApp on offloading lanes: large payloads travel by reference through a directory store."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import BaseModel

from pipeline.errors import Retry
from pipeline.offload import reference as ref
from pipeline.offload.lazy import LazyPayload, read_body
from pipeline.runtime import App, Context
from pipeline.testing import TestApp
from pipeline.topics.spec import TopicSpec

MIB = 1024 * 1024


class Upload(BaseModel):
    """A typed event large enough to be offloaded."""

    name: str
    blob: str


def stored(directory: Path) -> dict[str, int]:
    """The files under ``directory``: relative path -> size."""
    return {
        str(path.relative_to(directory)): path.stat().st_size
        for path in directory.rglob("*")
        if path.is_file()
    }


def uploads_app(seen: list[tuple[int, str]]) -> App:
    """Two offloading lanes declared on S3: ``files`` (bytes, fails once), ``uploads`` (typed)."""
    specs = [
        TopicSpec.model_validate(
            {
                "name": name,
                "partitions": 2,
                "retry": {"tiers": ["1s"]},
                "offload": {"above": "256KiB", "store": "s3://not-contacted/payloads"},
            }
        )
        for name in ("files", "uploads")
    ]
    app = App(specs)

    @app.handler("files")
    async def files(event: LazyPayload | bytes, ctx: Context) -> None:
        assert isinstance(event, LazyPayload)
        seen.append((ctx.attempt, hashlib.sha256(await read_body(event)).hexdigest()))
        if ctx.attempt == 1:
            raise Retry("downstream busy")

    @app.handler("uploads")
    async def uploads(event: Upload, ctx: Context) -> None:
        seen.append((ctx.attempt, event.name))

    return app


async def test_large_payloads_go_by_reference_to_the_payloads_directory(tmp_path: Path) -> None:
    """A 2 MiB body is stored once under tmp_path, retried by reference, read intact."""
    seen: list[tuple[int, str]] = []
    body = b"z" * (2 * MIB)
    digest = hashlib.sha256(body).hexdigest()
    async with TestApp(uploads_app(seen), payloads=tmp_path) as t:
        await t.send("files", body, key="k")
        await t.send("uploads", Upload(name="scan.pdf", blob="b" * 400_000), key="u")
        await t.drain()
        (sent,) = t.messages("files")
        assert ref.is_reference(sent.headers)
        assert len(sent.value) < 1024  # the broker carries the reference only
        (retried,) = t.retried("files")
        assert retried.headers[ref.SHA256] == digest.encode()
        assert [r.outcome for r in t.runs("files")] == ["failed", "handled"]
    assert sorted(seen) == [(1, digest), (1, "scan.pdf"), (2, digest)]
    assert stored(tmp_path / "files") == {ref.key_for(digest): len(body)}
    assert len(stored(tmp_path / "uploads")) == 1


async def test_small_payloads_stay_inline(tmp_path: Path) -> None:
    """A payload under the threshold is produced as it is; nothing is written."""
    seen: list[tuple[int, str]] = []
    async with TestApp(uploads_app(seen), payloads=tmp_path) as t:
        await t.send("uploads", Upload(name="small", blob="b"), key="u")
        await t.drain()
        (sent,) = t.messages("uploads")
        assert not ref.is_reference(sent.headers)
    assert seen == [(1, "small")]
    assert stored(tmp_path) == {}

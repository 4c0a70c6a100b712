"""``pipeline send SOURCE``: sign a webhook the way its provider would and post it to the ingress.

The counterpart of the verifiers in :mod:`pipeline.ingress.verify`, for trying a source by hand
(as ``stripe trigger`` does for Stripe): the body is signed with the source's first active
secret in its configured scheme, posted to ``/hooks/SOURCE`` of a running ingress, and the
ingress's answer is printed with the topic and partition the source's routes send it to. Only
that source of the sources file is validated and only its signing secrets are read: the other
sources' secrets need not be exported where it runs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from pathlib import Path

import httpx
import typer
from rich.markup import escape

from pipeline.cli_support import err, run_command
from pipeline.config import ENV_PREFIX, IngressSettings, http_url_problem, load_settings
from pipeline.errors import ConfigError, PipelineError
from pipeline.ingress.errors import IngressError
from pipeline.ingress.settings import SourceConfig, load_source
from pipeline.ingress.source import build_sources
from pipeline.reachability import checked_http_url
from pipeline.topics.spec import load_specs
from pipeline.transport.partitioner import partition_for

__all__ = ["send_command", "signed_headers"]

_TIMEOUT_S = 10.0


def signed_headers(config: SourceConfig, body: bytes, now_s: float) -> dict[str, str]:
    """The headers ``config``'s provider would send with ``body`` (signature, id, type).

    Signs with the first of the source's secrets, as a provider holds only the newest one.
    """
    secret = config.secrets[0] if config.secrets else ""
    headers = {"content-type": "application/json"}
    match config.scheme:
        case "meta" | "github":
            hub = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
            headers["x-hub-signature-256"] = f"sha256={hub}"
            if config.scheme == "github":
                headers["x-github-event"] = "issue_comment"
                headers["x-github-delivery"] = str(uuid.uuid4())
        case "stripe":
            stamp = int(now_s)
            mac = hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256)
            headers["stripe-signature"] = f"t={stamp},v1={mac.hexdigest()}"
        case "standard_webhooks":
            msg_id, stamp = f"msg_{uuid.uuid4().hex}", int(now_s)
            key = base64.b64decode(secret.removeprefix("whsec_"))
            mac = hmac.new(key, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256)
            headers["webhook-id"] = msg_id
            headers["webhook-timestamp"] = str(stamp)
            headers["webhook-signature"] = "v1," + base64.b64encode(mac.digest()).decode()
        case "hmac" if config.hmac is not None:
            options = config.hmac
            digest = hmac.new(secret.encode(), body, getattr(hashlib, options.algorithm))
            encoded = (
                digest.hexdigest()
                if options.encoding == "hex"
                else base64.b64encode(digest.digest()).decode()
            )
            headers[options.header.lower()] = options.prefix + encoded
    return headers


def _body(file: Path | None, raw_json: str | None) -> bytes:
    if (file is None) == (raw_json is None):
        raise ConfigError("give exactly one of --file BODY or --json '{...}'")
    if file is not None:
        try:
            return file.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read --file {file}: {exc.strerror}") from None
    assert raw_json is not None  # noqa: S101 - checked above
    try:
        json.loads(raw_json)
    except ValueError as exc:
        raise ConfigError(f"--json is not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError("--json is nested too deeply to read") from None
    return raw_json.encode()


def _default_target(ingress: IngressSettings) -> str:
    """``http://PIPELINE_INGRESS__HOST:PIPELINE_INGRESS__PORT``, or ConfigError naming them."""
    target = f"http://{ingress.host}:{ingress.port}"
    problem = http_url_problem(target)
    if problem is not None:
        raise ConfigError(
            f"{ENV_PREFIX}INGRESS__HOST {ingress.host!r} and __PORT {ingress.port} make "
            f"{target!r}, not an http URL ({problem}); set them to the ingress's address, "
            "or give it with --url http://HOST:PORT (an IPv6 address in brackets)"
        )
    return target


async def _send(source: str, body: bytes, url: str | None, headers: list[str]) -> int:
    settings = load_settings()
    ingress = settings.ingress
    target = checked_http_url(url, "--url") if url else _default_target(ingress)
    specs = load_specs(settings.topics_dir, settings.max_message_bytes)
    # Only this source's secrets: the other sources' need not be exported to sign for this one.
    config = load_source(ingress.sources_file, {spec.name for spec in specs}, source)
    built = build_sources(
        {source: config},
        specs,
        admission=ingress.admission,
        max_message_bytes=settings.max_message_bytes,
    )[source]
    now_s = time.time()
    request_headers = signed_headers(config, body, now_s)
    for pair in headers:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ConfigError(f"--header expects name=value, got {pair!r}")
        request_headers[name.lower()] = value
    try:
        row = built.build_row(request_headers, body, now_s)
    except IngressError as exc:
        raise ConfigError(f"the body does not fit source {source!r}: {exc}") from None
    endpoint = f"{target.rstrip('/')}/hooks/{source}"
    try:
        async with httpx.AsyncClient(timeout=_TIMEOUT_S) as client:
            answer = await client.post(endpoint, content=body, headers=request_headers)
    except httpx.HTTPError as exc:
        raise PipelineError(
            f"cannot reach the ingress at {endpoint}: {exc or type(exc).__name__}; start it "
            "with `pipeline ingress serve` or give its address with --url "
            "(PIPELINE_INGRESS__HOST, PIPELINE_INGRESS__PORT)"
        ) from exc
    typer.echo(f"{answer.status_code} {answer.text.strip()}")
    if answer.status_code == httpx.codes.UNAUTHORIZED:  # the verifier's answer, nothing else's
        err.print(
            f"[red]error:[/red] {escape(_refused(endpoint, source, ingress.sources_file))}",
            highlight=False,
        )
    if answer.is_success:
        partitions = next(spec.partitions for spec in specs if spec.name == row.topic)
        partition = partition_for(row.key.encode(), partitions) if row.key else None
        typer.echo(
            json.dumps(
                {
                    "topic": row.topic,
                    "partition": partition,
                    "key": row.key,  # as the log row holds it: "" for none (no partition)
                    "tenant": row.tenant,  # as the log row holds it: "" for none
                }
            )
        )
        return 0
    return 1


def _refused(endpoint: str, source: str, sources_file: Path) -> str:
    """What a 401 means: the two environments sign with different secrets."""
    return (
        f"the ingress at {endpoint} refused the signature: the secrets of sources.{source} in"
        f" {sources_file} must be the same here and where the ingress runs (export the same"
        " values in both, from the same sources file)"
    )


def send_command(
    source: str,
    file: Path | None,
    raw_json: str | None,
    url: str | None,
    header: list[str] | None,
) -> None:
    """Run ``pipeline send`` (its options and help: :mod:`pipeline.cli.commands`).

    Exits 1 when the ingress refuses the webhook, 2 for a bad body or source.
    """
    try:
        body = _body(file, raw_json)
    except ConfigError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    code = run_command(_send(source, body, url, header or []))
    if code:
        raise typer.Exit(code)

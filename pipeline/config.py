"""Settings, read once at the edge (CLI, service entry point) and passed down.

Environment variables use the ``PIPELINE_`` prefix and ``__`` between nested sections::

    PIPELINE_TRANSPORT=kafka|redis
    PIPELINE_REDIS__URL=redis://127.0.0.1:6379/0
    PIPELINE_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:9092
    PIPELINE_POSTGRES__URL=postgresql://pipeline:pipeline@127.0.0.1:5432/pipeline

Every section is declared here, the ingress's and the registry's too, so reading the
settings imports no stage (the import contract ``config ↛ stages``).

Invalid values fail at start with a :class:`~pipeline.errors.ConfigError` naming the environment
variable and the expected form.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
import logging
import os
import re
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Literal, get_origin
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError
from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS
from redis.asyncio.connection import Connection as RedisConnection
from redis.asyncio.connection import SSLConnection as RedisSSLConnection
from redis.asyncio.connection import UnixDomainSocketConnection as RedisUnixConnection
from redis.asyncio.connection import parse_url as parse_redis_url
from redis.exceptions import RedisError

from pipeline.capacity.settings import CapacitySettings
from pipeline.errors import ConfigError

ENV_PREFIX = "PIPELINE_"
_MAX_PORT = 65_535
_DEFAULT_MAX_MESSAGE_BYTES = 1_048_576 + 65_536  # 1 MiB payloads plus room for key and headers


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RedisSettings(_Section):
    """Redis connection and Redis Streams consumer-group tuning."""

    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field(default="pl", pattern=r"^[A-Za-z0-9_.-]+$")
    lease_ms: int = Field(default=10_000, ge=100)
    """How long a member owns its partitions without renewing; a dead member's go after this."""
    heartbeat_ms: int = Field(default=1_000, ge=10)
    """How often a member renews its leases and rebalances; at most a third of ``lease_ms``."""
    max_len: int = Field(default=1_000_000, ge=1)
    """Default approximate entries kept per partition stream (``XADD MAXLEN ~``)."""
    socket_timeout_s: float = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _heartbeats_within_a_lease(self) -> RedisSettings:
        if self.heartbeat_ms * 3 > self.lease_ms:
            raise ValueError(
                f"heartbeat_ms ({self.heartbeat_ms}) must be at most a third of lease_ms"
                f" ({self.lease_ms}): leases would lapse between renewals and partitions move"
                " back and forth; lower PIPELINE_REDIS__HEARTBEAT_MS or raise"
                " PIPELINE_REDIS__LEASE_MS"
            )
        return self

    @field_validator("url")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            hint = ""
            if re.fullmatch(r"[^/@\s:]+:\d+(/\d+)?", value):  # host:port, the scheme left out
                hint = (
                    f"; for a plain connection write redis://{value}{'' if '/' in value else '/0'}"
                )
            raise ValueError(f"expected redis://host:port/db, rediss://... or unix:///path{hint}")
        try:
            urlsplit(value).port  # noqa: B018 - parsing the port is the check
        except ValueError as exc:
            raise ValueError(f"expected redis://host:port/db, port 0-65535 ({exc})") from None
        path = urlsplit(value).path
        if not value.startswith("unix://") and not re.fullmatch(r"/?\d*", path):
            # redis-py would use database 0 for "/x" and 1 for "/0/1", without a word
            raise ValueError(f"expected redis://host:port/db with a database number, got {path!r}")
        problem = _redis_query_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


_QUERY_SECRET = re.compile(r"[?&;]password=(.*)", re.IGNORECASE | re.DOTALL)
_DELIMITERS = re.compile(r"[:/?#@%&;=\[\]]")
_MIN_HIDDEN_CHARS = 2


def hide_credentials(text: str, url: str) -> str:
    """``text`` with every piece of ``url``'s password replaced by ``***``.

    The password is read from the raw string, not from a parse of it: a ``/``, ``?``, ``#`` or
    ``%`` left unencoded in it makes ``urlsplit`` or libpq split the URL elsewhere and echo a
    piece of the password as a port, path, database or token ("Port could not be cast to
    integer value as 's3cr'"). So whatever lies between the scheme's ``//`` and the URL's last
    ``@`` after the first ``:`` (all of it without a ``:``: a lone token), everything after a
    ``password=`` option (a ``&``, ``;`` or ``#`` left unencoded in its value ends no part of
    it: the options after it are hidden too), and each piece of these between delimiters, are
    hidden wherever they occur in ``text``; single characters are left (they are in every
    message).
    """
    secrets: list[str] = [found.group(1) for found in _QUERY_SECRET.finditer(url)]
    start = url.find("//")
    end = url.rfind("@")
    if start != -1 and end > start:
        userinfo = url[start + 2 : end]
        secrets.append(userinfo.partition(":")[2] if ":" in userinfo else userinfo)
    pieces = {part for secret in secrets for part in (secret, *_DELIMITERS.split(secret))}
    for piece in sorted(pieces, key=len, reverse=True):
        if len(piece) >= _MIN_HIDDEN_CHARS:
            text = text.replace(piece, "***")
    return text


def _redis_query_problem(url: str) -> str | None:
    """Why redis-py cannot build a connection from ``url``'s query options, or None.

    redis-py reads them only when it opens the first connection, where a misspelt option or a
    TLS option on a ``redis://`` URL is a ``TypeError``: build one (it connects to nothing) now.
    """
    try:
        kwargs: dict[str, Any] = dict(parse_redis_url(url))
        connection_class: type[RedisConnection] = kwargs.pop("connection_class", RedisConnection)
        connection_class(**kwargs)
    except TypeError as exc:
        found = re.search(r"keyword argument '([^']+)'", str(exc))
        name = found.group(1) if found else str(exc)
        if name.startswith("ssl") and not url.startswith("rediss://"):
            return f"{name} is a TLS option: use a rediss:// URL for a TLS connection"
        return f"{name} is not a connection option redis-py knows (see redis-py's from_url)"
    except (ValueError, RedisError) as exc:
        return str(exc)
    return None


class KafkaSettings(_Section):
    """Kafka connection; ``client`` passes further librdkafka properties through."""

    bootstrap_servers: str = "127.0.0.1:9092"
    """``host:port[,host:port...]``, commas only; an entry may start with a protocol librdkafka
    takes (``SASL_SSL://kafka:9093``), an IPv6 address is in brackets (``[::1]:9092``). No user
    or password: a SASL login goes in ``PIPELINE_KAFKA__CLIENT`` (``sasl.username``,
    ``sasl.password``), checked at start."""
    client_id: str = "pipeline"
    session_timeout_ms: int = Field(default=10_000, ge=1_000, le=3_600_000)
    request_timeout_ms: int = Field(default=10_000, ge=100, le=300_000)
    fetch_wait_max_ms: int = Field(default=50, ge=1, le=300_000)
    """How long the broker holds a fetch with no new data (librdkafka ``fetch.wait.max.ms``,
    500 by default there). A paused partition resumes only with the next fetch, so with
    librdkafka's default a member whose partitions pause for backpressure idles up to half a
    second each time; 50 ms keeps that short at 20 empty fetches a second per idle member."""
    fetch_queue_backoff_ms: int = Field(default=10, ge=0, le=300_000)
    """How long a member waits to fetch a partition again after its read-ahead was full
    (librdkafka ``fetch.queue.backoff.ms``, 1,000 by default there). Behind a backlog the
    read-ahead fills, and with librdkafka's default each partition is then fetched again up to
    a second later, a retry tier's too: copies due after their delay start up to a second late.
    10 ms costs no measurable throughput (docs/benchmarks.md, "Retry copies fetched again
    within 10 ms")."""
    group_protocol: Literal["auto", "consumer", "classic"] = "auto"
    """Rebalance protocol of consumer groups: ``consumer`` (KIP-848, Kafka 4 brokers),
    ``classic`` (cooperative-sticky), or ``auto``: ``consumer`` where the broker offers it,
    except for static members (``pipeline consume``), which stay on ``classic`` where offered:
    KIP-848 refuses a killed static member's name until its session ends. Under ``consumer``
    ``session_timeout_ms`` is set on the group (``consumer.session.timeout.ms``)."""
    client: dict[str, str] = Field(default_factory=dict)
    """JSON object of librdkafka properties that override ours (security, tuning). Each client
    gets those that apply to it: a consumer property (``C`` in librdkafka's CONFIGURATION.md,
    such as ``max.poll.interval.ms``) goes to group members only, a producer property (``P``,
    such as ``linger.ms`` or ``acks``) to producers only, neither to admin clients, and any other
    to every client, so a misspelt one still stops every command."""

    @field_validator("bootstrap_servers")
    @classmethod
    def _bootstrap_list(cls, value: str) -> str:
        problem = bootstrap_problem(value)
        if problem is not None:
            raise problem
        return value


_BOOTSTRAP_PROTOCOLS = frozenset({"plaintext", "ssl", "sasl_plaintext", "sasl_ssl"})
"""The protocols librdkafka takes before a bootstrap entry (``SSL://kafka:9093``), any case."""
_BOOTSTRAP_ENTRY = re.compile(
    r"(?:(?P<scheme>[^/:]*)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s,/:@\[\]]+):(?P<port>\d+)"
)
_BOOTSTRAP_FORM = "host:port[,host:port...]"


def bootstrap_problem(servers: str) -> PydanticCustomError | None:
    """Why librdkafka cannot use ``servers`` as its bootstrap list, or None.

    librdkafka reads ``user:password@kafka:9092`` as a host named ``user:password@kafka`` and
    logs it, password and all, at each failure to resolve it; the command then ends seconds
    later in "cannot reach Kafka". The reasons quote no piece of the value (the line echoes it,
    a login hidden): a user named like a word of the advice must not hide that word.
    """
    if "@" in servers:
        return PydanticCustomError(
            "bootstrap_login",
            "a user or password in the bootstrap list (librdkafka takes it for part of a host"
            " name); list host:port only and give the login in PIPELINE_KAFKA__CLIENT:"
            " security.protocol (SASL_SSL or SASL_PLAINTEXT), sasl.mechanism, sasl.username"
            " and sasl.password",
        )
    if any(char.isspace() for char in servers):
        return PydanticCustomError(
            "bootstrap_space",
            "whitespace in the bootstrap list; separate host:port entries with commas only",
        )
    entries = servers.split(",")
    if servers and "" in entries:
        return PydanticCustomError(
            "bootstrap_empty",
            "an empty entry in the bootstrap list (two commas together, or one at an end);"
            f" remove it: {_BOOTSTRAP_FORM}",
        )
    return next(filter(None, map(_bootstrap_entry_problem, entries)), None)


def _bootstrap_entry_problem(entry: str) -> PydanticCustomError | None:
    """Why librdkafka cannot use ``entry`` of a bootstrap list (no ``@``, no space), or None."""
    scheme = entry.partition("://")[0] if "://" in entry else None
    if scheme is not None and scheme.lower() not in _BOOTSTRAP_PROTOCOLS:
        return PydanticCustomError(
            "bootstrap_protocol",
            "'{scheme}' is not a protocol librdkafka takes in the bootstrap list: write"
            " host:port, or PLAINTEXT://, SSL://, SASL_PLAINTEXT:// or SASL_SSL:// before it",
            {"scheme": scheme},
        )
    found = _BOOTSTRAP_ENTRY.fullmatch(entry)
    if found is None:
        return PydanticCustomError(
            "bootstrap_form",
            f"expected {_BOOTSTRAP_FORM}, each entry with its port (kafka:9092), IPv6"
            " addresses in brackets ([::1]:9092), maybe after a protocol (SASL_SSL://)",
        )
    if not 1 <= int(found["port"]) <= _MAX_PORT:
        return PydanticCustomError(
            "bootstrap_port", "port {port} is out of range (1-65535)", {"port": found["port"]}
        )
    return None


class MembershipSettings(_Section):
    """A consumer-group member's identity (``pipeline.transport.identity``)."""

    instance: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,200}$")
    """Stable member name (Kafka ``group.instance.id``, the Redis Streams member): a restarted
    member takes its own partitions back. None: the pod or host name and a free local slot."""
    slot_dir: Path | None = None
    """Where a derived name's slot locks live (None: ``$XDG_RUNTIME_DIR/pipeline-members``, else
    the temp directory's)."""
    shutdown: Literal["hold", "leave"] = "hold"
    """On SIGTERM, ``hold`` keeps the member's partitions for its replacement (Kafka: the
    session timeout, Redis: ``lease_ms``); ``leave`` hands them over at once (and on Kafka
    gives up static membership, so a crashed member's partitions wait for its session)."""


class PostgresSettings(_Section):
    """PostgreSQL connection of the ingress log store when it is not on SQLite.

    The registry's store is ``PIPELINE_REGISTRY__STORE``.
    """

    url: str = "postgresql://pipeline:pipeline@127.0.0.1:5432/pipeline"
    connect_timeout_s: float = Field(default=3.0, gt=0, le=60)
    """Longest wait for the log database before the operation fails: for a connection (a pooled
    one, or a new one: libpq ``connect_timeout``, at least 2 s there), and for the answer to a
    statement of the ingress, the sweeper or ``mark_processed`` (then its connection is closed;
    a purge, replay or status read may run longer while the server answers a check sent on
    another connection every this many seconds); with the server unreachable or not
    answering a webhook is answered 503 + Retry-After within about twice this (the group commit
    ahead of it, then its own), well inside a provider's own timeout (GitHub: 10 s)."""

    @field_validator("url")
    @classmethod
    def _pg_scheme(cls, value: str) -> str:
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("expected postgresql://user:password@host:port/database")
        problem = postgres_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


_AUTHORITY = re.compile(r"[^:]*://([^/?#]*)")


def postgres_url_problem(url: str) -> str | None:
    """Why libpq cannot read ``url``, its password hidden, or None.

    libpq reads a URL only when it connects, and its parse errors quote the token at fault: a
    ``%`` left unencoded in the password put the whole password in every line that said the
    log database could not be reached (``invalid percent-encoded token: "..."``), at each of the
    pool's retries. Parse it now (it connects to nothing). An ``@`` left unencoded it reads
    without complaint: the user info ends at the first ``@`` and the rest of the password
    becomes the host, named in every failure to resolve it; an authority with more than one
    ``@`` is refused (no host holds one).
    """
    from psycopg import ProgrammingError  # noqa: PLC0415 - only where a URL is set
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

    authority = _AUTHORITY.match(url)
    if authority is not None and authority.group(1).count("@") > 1:
        return (
            "more than one '@' in the URL's user, password and host (libpq ends the password at"
            " the first and takes the rest for the host name); a '%', '/', '?', '#' or '@' in the"
            " user or password must be percent-encoded (%25, %2F, %3F, %23, %40)"
        )
    try:
        conninfo_to_dict(url)
    except ProgrammingError as exc:
        said = hide_credentials(str(exc).strip(), url)
        return (
            f"libpq cannot read the URL ({said}); a '%', '/', '?', '#' or '@' in the user or"
            " password must be percent-encoded (%25, %2F, %3F, %23, %40)"
        )
    return None


class PressureSettings(_Section):
    """When a member runs fewer handlers at once (``pipeline.runtime.pressure``)."""

    enabled: bool = True
    """Shrink the member's concurrency under pressure and grow it back when it passes."""
    interval_s: float = Field(default=2.0, gt=0)
    """How often pressure is read."""
    cpu_psi: float = Field(default=80.0, gt=0, le=100)
    """CPU pressure (PSI ``some avg10``, percent of time some task waited for CPU) at or
    above which concurrency shrinks."""
    memory_psi: float = Field(default=10.0, gt=0, le=100)
    """Memory pressure (PSI ``some avg10``, percent) at or above which concurrency shrinks."""
    memory_used: float = Field(default=0.9, gt=0, le=1)
    """Memory in use, as a fraction of the cgroup's (or the machine's) limit, at or above
    which concurrency shrinks."""
    min_concurrency: int = Field(default=4, ge=1)
    """Concurrency never shrinks below this (nor above ``max_concurrency``)."""


class RuntimeSettings(_Section):
    """Consumer runtime limits of one group member."""

    max_concurrency: int = Field(default=64, ge=1, le=10_000)
    """Handlers running at once (different keys)."""
    partition_high_water: int = Field(default=1_000, ge=2)
    """Buffered messages of one partition above which it is paused."""
    partition_low_water: int = Field(default=500, ge=0)
    """Buffered messages of one partition at which a paused partition resumes."""
    poll_max: int = Field(default=500, ge=1, le=1_000_000)
    guard_claims: bool = True
    """First deliveries of guarded lanes run without a start mark of their own, under offset
    ranges claimed per partition (``runtime/claims.py``); off: every message is marked."""
    commit_interval_ms: int = Field(default=500, ge=10)
    liveness_ms: int = Field(default=5_000, ge=100)
    """A member renews its liveness in Redis every commit tick and counts as alive this long
    after: a copy of a message it started, read by another member meanwhile, waits for it
    (it lost the partition to a stall) instead of running beside it as a suspect. The leases
    of its follower releases and of its ``ctx.once`` claims are as long. So after a crash its
    work waits at most this long for another member. At least twice ``commit_interval_ms``."""
    shutdown_grace_s: float = Field(default=10.0, ge=0)
    """How long in-flight handlers may finish on shutdown or revocation."""
    mark_processed: bool = False
    """Mark the ingress log row of each finished event processed (``pl-row-id`` header), in
    batches, in the log store the ingress settings choose; without it the sweeper replays
    rows it never hears about."""
    pressure: PressureSettings = Field(default_factory=PressureSettings)
    """Concurrency under memory and CPU pressure."""
    suspect_alone_s: float = Field(default=30.0, gt=0)
    """A suspect (a message whose earlier start never finished, as when a crash took its
    member) runs alone, so a poison message is told from its neighbours; other runs wait for
    it at most this long."""
    cpu_workers: int = Field(default=2, ge=1, le=256)
    """Worker processes for CPU-bound handlers (``cpu=True``), started on first use."""
    cancel_poll_ms: int = Field(default=500, ge=10)
    """How often a member syncs its long work's heartbeats, learns of cancellations and runs
    the reconciler (docs/runtime.md, cancellation); a running handler is stopped within it."""
    cancel_grace_s: float = Field(default=5.0, ge=0)
    """Between SIGTERM and SIGKILL when a cancelled or hung ``cpu=True`` handler is stopped."""
    protect_max_s: float = Field(default=3_600.0, gt=0)
    """A run counts towards the member's pod-deletion-cost (scale-in protection) for at most
    this long, so a stuck handler cannot keep its Pod forever."""
    metrics_port: int | None = Field(default=None, ge=0, le=65_535)
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` of the member on this port (None: do
    not serve; several members on one host need a port each)."""
    metrics_host: str = "127.0.0.1"
    """Interface of the member's metrics endpoint (``0.0.0.0`` in a container)."""
    metrics_interval_s: float = Field(default=15.0, gt=0)
    """How often the member's metrics snapshot (group lag and age) is refreshed."""

    @model_validator(mode="after")
    def _low_water_below_high(self) -> RuntimeSettings:
        if self.partition_low_water >= self.partition_high_water:
            raise ValueError(
                f"partition_low_water ({self.partition_low_water}) must be below"
                f" partition_high_water ({self.partition_high_water}): lower"
                " PIPELINE_RUNTIME__PARTITION_LOW_WATER"
            )
        return self

    @model_validator(mode="after")
    def _liveness_outlasts_ticks(self) -> RuntimeSettings:
        if self.liveness_ms < 2 * self.commit_interval_ms:
            raise ValueError(
                f"liveness_ms ({self.liveness_ms}) must be at least twice commit_interval_ms"
                f" ({self.commit_interval_ms}), which renews it: raise"
                " PIPELINE_RUNTIME__LIVENESS_MS"
            )
        return self


class DynamicLimitSettings(_Section):
    """Dynamic per-org limits applied by the fleet (``pipeline.admission.fleet``)."""

    enabled: bool = False
    """Recompute every ``org:<tenant>`` limit from the org's recent traffic and the fleet's
    load (``docs/admission.md``, dynamic limits); off: the limits are what operators set."""
    policy_file: Path | None = None
    """YAML of the :class:`~pipeline.admission.limits.LimitPolicy` (floors, burst, factors);
    none: the defaults. Per-org overrides stored in Redis are laid over it at each tick."""
    interval_s: float = Field(default=10.0, ge=0.001)
    """How often members report their load and one of them recomputes the limits."""
    pool_ratio: float = Field(default=0.8, gt=0, le=1)
    """Share of the fleet's handler slots the limits aim to fill (the pool target)."""


class ThrottleSettings(_Section):
    """Fair admission throttles (``pipeline.admission.throttle``); shared by the whole fleet."""

    namespace: str = Field(default="default", pattern=r"^[A-Za-z0-9_.:-]+$")
    """Throttle keys acquired together must share a namespace (one Redis Cluster slot)."""
    default_limit: int = Field(default=10, ge=0)
    """Concurrency limit of a key that has none of its own."""
    lease_ms: int = Field(default=30_000, ge=30)
    """The lease of a permit acquired without one of its own (a lane's permits use its
    ``throttle.lease``, 60 s by default); renewed every third of it, a dead holder's slots
    return after it."""
    wake_block_s: float = Field(default=2.0, gt=0)
    """How long one blocking read of a member's wake list lasts."""
    dynamic: DynamicLimitSettings = Field(default_factory=DynamicLimitSettings)
    """Dynamic per-org limits."""


# The ingress's sections (PIPELINE_INGRESS__*); the sources file's models stay in
# pipeline.ingress.settings.


class IngressSlotSettings(_Section):
    """Bounded concurrent work at the edge; past it, 503 with Retry-After.

    Attributes:
        max_in_flight: requests of one source being worked on at once (body, verify, commit).
        queue_timeout_ms: how long a request may wait for a slot before it is shed.
        max_retry_after_s: the largest Retry-After sent.
    """

    max_in_flight: int = Field(default=512, ge=1)
    queue_timeout_ms: int = Field(default=100, ge=0)
    max_retry_after_s: int = Field(default=60, ge=1)


class SweeperSettings(_Section):
    """The sweeper: produce what the fast path lost, replay what nobody processed.

    Attributes:
        enabled: run the sweeper as a task of ``pipeline ingress serve``.
        interval_s: pause between sweeps.
        unproduced_after_s: a row still unproduced this long after receipt is produced.
        patience_s: a produced row unprocessed this long is replayed if its lane has no backlog
            (a debounced lane's rows wait its max_wait_s more; a long run shown alive by its
            member counts from its last sign of life).
        max_patience_s: past this it is replayed regardless (late is not lost, but bounded); a
            lane whose events wait longer by design (its retry tiers, a batch SLA, a debounce
            window) gets that wait plus patience_s instead, when longer.
        max_replays: replays before a row is abandoned (logged CRITICAL, counted).
        batch_size: rows claimed per query.
        lease_s: how long a claimed row is reserved for this sweeper.
        lane_groups: the consumer group that consumes each lane, for its backlog (lag).
        backlog_threshold: a lane is backed up when its group's lag, over the lane's main and
            retry-tier topics, exceeds this.
    """

    enabled: bool = True
    interval_s: float = Field(default=30.0, gt=0)
    unproduced_after_s: float = Field(default=60.0, gt=0)
    patience_s: float = Field(default=300.0, gt=0)
    max_patience_s: float = Field(default=900.0, gt=0)
    max_replays: int = Field(default=3, ge=0)
    batch_size: int = Field(default=500, ge=1)
    lease_s: float = Field(default=60.0, gt=0)
    lane_groups: dict[str, str] = Field(default_factory=dict)
    backlog_threshold: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> SweeperSettings:
        if self.max_patience_s < self.patience_s:
            raise ValueError("max_patience_s must be at least patience_s")
        return self


class IngressSettings(_Section):
    """The ``ingress`` section of the root settings (``PIPELINE_INGRESS__*``).

    Attributes:
        sources_file: the YAML file declaring the sources.
        host: address ``pipeline ingress serve`` binds.
        port: its port.
        metrics_port: serve ``/metrics``, ``/healthz`` and ``/readyz`` on this port instead
            of the webhook port (None: on the webhook port), so the webhook port can be
            public while metrics stay inside the cluster.
        metrics_host: the address of that port.
        log_store: ``sqlite`` (embedded default) or ``postgres`` (several replicas).
        sqlite_path: the SQLite database file.
        sqlite_synchronous: SQLite durability (``FULL``: survives power loss; ``NORMAL``:
            survives a process crash only; see :mod:`pipeline.logstore.sqlite.store`).
        postgres_schema: the schema of the PostgreSQL table (``PIPELINE_POSTGRES__URL``).
        group_commit_max_rows: most rows committed in one transaction.
        produce_queue_max: rows waiting for the fast produce path; past it the sweeper
            produces them (nothing is lost, memory stays bounded).
        produce_queue_max_bytes: body bytes of the rows waiting for the fast produce path;
            past it, as past ``produce_queue_max``, the sweeper produces them (the default
            keeps a stalled broker's backlog well inside the pod's 1 GiB memory limit).
        produce_batch_max: most events handed to the producer in one call.
        admission: the default admission of every source.
        sweeper: the sweeper.
        body_timeout_s: a request body not fully received this long after its head is
            answered 408 (no admission slot is held while a body arrives).
        max_head_bytes: a request line plus headers larger than this is answered 431.
        max_unfinished_bytes: heads and bodies left unfinished by a read, over all connections
            of a process (at least 128 KiB, and at least one whole request of every source, its
            ``max_body_bytes`` plus ``MAX_HEAD_BYTES``, else the ingress refuses to start): the
            read that passes it is answered 503 + Retry-After and its connection closed, so
            stalled senders cannot use up the ingress's memory ([ingress.md](ingress.md)).
        max_connections: client connections one process holds open (None: its open-file
            limit, which each command raises to its hard limit at start, less 128
            descriptors kept for the log store, the broker and the metrics port, at most
            16,384, about 85 MiB of idle connections; a value may pass 16,384 up to the limit
            less 128, and a value above that refuses to start). A connection past it closes, of
            those with no request being answered, the one that has sent nothing for the
            longest (an unfinished head or body is answered 503), or is closed at once when
            every one is answering, so connections that send nothing or stall cannot take
            the descriptors legitimate webhooks and the log store need; counted
            ``connection_limit`` and logged once per 10 s.
        stop_within_s: how long after SIGTERM the ingress ends by itself, whatever its broker
            does: uvicorn's graceful shutdown, the sweeper's batch in hand and the queued
            events get a third each of what is left after 3 s kept for closing (at most 10 s
            each), the producer's flush the rest; keep it under the pod's
            ``terminationGracePeriodSeconds`` less its preStop hook (``--workers``: the
            supervisor kills a worker 5 s after it).
        metrics_interval_s: how often the ingress's metrics snapshot (log backlog, group lag,
            sweeper heartbeat) is refreshed.
    """

    CLOSE_RESERVE_S: ClassVar[float] = 3.0
    """What a stop keeps, of ``stop_within_s``, for closing the log store and the transport."""

    sources_file: Path = Path("sources.yaml")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    body_timeout_s: float = Field(default=10.0, gt=0)
    max_head_bytes: int = Field(default=65_536, ge=4096)
    max_unfinished_bytes: int = Field(default=268_435_456, ge=131_072)
    max_connections: int | None = Field(default=None, ge=1)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    log_store: Literal["sqlite", "postgres"] = "sqlite"
    sqlite_path: Path = Path("ingress.db")
    sqlite_synchronous: Literal["FULL", "NORMAL", "OFF"] = "FULL"
    postgres_schema: str = Field(default="public", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    group_commit_max_rows: int = Field(default=512, ge=1)
    produce_queue_max: int = Field(default=10_000, ge=1)
    produce_queue_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    produce_batch_max: int = Field(default=500, ge=1)
    admission: IngressSlotSettings = Field(default_factory=IngressSlotSettings)
    sweeper: SweeperSettings = Field(default_factory=SweeperSettings)
    stop_within_s: float = Field(default=35.0, gt=0)
    metrics_interval_s: float = Field(default=15.0, gt=0)

    @field_validator("stop_within_s")
    @classmethod
    def _stop_leaves_room_to_drain(cls, value: float) -> float:
        least_s = cls.CLOSE_RESERVE_S + 2
        if value < least_s:
            raise ValueError(
                f"expected at least {least_s:g} s: a stop keeps {cls.CLOSE_RESERVE_S:g} s for"
                " closing the log store and the transport, and needs the rest to answer the"
                " requests in flight and produce the queued events; raise"
                " PIPELINE_INGRESS__STOP_WITHIN_S"
            )
        return value


# The schema registry's section (PIPELINE_REGISTRY__*) and the types it is made of.

Role = Literal["read", "write"]


class Compatibility(StrEnum):
    """Confluent compatibility levels."""

    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"
    NONE = "NONE"

    @property
    def transitive(self) -> bool:
        """Whether every earlier version is checked, not only the latest."""
        return self.value.endswith("_TRANSITIVE")

    @property
    def backward(self) -> bool:
        """Whether the new schema must read data written with the old ones."""
        return self.value.startswith(("BACKWARD", "FULL"))

    @property
    def forward(self) -> bool:
        """Whether the old schemas must read data written with the new one."""
        return self.value.startswith(("FORWARD", "FULL"))


class BasicUser(BaseModel):
    """One basic-auth user."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    username: str
    password: SecretStr
    role: Role = "read"


class BearerToken(BaseModel):
    """One bearer token; ``name`` identifies it in logs in place of the secret."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    token: SecretStr
    role: Role = "read"


class AuthSettings(BaseModel):
    """Who may use the registry; empty lists mean no authentication."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    users: tuple[BasicUser, ...] = ()
    tokens: tuple[BearerToken, ...] = ()

    @property
    def enabled(self) -> bool:
        """Whether any credential is configured."""
        return bool(self.users or self.tokens)


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is not an ``http://`` or ``https://`` URL with a host and a usable port."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is no number or out of range
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in {"http", "https"}:
        return "expected http://host:port or https://host:port"
    if not parts.hostname:
        return "no host"
    if port == 0:
        return f"port 0 is not one to connect to (1-{_MAX_PORT})"
    import httpx  # noqa: PLC0415 - only where a URL is checked

    try:
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        return str(exc)
    return None


class RegistrySettings(BaseModel):
    """Where the registry listens, what it stores in, and who may use it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8081, ge=0, le=65_535)
    """0 picks a free port (the chosen one is printed at start)."""
    store: str = "sqlite:///registry.db"
    """``sqlite:///relative.db``, ``sqlite:////absolute/path.db`` or ``postgresql://...``."""
    url: str = "http://127.0.0.1:8081"
    """The registry as clients reach it (serde, ``schemas`` commands)."""
    default_compatibility: Compatibility = Compatibility.BACKWARD
    pool_max: int = Field(default=10, ge=1)
    """PostgreSQL connections per registry process."""
    max_body_bytes: int = Field(default=1_048_576, ge=1_024)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    client_username: str | None = None
    """Basic-auth user the serde and CLI present to a protected registry."""
    client_password: SecretStr | None = None
    client_token: SecretStr | None = None
    """Bearer token the serde and CLI present (instead of basic auth)."""
    timeout_s: float = Field(default=10.0, gt=0)
    """Client HTTP timeout."""
    replicas: int = Field(default=1, ge=1)
    """How many registry processes serve ``store``, this one included (the Deployment's count)."""
    require_auth: bool = False
    """Refuse to serve when no user or token is configured (the manifests set it)."""

    @field_validator("store")
    @classmethod
    def _store_scheme(cls, value: str) -> str:
        if not value.startswith(("sqlite://", "postgresql://", "postgres://")):
            raise ValueError("expected sqlite:///path or postgresql://user:password@host/db")
        problem = None if value.startswith("sqlite://") else postgres_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("url")
    @classmethod
    def _url_scheme(cls, value: str) -> str:
        problem = http_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value.rstrip("/")


class Settings(BaseSettings):
    """The root of all configuration."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    transport: Literal["kafka", "redis"] = "redis"
    topics_dir: Path = Path("topics")
    max_message_bytes: int = Field(default=_DEFAULT_MAX_MESSAGE_BYTES, ge=1_024, le=64 * 1_048_576)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    membership: MembershipSettings = Field(default_factory=MembershipSettings)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    throttle: ThrottleSettings = Field(default_factory=ThrottleSettings)
    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    ingress: IngressSettings = Field(default_factory=IngressSettings)
    capacity: CapacitySettings = Field(default_factory=CapacitySettings)


def _env_name(loc: tuple[int | str, ...]) -> str:
    return ENV_PREFIX + "__".join(str(part).upper() for part in loc)


log = logging.getLogger(__name__)
# Read directly, not through Settings: the log level and format, and the Kafka jars cache.
_OTHER_VARIABLES = frozenset({"PIPELINE_LOG_LEVEL", "PIPELINE_LOG_FORMAT", "PIPELINE_CACHE_DIR"})


def _variables(model: type[BaseModel], prefix: str) -> dict[str, Any]:
    """Every environment variable ``model`` reads, with the annotation of its field."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        env = f"{prefix}{name.upper()}"
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out[env] = annotation  # a whole section may be given as JSON too
            out.update(_variables(annotation, env + "__"))
        else:
            out[env] = annotation
    return out


def _warn_unknown(known: dict[str, Any]) -> None:
    """Warn of a variable that looks like a misspelt setting (others may be secrets' names).

    One inside a section (``PIPELINE_REDIS__URI``) is not ignored but refused by the section:
    :func:`_not_a_setting` words that error instead.
    """
    for name in sorted(os.environ):
        if not name.startswith(ENV_PREFIX) or name in known or name in _OTHER_VARIABLES:
            continue
        parent = known.get(name.rsplit("__", 1)[0]) if "__" in name else None
        if isinstance(parent, type) and issubclass(parent, BaseModel):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
        if close:
            log.warning("%s is not a setting and is ignored; did you mean %s?", name, close[0])
        elif "__" in name and name.rsplit("__", 1)[0] in known:
            log.warning(
                "%s is not a setting and is ignored (docs/configuration.md lists them)", name
            )


def _not_a_setting(name: str, known: dict[str, Any]) -> str:
    """What a section says of ``name``, a variable it does not have, with the closest one."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
    if close:
        return f"{name}: not a setting; did you mean {close[0]}?"
    return f"{name}: not a setting (docs/configuration.md lists them)"


def _not_json(known: dict[str, Any]) -> str:
    """Which JSON-valued variable failed to parse, for pydantic-settings' SettingsError."""
    for name, annotation in known.items():
        is_json = get_origin(annotation) in {dict, list} or (
            isinstance(annotation, type) and issubclass(annotation, BaseModel)
        )
        if not is_json or name not in os.environ:
            continue
        try:
            json.loads(os.environ[name])
        except ValueError:
            return f"{name}: not valid JSON (expected {_json_example(name, annotation)})"
    return "a PIPELINE_* variable that holds JSON is not valid JSON"


_JSON_EXAMPLES = {
    "PIPELINE_KAFKA__CLIENT": '{"fetch.wait.max.ms": "50"}',
    "PIPELINE_INGRESS__SWEEPER__LANE_GROUPS": '{"messages": "messages"}',
}
"""What each mapping-valued variable takes, shown when its value is not JSON."""


def _json_example(name: str, annotation: Any) -> str:
    """An example value ``name`` itself takes: a section's first setting, or the mapping's."""
    if name in _JSON_EXAMPLES:
        return f"an object such as {_JSON_EXAMPLES[name]}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field, info = next(iter(annotation.model_fields.items()))
        try:
            value = json.dumps(info.get_default(call_default_factory=True))
        except TypeError:
            return f'an object of its settings such as {{"{field}": ...}}'
        return f'an object of its settings such as {{"{field}": {value}}}'
    return "a JSON object"


class _TopicsDirOnly(BaseSettings):
    """``PIPELINE_TOPICS_DIR`` read alone, the rest of the environment ignored."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    topics_dir: Path = Settings.model_fields["topics_dir"].default


def topics_dir() -> Path:
    """Where the topic declarations are (``PIPELINE_TOPICS_DIR``, default ``topics``).

    Read alone, so an application that only needs its lanes (``App()``) neither validates nor
    warns about the other settings; ``pipeline topics apply`` and every command read the same.
    """
    return _TopicsDirOnly().topics_dir


def declare_hint() -> str:
    """What to do about a topic missing on the broker, naming the directory commands read.

    ``PIPELINE_TOPICS_DIR`` (default ``topics``): ``pipeline topics apply`` and ``App()`` read
    their declarations there, so "topics/" would send an operator whose declarations live
    elsewhere to a directory nothing reads.
    """
    return f"declare it in {topics_dir()}/ and run `pipeline topics apply`"


def load_settings(**overrides: Any) -> Settings:
    """Build :class:`Settings` from the environment plus ``overrides``.

    A ``PIPELINE_*`` variable that is no setting is logged as a warning with the closest name.

    Raises:
        ConfigError: a setting is invalid; the message names each variable at fault.
    """
    known = _variables(Settings, ENV_PREFIX)
    _warn_unknown(known)
    try:
        return Settings(**overrides)
    except SettingsError:
        raise ConfigError(_not_json(known)) from None
    except ValidationError as exc:
        problems = [
            _not_a_setting(_env_name(err["loc"]), known)
            if err["type"] == "extra_forbidden"
            else f"{_env_name(err['loc'])}: {setting_reason(err)}{_got(err)}"
            for err in exc.errors()
        ]
        if len(problems) == 1:  # the common case: one line
            raise ConfigError(f"invalid configuration: {problems[0]}") from None
        raise ConfigError(
            f"invalid configuration ({len(problems)} problems):\n  " + "\n  ".join(problems)
        ) from None


def setting_reason(err: Any) -> str:
    """Pydantic's message, without the "Value error, " it puts before our validators' own.

    A URL's password never shows: a parser that split it elsewhere (a ``/`` or ``%`` left
    unencoded) names a piece of it as the port, path or token at fault
    (:func:`hide_credentials`), and no piece of a URL setting's value that its echo hides
    (:func:`shown_url`: a token in its path, a query value) shows in the reason either. Only
    a reason that may quote the value is looked at (:func:`_may_quote_input`): pydantic's own
    ("Input should be 'kafka' or 'redis'") keep every allowed value whole.
    """
    reason = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    if not isinstance(value, str) or not _may_quote_input(err):
        return reason
    reason = hide_credentials(reason, value)
    echoed = _shown(err)
    if echoed is not None or _named_secret(err):
        shown = set(_PIECES.split(echoed if isinstance(echoed, str) else ""))
        shown.add(value.partition("://")[0] if _SCHEME.fullmatch(value) else "")  # redis://
        hidden = {piece for piece in _PIECES.split(value) if piece not in shown}
        for piece in sorted(hidden, key=len, reverse=True):
            if len(piece) >= _MIN_HIDDEN_CHARS:
                reason = reason.replace(piece, _HIDDEN)
    return reason


def _may_quote_input(err: Any) -> bool:
    """Whether ``err``'s reason may hold a piece of its value.

    Our validators' may (``value_error``), as may any reason built from another error
    (``{error}`` in pydantic's template: a parser's message); pydantic's literal, type,
    pattern and bound messages name what is expected, never the value.
    """
    return err["type"] in {"value_error", "assertion_error"} or "error" in err.get("ctx", {})


_NOT_SECRET_SETTINGS = frozenset(
    {"PIPELINE_REDIS__KEY_PREFIX", "PIPELINE_REGISTRY__REQUIRE_AUTH", "PIPELINE_INGRESS__LOG_STORE"}
)
"""Settings whose names look like a secret's (*KEY*, *AUTH*, *STORE*) but whose values are not."""


def _loc_judged(err: Any) -> list[str]:
    """``err``'s location as names judged for secrets: a setting known to hold none left out."""
    loc = [str(part) for part in err["loc"]]
    return loc[:-1] if _env_name(tuple(err["loc"])) in _NOT_SECRET_SETTINGS else loc


def _echoed_as_url(err: Any) -> bool:
    """Whether ``err``'s value is echoed as :func:`shown_url` shows it.

    A URL setting's is, and any value holding an ``@``, unless under a secret-looking section.
    """
    value = err.get("input")
    *parents, last = [str(part) for part in err["loc"]] or [""]
    return (
        isinstance(value, str)
        and bool(_URL_SETTING.search(last) or "@" in value)
        and not any(_SENSITIVE.search(part) for part in parents)
    )


_SENSITIVE = re.compile(r"pas|pw|secret|token|auth|user|url|dsn|cred|key|store", re.IGNORECASE)
_MAX_SHOWN_CHARS = 64


_URL_SETTING = re.compile(r"(url|dsn)$", re.IGNORECASE)
_MAX_SHOWN_URL_CHARS = 200


def _got(err: Any) -> str:
    """`` (got ...)`` for a value safe to echo; nothing for secrets or whole mappings.

    A setting named like a secret (``PIPELINE_REGISTRY__CLIENT_PASSWORD``, a token's ``role``,
    a ``sasl.password`` entry of ``PIPELINE_KAFKA__CLIENT``) never shows its value, whatever it
    is; nor does one under another sensitive-looking name, nor a mapping or list. A misspelt
    key under a secret (``pasword``) carries the secret as its value. Any other string is
    shown as :func:`shown_url` shows it, as the value given is what shows the mistake: a URL
    setting's (``PIPELINE_REDIS__URL=localhost:6379``), one holding an ``@``
    (``PIPELINE_KAFKA__BOOTSTRAP_SERVERS=user:pw@kafka:9092``) or keywords
    (``host=h password=...``), and a plain word as given; a value it cannot read only by its
    length.
    """
    value = err.get("input")
    if isinstance(value, bool | int | float):
        if _named_secret(err) or any(_SENSITIVE.search(part) for part in _loc_judged(err)):
            return ""
        return f" (got {value!r})"
    shown = _shown(err)
    if shown is None:
        return ""
    if isinstance(shown, int):
        return f" (got {shown} characters, not shown)"
    return f" (got {shown!r})"


def _shown(err: Any) -> str | int | None:
    """What a line shows of ``err``'s string value: the text, only its length, or None.

    Whitespace around the value (an env file's stray space or newline) is no secret and often
    the mistake: the value is judged without it and shown with it (``'redis '``).
    """
    value = err.get("input")
    if not isinstance(value, str) or _named_secret(err):
        return None
    core = value.strip()
    longest = _MAX_SHOWN_URL_CHARS if _HOST_LIST.fullmatch(core) else _MAX_SHOWN_CHARS
    if _echoed_as_url(err):
        shown = shown_url(core)
    elif len(core) > longest or any(_SENSITIVE.search(part) for part in _loc_judged(err)):
        return None
    else:
        shown = _shown_value(core)
    if shown is None:
        return len(value)
    start = value.find(core) if core else len(value)
    return value[:start] + shown + value[start + len(core) :]


_SECRET_SETTING = re.compile(r"pas|pw|word|secret|token|key|auth|cred|cert|priv", re.IGNORECASE)


def _named_secret(err: Any) -> bool:
    """Whether ``err``'s setting, or a section or mapping key above it, is named like a secret.

    A setting in :data:`_NOT_SECRET_SETTINGS` is not (``PIPELINE_REDIS__KEY_PREFIX``).
    """
    return any(_SECRET_SETTING.search(part) for part in _loc_judged(err))


_HOST_ITEM = r"(?:[A-Za-z][A-Za-z0-9+.-]*://)?[A-Za-z0-9_.\-\[\]]*(?::\d*)?"
_LIST_SEPARATOR = re.compile(r"(\s*[,;]\s*)")
_HOST_LIST = re.compile(rf"{_HOST_ITEM}(?:\s*[,;]\s*{_HOST_ITEM})+")
_WORDS = re.compile(r"[A-Za-z0-9_.-]+(?:\s+[A-Za-z0-9_.-]+)+")


def _shown_value(value: str) -> str | None:
    """A string that is no URL setting's, fit to echo; None if only its length may show.

    A list of hosts with numeric ports, each maybe with a scheme (``PLAINTEXT://kafka:9092,
    kafka2``, ``kafka1:9092; kafka2:9092``), shows each as :func:`shown_url` does and its
    separators as given; plain words apart (``10 s``, ``backward transitive``) as given, unless
    one is opaque (:func:`_opaque`) or named like a secret (``password hunter``); anything else
    as :func:`shown_url` shows it: a plain word as given, keywords with secret-looking names'
    values hidden, ``user:password`` as ``user:***`` (a port that is no number).
    """
    if _HOST_LIST.fullmatch(value):
        parts = _LIST_SEPARATOR.split(value)
        items = [shown_url(item) for item in parts[::2]]
        if None in items:
            return None
        parts[::2] = [item or "" for item in items]
        return "".join(parts)
    if _WORDS.fullmatch(value):
        words = value.split()
        plain = not any(_opaque(word) or _SECRET_NAME.search(word) for word in words)
        return value if plain else None
    return shown_url(value)


_HIDDEN = "***"
_PIECES = re.compile(r"[\s/:@?&;=#'\"\[\]]+")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.DOTALL)
_SECRET_NAME = re.compile(r"pas|pw|secret|token|key|auth|cred|sig|session|cert|priv", re.IGNORECASE)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,39}")
_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]*")
_PORT = re.compile(r"\d{1,5}")
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_.:-]{1,63}")
_KEYWORD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s']*)\s*")
_PARTS = re.compile(r"([^?#]*)(\?[^#]*)?(#.*)?", re.DOTALL)
_NAMED_VALUE = re.compile(
    r"(pass|passwd|word|phrase|pwd|pw|secret|token|key|auth|creds?|credentials)"
    r"\s*(?:=|:(?!\d{1,5}(?:$|[/?#,])))\s*(?!\*\*\*)",
    re.IGNORECASE,
)
"""A secret-looking name followed by a value that is not hidden (a port is no value: a host
``redis-auth:6379`` is shown): no echo may hold one."""
_SECRET_OPTION = re.compile(
    r"(pass|passwd|word|phrase|pwd|pw|secret|token|key|auth|creds?|credentials|sig|signature)$",
    re.IGNORECASE,
)
"""An option whose value is a secret (``sslpassword``, ``apikey``; not ``ssl_keyfile``)."""
_LONG_TOKEN_CHARS = 16
_LONGEST_WORD_CHARS = 24


def shown_url(value: str) -> str | None:
    """``value`` (a URL, a libpq keyword string, or host[:port][/path]) fit to echo; None if not.

    Shown: the scheme, host, port and the path's first segment (a database, a bucket: what
    tells one service's value from another's), a ``unix://`` socket's whole path. Hidden
    (``***``): all before the last ``@`` (the user and password, a password with an unencoded
    ``/`` or ``@`` included); every query option's value and the fragment; a libpq keyword's
    value under a secret-looking name (``password``, ``passfile``, ``sslkey``...) or not a
    plain word; a port that is no number and all after it (``user:password`` read as
    host:port); each path segment after the first (API paths, webhook tokens, S3 keys), and a
    first one that is opaque (:func:`_opaque`). A value none of these reads, or whose shown
    form still has a secret-looking name followed by ``=`` or ``:`` and a value
    (``password:1234``), is ``None``: shown only by its length. Cut to 200 characters.
    """
    shown = _keywords(value)
    if shown is None:
        url = _SCHEME.fullmatch(value)
        if url is not None:  # scheme://[userinfo@]host...: the userinfo goes
            scheme, after = url.groups()
            if _unclear_userinfo(after):
                return None
            _, at, rest = after.rpartition("@")
            shown = _url(f"{scheme}://{_HIDDEN + '@' if at else ''}", rest, scheme)
        elif _unclear_userinfo(value):
            return None
        else:  # all before the last @ goes, then a URL or host[:port][/path][?query]
            _, at, rest = value.rpartition("@")
            url = _SCHEME.fullmatch(rest)
            head = f"{_HIDDEN}@" if at else ""
            shown = (
                _url(f"{head}{url.group(1)}://", url.group(2), url.group(1))
                if url
                else _url(head, rest, "")
            )
    if shown is not None and _NAMED_VALUE.search(shown):
        return None
    if shown is not None and len(shown) > _MAX_SHOWN_URL_CHARS:
        shown = shown[: _MAX_SHOWN_URL_CHARS - 3] + "..."
    return shown


_CLOSE_NAME_RATIO = 0.8


@functools.cache
def _option_names() -> tuple[str, ...]:
    """Every option name a URL's query or a keyword string may give: libpq's and redis-py's."""
    from psycopg import pq  # noqa: PLC0415 - only where a value is echoed

    names = {option.keyword.decode() for option in pq.Conninfo.get_defaults()}
    names |= set(URL_QUERY_ARGUMENT_PARSERS)
    for cls in (RedisConnection, RedisSSLConnection, RedisUnixConnection):
        names |= set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    return tuple(sorted(names))


def _known_name(name: str) -> bool:
    """Whether ``name`` is an option libpq or redis-py knows, or close to one (a typo).

    Any other name may be a piece of a secret (a password holding an ``=`` or ``&``).
    """
    return bool(difflib.get_close_matches(name.lower(), _option_names(), 1, _CLOSE_NAME_RATIO))


def _unclear_userinfo(after: str) -> bool:
    """Whether what follows the last ``@`` in ``after`` may be no host (so not to be shown).

    ``after`` is what follows ``scheme://``, or a value without one. All before the last
    ``@`` is hidden, as a password may hold an unencoded ``/``, ``?`` or ``#``
    (``redis://:ab/cd@host``). But an ``@`` in a query, path or fragment
    (``redis://host/0?password=ab@cd``) would show the rest of that password as the host. So
    an ``@`` after the first ``/``, ``?`` or ``#`` cannot be told, unless what comes before
    that is no host but ``:`` and a password's start (``redis://:ab/cd@host``); nor can one
    after a space, quote or brace (``password ab@cd``: no user and password hold them) or
    after a secret-looking name and ``:`` or ``=``. Such a value is shown by its length.
    """
    head, at, _ = after.rpartition("@")
    if not at:
        return False
    if any(c.isspace() or c in "\"'{}" for c in head) or _NAMED_VALUE.search(head):
        return True
    end = min((i for i in (after.find(mark) for mark in "/?#") if i != -1), default=len(after))
    if len(head) < end:  # the last @ is in the authority: it ends the user and password
        return False
    host = _address(after[:end].rpartition("@")[2])
    return host != f":{_HIDDEN}"  # ':' and no number: a password's start, not a host


def _keywords(value: str) -> str | None:
    """A libpq keyword string (``host=db password=...``) with secret values hidden; None if not.

    A name libpq does not know, nor one close to it (a typo), is hidden with its value: a
    password holding an ``=`` (``pw=...@host``) reads as a keyword, its first piece as the name.
    """
    pairs = []
    end = 0
    for found in _KEYWORD.finditer(value):
        if found.start() != end:
            return None
        end = found.end()
        name, given = found.groups()
        known = _known_name(name)
        plain = _PLAIN_VALUE.fullmatch(given) and not _opaque(given)
        hidden = _SECRET_NAME.search(name) or not plain or not known
        pairs.append(f"{name if known else _HIDDEN}={_HIDDEN if hidden else given}")
    return " ".join(pairs) if pairs and end == len(value) else None


def _url(head: str, rest: str, scheme: str) -> str | None:
    """``head`` and ``rest`` (host, port, path, query, fragment) shown safely; None if no host."""
    cut = len(rest)
    for mark in "/?#":
        at = rest.find(mark)
        if at != -1:
            cut = min(cut, at)
    authority = _address(rest[:cut])
    if authority is None:
        return None
    if authority.endswith(f":{_HIDDEN}"):  # no port but user:password: all after it is its
        return f"{head}{authority}"
    parts = _PARTS.fullmatch(rest[cut:])
    if parts is None:  # pragma: no cover - the pattern matches any text
        return None
    path, query, fragment = parts.groups()
    shown = f"{head}{authority}{_path(path, scheme.lower())}"
    if query is not None:
        shown += "?" + _query(query[1:])
    if fragment:
        shown += f"#{_HIDDEN}" if len(fragment) > 1 else "#"
    return shown


_PLAIN_OPTIONS = frozenset(
    {
        # redis-py's
        "db",
        "protocol",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "retry_on_timeout",
        "health_check_interval",
        "max_connections",
        "decode_responses",
        "ssl_cert_reqs",
        "ssl_check_hostname",
        "ssl_min_version",
        # libpq's
        "sslmode",
        "connect_timeout",
        "target_session_attrs",
        "gssencmode",
        "sslnegotiation",
        "load_balance_hosts",
    }
)
"""Options whose value is a setting, never a secret: a plain word given to one is shown, so a
bad one (``ssl_cert_reqs=bogus``) can be seen in its line."""
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_.-]{1,16}")


def _query(query: str) -> str:
    """``query``'s option names, each value ``***``; names no client knows hidden too.

    A plain word given to an option of :data:`_PLAIN_OPTIONS` is shown.

    A name libpq or redis-py knows, or a typo of one (:func:`_known_name`), is shown; any other
    may be a piece of a secret (``?<token>`` with an ``=`` in it). An item with no ``=``, a
    name that is not plain, or a password's (whose value may hold an unencoded ``&``:
    ``password=abc&def=...``) may be where a secret goes on: the names after it are hidden
    as well.
    """
    shown = []
    doubt = False
    for item in re.split(r"[&;]", query):
        name, eq, _ = item.partition("=")
        plain = bool(eq) and bool(_NAME.fullmatch(name))
        named = plain and not doubt and _known_name(name)
        value = item[len(name) + 1 :]
        open_value = (
            named
            and name.lower() in _PLAIN_OPTIONS
            and _PLAIN_VALUE.fullmatch(value)
            and not _mixed(value)  # a generated token's look, a setting's never
        )
        shown.append(
            f"{name if named else _HIDDEN}={value if open_value else _HIDDEN}" if eq else _HIDDEN
        )
        doubt = doubt or not plain or bool(_SECRET_OPTION.search(name))
    return "&".join(shown)


def _address(authority: str) -> str | None:
    """``host[:port]`` with a port that is no number hidden; None if no host name could be."""
    host, colon, port = (
        authority.rpartition(":") if not authority.endswith("]") else (authority, "", "")
    )
    if not colon:
        host = authority
    if not _HOST.fullmatch(host) or any(_mixed(label) for label in host.split(".")):
        return None
    shown_port = f":{port if _PORT.fullmatch(port) else _HIDDEN}" if colon else ""
    return f"{host}{shown_port}"


def _path(path: str, scheme: str) -> str:
    """``path`` with its segments after the first, and each opaque one, hidden.

    No operator needs more than a URL's first segment (the database, the bucket) to tell
    which value it is, and a deeper one is where tokens live (``/hooks/<token>``,
    ``/v1/<key>``); a Redis URL's first is a database number, shown only as one or as a short
    lowercase word (``/db0``: the mistake a line must show). A socket's
    path is all a ``unix://`` URL has: each of its segments is shown unless opaque or after
    a secret-looking one.
    """
    segments = path.split("/")
    whole = scheme == "unix"
    shown = [
        _HIDDEN
        if segment
        and (
            _opaque(segment)
            or (i > 1 and not whole)
            or (i == 1 and scheme in {"redis", "rediss"} and not _SHORT_WORD.fullmatch(segment))
            or (i and _SECRET_NAME.search(segments[i - 1]))
        )
        else segment
        for i, segment in enumerate(segments)
    ]
    return "/".join(shown)


_SHORT_WORD = re.compile(r"[a-z0-9_.-]{1,12}")
"""A Redis URL's path shown when it is no number (``/db0``): a short lowercase word."""


def _mixed(text: str) -> bool:
    """Letters of both cases and a digit: how generated passwords and tokens look, names not."""
    return (
        any(c.isdigit() for c in text)
        and any(c.isupper() for c in text)
        and any(c.islower() for c in text)
    )


def _opaque(segment: str) -> bool:
    """A path segment or value that reads as a token or a key rather than a name.

    Names of databases, buckets, sockets and API paths are lowercase words, numbers and
    separators; a generated secret mixes cases and digits (:func:`_mixed`), or is long and
    holds a digit (hex, a UUID, an access key id), or is longer than words run. An encoded
    character (``%``) may hide anything, and no name holds a space or a character outside
    ASCII. Such a segment is hidden, whatever it is.
    """
    digits = any(c.isdigit() for c in segment)
    return (
        _mixed(segment)
        or (digits and len(segment) >= _LONG_TOKEN_CHARS)
        or len(segment) >= _LONGEST_WORD_CHARS
        or "%" in segment
        or not segment.isascii()
        or any(c.isspace() for c in segment)
    )

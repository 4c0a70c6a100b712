"""One ``topics/*.yaml`` file per topic, validated into a :class:`TopicSpec`.

A declaration names the main topic; the retry tier topics (``<name>.retry.<delay>``) and the
dead-letter topic (``<name>.dlq`` unless set) are derived from it, so every topic has a DLQ and
the retry path has the main topic's partition count (per-key order survives a retry). The file
format is documented field by field in ``docs/topics.md``.

:func:`load_specs` turns every problem in a directory of declarations into one
:class:`~pipeline.errors.TopicSpecError` whose lines read ``<file>: <field path>: <problem>``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipeline.errors import TopicSpecError
from pipeline.offload.policy import OffloadPolicy
from pipeline.transport.protocol import TopicConfig
from pipeline.validation import field_path

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from pydantic_core import ErrorDetails

__all__ = [
    "DLQ_MIN_RETENTION_MS",
    "DebouncePolicy",
    "RetryBudgetPolicy",
    "RetryPolicy",
    "SojournPolicy",
    "ThrottlePolicy",
    "TopicSpec",
    "format_duration_ms",
    "load_spec",
    "load_specs",
    "parse_duration_ms",
]

DURATION_HINT = "expected a duration like 500ms, 30s, 5m, 2h, 7d"
DLQ_MIN_RETENTION_MS = 14 * 86_400_000
"""Dead letters wait for a human; keep them at least two weeks whatever the main retention."""
MAX_NAME_LENGTH = 200
MAX_PARTITIONS = 10_000
DEFAULT_MAX_WAIT_S = 30.0
"""A debounced lane's default maximum wait for a turn, when ``max_wait_s`` is not given."""

# Largest unit first, so format_duration_ms picks the coarsest exact label.
_UNITS_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_LANE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_duration_ms(value: str | int) -> int:
    """Parse a duration such as ``"500ms"``, ``"30s"``, ``"5m"``, ``"2h"``, ``"7d"`` or ``1500``.

    Args:
        value: a whole number with one unit (``ms``, ``s``, ``m``, ``h``, ``d``), or an int of
            milliseconds.

    Returns:
        The duration in milliseconds, always greater than zero.

    Raises:
        ValueError: the value has another form, or is zero or negative.
    """
    # YAML can hand over anything, and bool is an int subclass: `retention: yes` is a mistake,
    # not one millisecond. ValueError, not TypeError, because pydantic reports only ValueError.
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{DURATION_HINT} (got {value!r})")  # noqa: TRY004
    if isinstance(value, int):
        duration_ms = value
    else:
        match = _DURATION.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"{DURATION_HINT} (got {value!r})")
        duration_ms = int(match[1]) * _UNITS_MS[match[2]]
    if duration_ms <= 0:
        raise ValueError(f"a duration must be longer than zero (got {value!r})")
    return duration_ms


def format_duration_ms(duration_ms: int) -> str:
    """Write a duration with the coarsest unit that divides it exactly (``60000`` -> ``"1m"``).

    The label is canonical: ``"60s"``, ``"1m"`` and ``60000`` all give ``"1m"``, which is what
    makes retry topic names stable however the tier was written.
    """
    for unit, unit_ms in _UNITS_MS.items():
        if duration_ms % unit_ms == 0 and duration_ms >= unit_ms:
            return f"{duration_ms // unit_ms}{unit}"
    return f"{duration_ms}ms"


def _topic_name(value: str) -> str:
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"at most {MAX_NAME_LENGTH} characters (got {len(value)})")
    if not _TOPIC_NAME.fullmatch(value) or value in {".", ".."}:
        raise ValueError(f"expected letters, digits, '.', '_' or '-' (got {value!r})")
    if ".retry." in value:
        raise ValueError(f"'.retry.' is reserved for retry tier topics (got {value!r})")
    return value


def _main_topic_name(value: str) -> str:
    if value.endswith(".dlq"):
        raise ValueError(f"'.dlq' at the end is reserved for dead-letter topics (got {value!r})")
    return value


def _config_values(value: Any) -> Any:
    """Write YAML ints, floats and bools as Kafka expects them; leave other input to validation."""
    if not isinstance(value, dict):
        return value
    return {key: _config_value(item) for key, item in value.items()}


def _config_value(item: Any) -> Any:
    if isinstance(item, bool):  # before int: bool is an int subclass, and Kafka wants lowercase
        return "true" if item else "false"
    if isinstance(item, int | float):
        return str(item)
    return item


Duration = Annotated[int, BeforeValidator(parse_duration_ms)]
TopicName = Annotated[StrictStr, AfterValidator(_topic_name)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdaptivePolicy(_Spec):
    """An adaptive throttle key's AIMD window (``pipeline.admission.adaptive``).

    Attributes:
        min: the window never shrinks below this many slots.
        max: nor grows above this many.
        decrease: the factor a slow or throttled call shrinks the window by.
        latency_ms: a call that takes longer counts as slow (YAML key ``latency``; none: only
            ``Throttled`` shrinks the window).
        cooldown_ms: at most one decrease per this long (YAML key ``cooldown``).
    """

    min: int = Field(default=1, ge=1, strict=True)
    max: int = Field(ge=1, strict=True)
    decrease: float = Field(default=0.5, gt=0, lt=1)
    latency_ms: Duration | None = Field(default=None, alias="latency")
    cooldown_ms: Duration = Field(default=1_000, alias="cooldown")

    @model_validator(mode="after")
    def _bounds(self) -> AdaptivePolicy:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class ThrottlePolicy(_Spec):
    """Which throttle keys a lane's message must hold a slot on before its handler runs.

    Attributes:
        keys: key templates such as ``org:{tenant}`` or ``sub:{tenant}/{customer_id}``;
            ``{tenant}`` is the ``pl-tenant`` header, ``{key}`` the message key, ``{lane}`` the
            lane, and any other name a top-level field of the JSON event. A template naming
            something the message does not have is left out (no sub-tenant given: only the org
            is throttled).
        priority: 0..1000; higher is served first when slots are contended.
        lease_ms: how long a slot is held without renewal (YAML key ``lease``); a member that
            dies frees its slots after this.
        max_waiting: messages of the lane one member holds waiting for a slot; beyond it,
            an over-limit message whose key has nothing waiting is deferred through the first
            retry tier (its key parked behind it) instead of being held in memory.
        adaptive: keys of ``keys`` that stand for a downstream dependency (``dep:vision-api``)
            and whose limit adapts to its 429s and latency (see :class:`AdaptivePolicy`);
            they must be plain keys, not templates.
    """

    keys: tuple[StrictStr, ...] = Field(min_length=1)
    priority: int = Field(default=0, ge=0, le=1000, strict=True)
    lease_ms: Duration = Field(default=60_000, alias="lease")
    max_waiting: int = Field(default=1000, ge=1, strict=True)
    adaptive: dict[str, AdaptivePolicy] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _adaptive_keys(self) -> ThrottlePolicy:
        for key in self.adaptive:
            if key not in self.keys or "{" in key:
                raise ValueError(
                    f"adaptive key {key!r} must be one of the plain (not templated) keys"
                )
        return self

    @field_validator("keys")
    @classmethod
    def _templates(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        for template in keys:
            try:
                template.format_map(_AnyField())
            except (ValueError, IndexError) as exc:
                raise ValueError(f"bad key template {template!r}: {exc}") from None
        return keys


class _AnyField(dict[str, str]):
    def __missing__(self, name: str) -> str:
        return name


class RetryBudgetPolicy(_Spec):
    """How many retries a lane may send, relative to its traffic, before retries back off hard.

    A failure that finds the budget spent skips to the longest retry tier instead of the next
    one, so a failing dependency is not hammered by a retry storm (seed 003, metastable
    failures). The budget is kept by each member for the messages it processes.

    Attributes:
        ratio: retries allowed per message processed (``0.1``: at most one retry per ten).
        min_per_s: retries always allowed per second, so a quiet lane can still retry.
    """

    ratio: float = Field(default=0.1, gt=0, le=1)
    min_per_s: float = Field(default=1.0, ge=0)


class SojournPolicy(_Spec):
    """A CoDel-style limit on how long work may wait once a standing queue has formed.

    While the lane's waiting time (a message's age when its handler would start) has not
    dropped below ``target_ms`` at least once within ``interval_ms``, the queue is standing:
    messages that have waited longer than ``brief_ms`` are shed (counted, logged and handled as
    expired) until a message starts within the target again. Without a standing queue nothing
    is shed, however long a single burst takes.

    Attributes:
        target_ms: acceptable waiting time (YAML key ``target``).
        interval_ms: how long waiting must stay above the target to count as standing
            (YAML key ``interval``).
        brief_ms: how long newly arriving work may wait while the queue stands (YAML key
            ``brief``); defaults to ``target_ms``.
    """

    target_ms: Duration = Field(alias="target")
    interval_ms: Duration = Field(alias="interval")
    brief_ms: Duration = Field(
        default_factory=lambda data: data["target_ms"], alias="brief", validate_default=True
    )


class RetryPolicy(_Spec):
    """How a failed message is retried before it goes to the dead-letter topic.

    Attributes:
        tiers_ms: delay before each retry, strictly increasing (YAML key ``tiers``); each tier
            has its own topic, ``<name>.retry.<delay>``.
        max_attempts: deliveries in all, the first included, before the message is dead-lettered;
            defaults to one more than the number of tiers.
        after_dead_letter: on an ordered lane, what happens to the messages of a key parked
            behind a message that is dead-lettered: ``follow`` it into the dead-letter topic in
            order (a sequenced dead letter, the default) or ``proceed`` to their handler.
        poison_after: a message whose processing was interrupted (its worker killed) this many
            times is dead-lettered with reason ``poison`` instead of being run again; after the
            first interruption it runs alone, so only its own crashes count.
        budget: an optional retry budget (see :class:`RetryBudgetPolicy`).
    """

    tiers_ms: tuple[Duration, ...] = Field(default=(), alias="tiers")
    max_attempts: int = Field(
        default_factory=lambda data: len(data["tiers_ms"]) + 1, ge=1, strict=True
    )
    after_dead_letter: Literal["follow", "proceed"] = "follow"
    poison_after: int = Field(default=3, ge=1, strict=True)
    budget: RetryBudgetPolicy | None = None

    @field_validator("tiers_ms")
    @classmethod
    def _strictly_increasing(cls, tiers_ms: tuple[int, ...]) -> tuple[int, ...]:
        for index in range(1, len(tiers_ms)):
            if tiers_ms[index] <= tiers_ms[index - 1]:
                later = format_duration_ms(tiers_ms[index])
                earlier = format_duration_ms(tiers_ms[index - 1])
                raise ValueError(
                    f"must be strictly increasing: tiers[{index}] ({later}) is not longer than "
                    f"tiers[{index - 1}] ({earlier})"
                )
        return tiers_ms


class DebouncePolicy(_Spec):
    """How a lane coalesces a burst of one conversation's messages into one turn.

    Attributes:
        key: the event field naming the conversation (messages with the same value coalesce).
        quiet_s: a turn is due this long after the conversation's last message.
        max_wait_s: a turn is due at the latest this long after the burst's first message,
            however long the chatter goes on; at least ``quiet_s`` (default 30 s, or ``quiet_s``
            if that is longer).
        max_batch: most messages in one turn; a buffer this full makes a turn due at once.
    """

    key: StrictStr = Field(min_length=1)
    quiet_s: float = Field(gt=0)
    max_wait_s: float = Field(
        default_factory=lambda data: max(DEFAULT_MAX_WAIT_S, data["quiet_s"]), gt=0
    )
    max_batch: int = Field(default=100, ge=1, strict=True)

    @field_validator("max_wait_s")
    @classmethod
    def _not_below_quiet(cls, max_wait_s: float, info: ValidationInfo) -> float:
        quiet_s = info.data.get("quiet_s")
        if quiet_s is not None and max_wait_s < quiet_s:
            raise ValueError(f"must be at least quiet_s ({quiet_s}) (got {max_wait_s})")
        return max_wait_s


class BatchPolicy(_Spec):
    """A batch lane: its work runs on idle capacity only, and is promoted near its SLA.

    Attributes:
        idle_below: a batch message starts only while the member's handlers in use plus
            those queued are below this fraction of its concurrency limit, so interactive
            work always finds room and batch work yields to it.
        sla_ms: how soon after it was produced a batch message must be done (YAML key
            ``sla``).
        promote_at: the fraction of the SLA after which a waiting batch message is promoted:
            it starts like interactive work, so it still completes in time.
    """

    idle_below: float = Field(default=0.5, gt=0, le=1)
    sla_ms: Duration = Field(default=12 * 3_600_000, alias="sla")
    promote_at: float = Field(default=0.75, gt=0, lt=1)

    @property
    def promote_after_ms(self) -> int:
        """Age at which a waiting batch message is promoted."""
        return int(self.sla_ms * self.promote_at)


class TopicSpec(_Spec):
    """One topic declaration: the main topic, its retry tiers and its dead-letter topic.

    Attributes:
        name: the main topic's name.
        partitions: partition count of the main, retry and dead-letter topics.
        retention_ms: how long messages are kept (YAML key ``retention``); None keeps the
            broker's default.
        lane: the admission lane the topic's traffic is counted in; defaults to ``name``.
        ordered: whether messages of one key are handled one at a time, in order.
        max_len: Redis Streams only: approximate entries kept per partition stream; None uses
            the transport's default.
        retry: the retry tiers and attempt limit.
        dead_letter: the dead-letter topic's name; defaults to ``<name>.dlq``.
        configs: further Kafka topic configs, passed through to every derived topic.
        max_age_ms: a message older than this (since it was produced, or since its retry was
            due) is expired instead of handled (YAML key ``max_age``); a ``pl-deadline-ms``
            header set by the producer or the ingress can only shorten it.
        sojourn: an optional CoDel-style waiting limit (see :class:`SojournPolicy`).
        on_expiry: what happens to an expired or shed message: ``drop`` (counted and logged)
            or ``dead_letter`` (to the dead-letter topic with reason ``expired``).
        schema_subject: the registry subject whose latest Avro schema every webhook payload of
            this lane must match at the ingress (YAML key ``schema``); None checks nothing.
        throttle: the lane's admission policy (see :class:`ThrottlePolicy`), or None.
        debounce: the coalescing debouncer's policy (see :class:`DebouncePolicy`), or None.
        batch: makes it a batch lane (see :class:`BatchPolicy`); None for interactive work.
        offload: payloads above a size travel by reference to an object store
            (:class:`~pipeline.offload.policy.OffloadPolicy`); None keeps every payload inline.
        heartbeat_timeout_ms: makes it a lane of long work (YAML key ``heartbeat_timeout``):
            its runs are registered in Redis with their heartbeats, count towards the member's
            scale-in protection, and a run silent longer than this is hung: stopped, counted
            and retried or dead-lettered like a failure. None: no heartbeats are kept.
    """

    name: Annotated[TopicName, AfterValidator(_main_topic_name)]
    partitions: int = Field(ge=1, le=MAX_PARTITIONS, strict=True)
    retention_ms: Duration | None = Field(default=None, alias="retention")
    lane: StrictStr = Field(default_factory=lambda data: data["name"], validate_default=True)
    ordered: bool = True
    max_len: int | None = Field(default=None, ge=1, strict=True)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    dead_letter: TopicName = Field(
        default_factory=lambda data: f"{data['name']}.dlq",
        validate_default=True,
    )
    configs: Annotated[dict[StrictStr, StrictStr], BeforeValidator(_config_values)] = Field(
        default_factory=dict
    )
    max_age_ms: Duration | None = Field(default=None, alias="max_age")
    sojourn: SojournPolicy | None = None
    on_expiry: Literal["drop", "dead_letter"] = "drop"
    schema_subject: StrictStr | None = Field(default=None, alias="schema", min_length=1)
    throttle: ThrottlePolicy | None = None
    debounce: DebouncePolicy | None = None
    batch: BatchPolicy | None = None
    offload: OffloadPolicy | None = None
    heartbeat_timeout_ms: Duration | None = Field(default=None, alias="heartbeat_timeout", gt=0)

    @field_validator("lane")
    @classmethod
    def _identifier_like(cls, lane: str) -> str:
        if not _LANE.fullmatch(lane):
            raise ValueError(
                f"expected an identifier such as ai_turns (got {lane!r}); the default is the "
                "topic name, so set lane when the name has '.' or '-'"
            )
        return lane

    @field_validator("dead_letter", mode="before")
    @classmethod
    def _required_dead_letter(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None or value is False:
            raise ValueError("every topic has a dead-letter topic; omit the field for <name>.dlq")
        if value == info.data.get("name"):
            raise ValueError(f"must differ from the topic name (got {value!r})")
        return value

    @field_validator("configs")
    @classmethod
    def _no_retention_config(cls, configs: dict[str, str]) -> dict[str, str]:
        if "retention.ms" in configs:
            raise ValueError("set retention with the retention field, not retention.ms")
        return configs

    def retry_topic_names(self) -> list[str]:
        """Names of the retry tier topics, shortest delay first (``messages.retry.5s``, ...)."""
        return [f"{self.name}.retry.{format_duration_ms(t)}" for t in self.retry.tiers_ms]

    def topic_names(self) -> list[str]:
        """Every topic this declaration owns: main, retry tiers, then dead letter."""
        return [self.name, *self.retry_topic_names(), self.dead_letter]

    def topic_configs(self, default_max_len: int) -> list[TopicConfig]:
        """What the broker needs for the main, each retry tier and the dead-letter topic.

        All have the main topic's partition count, so a key maps to the same partition number
        on every hop. Retry topics keep the main retention; the dead-letter topic keeps at least
        :data:`DLQ_MIN_RETENTION_MS`, or the main retention if that is longer.

        Args:
            default_max_len: entries kept per Redis stream partition when ``max_len`` is unset.
        """
        max_len = self.max_len if self.max_len is not None else default_max_len

        def config(name: str, retention_ms: int | None) -> TopicConfig:
            return TopicConfig(
                name=name,
                partitions=self.partitions,
                retention_ms=retention_ms,
                max_len=max_len,
                configs=dict(self.configs),
            )

        dlq_retention_ms = max(DLQ_MIN_RETENTION_MS, self.retention_ms or 0)
        return [
            config(self.name, self.retention_ms),
            *(config(name, self.retention_ms) for name in self.retry_topic_names()),
            config(self.dead_letter, dlq_retention_ms),
        ]


def load_specs(directory: Path) -> list[TopicSpec]:
    """Load every ``*.yaml`` and ``*.yml`` declaration in ``directory``, sorted by file name.

    Raises:
        TopicSpecError: the directory is missing or has no declarations, a file is invalid
            (the message names the file and the field), or two files declare the same topic
            (including derived retry and dead-letter topics; the message names both files).
    """
    if not directory.is_dir():
        raise TopicSpecError(f"{directory}: topic directory not found")
    paths = sorted(
        (path for path in directory.iterdir() if path.suffix in {".yaml", ".yml"}),
        key=lambda path: path.name,
    )
    if not paths:
        raise TopicSpecError(f"{directory}: no topic declarations (*.yaml, *.yml) found")
    specs = [load_spec(path) for path in paths]
    _check_unique(paths, specs)
    return specs


def load_spec(path: Path) -> TopicSpec:
    """Load one declaration file.

    Raises:
        TopicSpecError: the file cannot be read, is not YAML (the message gives the line), is
            not a mapping, or fails validation; every line names the file and the field.
    """
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise TopicSpecError(f"{path}: cannot read: {exc}") from exc
    except yaml.YAMLError as exc:
        raise TopicSpecError(f"{path}: {_describe_yaml_error(exc)}") from exc
    if not isinstance(document, dict):
        found = "an empty document" if document is None else f"a {type(document).__name__}"
        raise TopicSpecError(f"{path}: expected a mapping such as 'name: ...', got {found}")
    try:
        return TopicSpec.model_validate(document)
    except ValidationError as exc:
        # A default computed from other fields (lane, dead_letter, max_attempts) is skipped when
        # any field failed; pydantic reports that as an error of its own, which is only noise.
        problems = [e for e in exc.errors() if e["type"] != "default_factory_not_called"]
        raise TopicSpecError("\n".join(f"{path}: {_describe(e)}" for e in problems)) from None


def _describe_yaml_error(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: invalid YAML: {exc.problem}"
    return f"invalid YAML: {exc}"


def _describe(error: ErrorDetails) -> str:
    loc = error["loc"]
    if error["type"] == "missing":
        problem = "required field is missing"
    elif error["type"] == "extra_forbidden":
        model: type[_Spec] = TopicSpec
        if loc[:1] == ("retry",) and len(loc) == 2:  # noqa: PLR2004
            model = RetryPolicy
        if loc[:1] == ("debounce",) and len(loc) == 2:  # noqa: PLR2004
            model = DebouncePolicy
        if loc[:1] == ("offload",) and len(loc) == 2:  # noqa: PLR2004
            model = OffloadPolicy  # type: ignore[assignment]
        fields = ", ".join(field.alias or name for name, field in model.model_fields.items())
        problem = f"unknown field (expected one of: {fields})"
    elif error["type"] == "value_error":
        problem = str(error.get("ctx", {}).get("error", error["msg"]))
    else:
        problem = f"{error['msg'][:1].lower()}{error['msg'][1:]} (got {error['input']!r})"
    return f"{field_path(loc)}: {problem}" if loc else problem


def _check_unique(paths: Sequence[Path], specs: Sequence[TopicSpec]) -> None:
    owners: dict[str, tuple[Path, str]] = {}
    for path, spec in zip(paths, specs, strict=True):
        fields = ["name"] + [f"retry.tiers[{i}]" for i in range(len(spec.retry.tiers_ms))]
        for topic, field in zip(spec.topic_names(), [*fields, "dead_letter"], strict=True):
            if topic in owners:
                other_path, other_field = owners[topic]
                raise TopicSpecError(
                    f"{path}: {field}: duplicate topic {topic!r}, "
                    f"already declared by {other_path} ({other_field})"
                )
            owners[topic] = (path, field)

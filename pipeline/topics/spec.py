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
import types
import typing
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipeline.config import ENV_PREFIX, Settings
from pipeline.errors import TopicSpecError
from pipeline.offload.policy import OffloadPolicy, format_size_bytes
from pipeline.topics.durations import Duration, format_duration_ms, parse_duration_ms
from pipeline.topics.policies import (
    AdaptivePolicy,
    BatchPolicy,
    DebouncePolicy,
    RetryBudgetPolicy,
    RetryPolicy,
    SojournPolicy,
    SpecModel,
    ThrottlePolicy,
)
from pipeline.transport.protocol import TopicConfig
from pipeline.validation import field_path

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from pydantic_core import ErrorDetails

__all__ = [
    "DLQ_MIN_RETENTION_MS",
    "INLINE_HEADROOM_BYTES",
    "AdaptivePolicy",
    "BatchPolicy",
    "DebouncePolicy",
    "RetryBudgetPolicy",
    "RetryPolicy",
    "SojournPolicy",
    "ThrottlePolicy",
    "TopicSpec",
    "UniqueKeyLoader",
    "describe_yaml_error",
    "format_duration_ms",
    "load_declared",
    "load_spec",
    "load_specs",
    "parse_duration_ms",
    "read_yaml",
]

DLQ_MIN_RETENTION_MS = 14 * 86_400_000
"""Dead letters wait for a human; keep them at least two weeks whatever the main retention."""
MAX_RETENTION_MS = 2**63 - 1
"""Kafka's ``retention.ms`` is a signed 64-bit count of milliseconds."""
MAX_NAME_LENGTH = 200
MAX_DOCUMENT_VALUES = 10_000
"""Most values a declaration holds once its YAML aliases are expanded (a real one has dozens):
a few hundred bytes of nested aliases expand to billions, which validation and its error
messages would walk and print."""
MAX_PARTITIONS = 10_000
DEFAULT_MAX_MESSAGE_BYTES: int = Settings.model_fields["max_message_bytes"].default
"""``PIPELINE_MAX_MESSAGE_BYTES`` when it is not set: the limit a declaration is checked against
when neither it (``configs: {max.message.bytes: ...}``) nor its loader gives one."""
INLINE_HEADROOM_BYTES = 16_384
"""What an inline payload leaves under the message limit for the event's key and headers (the
ingress's ``HEADROOM_BYTES``): an offloading lane's ``above`` is at most the limit less this."""

_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_LANE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _topic_name(value: str) -> str:
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"at most {MAX_NAME_LENGTH} characters (got {len(value)})")
    if value in {".", ".."}:
        raise ValueError(f"'.' and '..' are not topic names (got {value!r})")
    if not _TOPIC_NAME.fullmatch(value):
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


TopicName = Annotated[StrictStr, AfterValidator(_topic_name)]


class TopicSpec(SpecModel):
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

    @model_validator(mode="after")
    def _turns_run_outside_the_lane_stages(self) -> TopicSpec:
        if self.debounce is None:
            return self
        stages = {
            "throttle": self.throttle,
            "batch": self.batch,
            "heartbeat_timeout": self.heartbeat_timeout_ms,
        }
        given = [name for name, value in stages.items() if value is not None]
        if given:
            raise ValueError(
                f"debounce: cannot be combined with {', '.join(given)} (a debounced message"
                " is only recorded there; its turn runs later, outside them)"
            )
        return self

    @field_validator("retention_ms")
    @classmethod
    def _retention_kafka_holds(cls, retention_ms: int | None) -> int | None:
        if retention_ms is not None and retention_ms > MAX_RETENTION_MS:
            raise ValueError(
                f"must be at most {MAX_RETENTION_MS} ms (Kafka's retention.ms is a 64-bit count;"
                f" got {format_duration_ms(retention_ms)})"
            )
        return retention_ms

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
        max_bytes = configs.get("max.message.bytes")
        if max_bytes is not None and not re.fullmatch(r"[0-9]+", max_bytes):
            raise ValueError(
                "max.message.bytes: expected a whole number of bytes, e.g. 2097152"
                f" (got {max_bytes!r})"
            )
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
        on every hop. A retry topic keeps the main retention, or twice its tier's delay if that
        is longer (with a main retention shorter than a tier's delay, its copies would be
        deleted before they are due); the dead-letter topic keeps at least
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
        main_ms = self.retention_ms
        return [
            config(self.name, main_ms),
            *(
                config(
                    name,
                    None if main_ms is None else min(max(main_ms, 2 * delay_ms), MAX_RETENTION_MS),
                )
                for name, delay_ms in zip(
                    self.retry_topic_names(), self.retry.tiers_ms, strict=True
                )
            ),
            config(self.dead_letter, dlq_retention_ms),
        ]


def load_specs(directory: Path, max_message_bytes: int | None = None) -> list[TopicSpec]:
    """Load every ``*.yaml`` and ``*.yml`` declaration in ``directory``, sorted by file name.

    Args:
        directory: the declarations' directory.
        max_message_bytes: the process's ``PIPELINE_MAX_MESSAGE_BYTES``, when the caller has
            it: an offloading lane's ``above`` is checked against it (see :func:`load_spec`).

    Raises:
        TopicSpecError: as :func:`load_declared`.
    """
    return list(load_declared(directory, max_message_bytes).values())


def load_declared(directory: Path, max_message_bytes: int | None = None) -> dict[Path, TopicSpec]:
    """Every declaration in ``directory`` by the file it came from, sorted by file name.

    ``max_message_bytes`` as in :func:`load_specs`.

    Raises:
        TopicSpecError: the directory is missing or has no declarations, a file is invalid
            (the message names the file and the field), or two files declare the same topic
            (including derived retry and dead-letter topics) or the same lane (the message
            names both files).
    """
    if not directory.is_dir():
        raise TopicSpecError(
            f"{directory}: topic directory not found (run in the project's directory,"
            f" or set {ENV_PREFIX}TOPICS_DIR)"
        )
    paths = sorted(
        (path for path in directory.iterdir() if path.suffix in {".yaml", ".yml"}),
        key=lambda path: path.name,
    )
    if not paths:
        raise TopicSpecError(f"{directory}: no topic declarations (*.yaml, *.yml) found")
    specs = [load_spec(path, max_message_bytes) for path in paths]
    _check_unique(paths, specs)
    return dict(zip(paths, specs, strict=True))


def load_spec(path: Path, max_message_bytes: int | None = None) -> TopicSpec:
    """Load one declaration file.

    An offloading lane keeps payloads up to its ``above`` inline, so ``above`` plus
    :data:`INLINE_HEADROOM_BYTES` must fit the topic's message limit: the least of its own
    ``configs: {max.message.bytes: ...}`` and ``max_message_bytes`` (the process's
    ``PIPELINE_MAX_MESSAGE_BYTES``, which every command passes). Otherwise every payload between
    the limit and ``above`` could never be produced. With neither given (an :class:`App` loading
    a directory, which has no settings) it is not checked: the default limit would refuse a
    lane a deployment with a raised ``PIPELINE_MAX_MESSAGE_BYTES`` runs.

    Raises:
        TopicSpecError: the file cannot be read, is not YAML (the message gives the line), is
            not a mapping, fails validation, or offloads above what the topic takes inline;
            every line names the file and the field.
    """
    document = read_yaml(path, TopicSpecError)
    if not isinstance(document, dict):
        found = "an empty document" if document is None else f"a {type(document).__name__}"
        raise TopicSpecError(f"{path}: expected a mapping such as 'name: ...', got {found}")
    try:
        spec = TopicSpec.model_validate(document)
    except ValidationError as exc:
        # A default computed from other fields (lane, dead_letter, max_attempts) is skipped when
        # any field failed; pydantic reports that as an error of its own, which is only noise.
        problems = [e for e in exc.errors() if e["type"] != "default_factory_not_called"]
        raise TopicSpecError("\n".join(f"{path}: {_describe(e)}" for e in problems)) from None
    _check_offload_fits(path, spec, max_message_bytes)
    return spec


def _check_offload_fits(path: Path, spec: TopicSpec, max_message_bytes: int | None) -> None:
    """Refuse an ``offload.above`` whose inline payloads the topic's message limit cannot take."""
    if spec.offload is None:
        return
    declared = spec.configs.get("max.message.bytes")
    limits: dict[str, int] = {}
    if declared is not None:
        limits["its configs max.message.bytes"] = int(declared)
    if max_message_bytes is not None:
        limits["PIPELINE_MAX_MESSAGE_BYTES"] = max_message_bytes
    if not limits:  # the process's limit unknown here (an App given a directory): not judged
        return
    source, limit = min(limits.items(), key=lambda item: item[1])
    above = spec.offload.above_bytes
    largest = limit - INLINE_HEADROOM_BYTES
    if above <= largest:
        return
    advice = (
        f"lower above to at most {largest} bytes ({format_size_bytes(largest)}), leaving"
        f" {INLINE_HEADROOM_BYTES} bytes for the event's key and headers"
        if largest > 0
        else f"raise max.message.bytes above the {INLINE_HEADROOM_BYTES} bytes kept for the"
        " event's key and headers"
    )
    raise TopicSpecError(
        f"{path}: offload.above: lane {spec.lane!r} offloads only payloads above"
        f" {format_size_bytes(above)} ({above} bytes), but the topic's max message bytes is"
        f" {limit} ({source}): a payload between the two could never be produced; {advice}"
        " (docs/offload.md)"
    )


def read_yaml(path: Path, error: Callable[[str], Exception], where: str = "") -> Any:
    """The YAML document of a file the user wrote: keys unique, aliases bounded.

    Every failure is ``error`` of one line naming ``path`` (and ``where``, e.g. "(the limit
    policy, PIPELINE_...)"): the file cannot be read or is no UTF-8, is not YAML (its line and
    column, never its text, which may hold a secret), gives a key twice in one mapping, or holds
    more than :data:`MAX_DOCUMENT_VALUES` values once its aliases are expanded (a few hundred
    bytes of nested aliases expand to billions, which validation and its messages would walk).
    """
    suffix = f" {where}" if where else ""
    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot read{suffix}: {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: {describe_yaml_error(exc)}{suffix}") from None
    if _exceeds(document, MAX_DOCUMENT_VALUES):
        raise error(
            f"{path}: more than {MAX_DOCUMENT_VALUES} values once its YAML aliases are"
            f" expanded{suffix}: write it out without nesting aliases"
        )
    return document


def _exceeds(document: Any, most: int) -> bool:
    """Whether ``document`` holds more than ``most`` values, counting an aliased one each time."""
    pending = [document]
    count = 0
    while pending:
        value = pending.pop()
        count += 1
        if count > most:
            return True
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return False


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses a key given twice in one mapping.

    YAML requires unique keys; PyYAML would keep the last value and drop the first unsaid.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """The mapping of ``node``; a key it gives twice is a ``ConstructorError`` at its line."""
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` may be overridden by the keys beside it
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
            except TypeError:
                continue  # an unhashable key: construction below reports it
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """``line L, column C: invalid YAML: <problem>``, without the file's text around it."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: invalid YAML: {exc.problem}"
    return f"invalid YAML: {exc}"


def _describe(error: ErrorDetails) -> str:
    loc = error["loc"]
    if error["type"] == "missing":
        problem = "required field is missing"
    elif error["type"] == "extra_forbidden":
        model = _section_model(loc[:-1])
        if model is None:
            problem = "unknown field"
        else:
            fields = ", ".join(field.alias or name for name, field in model.model_fields.items())
            problem = f"unknown field (expected one of: {fields})"
    elif error["type"] == "value_error":
        problem = str(error.get("ctx", {}).get("error", error["msg"]))
    else:
        problem = f"{error['msg'][:1].lower()}{error['msg'][1:]} (got {error['input']!r})"
    return f"{field_path(loc)}: {problem}" if loc else problem


def _section_model(path: Sequence[int | str]) -> type[BaseModel] | None:
    """The model of the section at ``path`` (``("throttle", "adaptive", "dep:x")``), if any."""
    annotation: Any = TopicSpec
    for part in path:
        annotation = _without_none(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            fields = annotation.model_fields
            found = [f for name, f in fields.items() if part in (name, f.alias)]
            if not found:
                return None
            annotation = found[0].annotation
        elif typing.get_origin(annotation) is dict:  # ``part`` is a key: its value's model
            annotation = typing.get_args(annotation)[1]
        elif typing.get_origin(annotation) in (tuple, list):  # ``part`` is an index
            annotation = typing.get_args(annotation)[0]
        else:
            return None
    annotation = _without_none(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _without_none(annotation: Any) -> Any:
    """``X`` of ``X | None``; any other annotation unchanged."""
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


def check_lanes(specs: Sequence[TopicSpec], origins: Sequence[str] | None = None) -> None:
    """Refuse two topics of one lane: a consumer serves one topic a lane.

    ``origins`` names where each spec came from (its file), for the message.

    Raises:
        TopicSpecError: two specs declare the same lane (the message names both).
    """
    names = origins if origins is not None else [f"topic {spec.name!r}" for spec in specs]
    seen: dict[str, str] = {}
    for origin, spec in zip(names, specs, strict=True):
        if spec.lane in seen:
            raise TopicSpecError(
                f"{origin}: lane: duplicate lane {spec.lane!r}, already declared by"
                f" {seen[spec.lane]} (a consumer serves one topic a lane: give each its own)"
            )
        seen[spec.lane] = origin


def _check_unique(paths: Sequence[Path], specs: Sequence[TopicSpec]) -> None:
    owners: dict[str, tuple[Path, str]] = {}
    kafka_names: dict[str, tuple[str, Path, str]] = {}  # Kafka refuses names equal but for . and _
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
            other_topic, other_path, other_field = kafka_names.setdefault(
                topic.replace(".", "_"), (topic, path, field)
            )
            if other_topic != topic:
                raise TopicSpecError(
                    f"{path}: {field}: topic {topic!r} collides with {other_topic!r} of"
                    f" {other_path} ({other_field}): Kafka treats '.' and '_' in topic names"
                    " alike; rename one of them"
                )
    check_lanes(specs, [str(path) for path in paths])

"""The policies a topic declaration may carry, one model each.

Retry tiers and poison detection (:class:`RetryPolicy`), the retry budget, standing-queue
shedding (:class:`SojournPolicy`), the throttle with its adaptive keys, the debouncer and batch
lanes. :class:`~pipeline.topics.spec.TopicSpec` holds them; ``docs/topics.md`` documents every
field.
"""

from __future__ import annotations

import string
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipeline.topics.durations import (
    MAX_REDIS_DURATION_MS,
    Duration,
    RedisDuration,
    format_duration_ms,
)

__all__ = [
    "AdaptivePolicy",
    "BatchPolicy",
    "DebouncePolicy",
    "RetryBudgetPolicy",
    "RetryPolicy",
    "SojournPolicy",
    "SpecModel",
    "ThrottlePolicy",
]

DEFAULT_MAX_WAIT_S = 30.0
"""A debounced lane's default maximum wait for a turn, when ``max_wait_s`` is not given."""


class SpecModel(BaseModel):
    """The base of every declaration model: unknown fields are errors, and models are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AdaptivePolicy(SpecModel):
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
    cooldown_ms: RedisDuration = Field(default=1_000, alias="cooldown")

    @model_validator(mode="after")
    def _bounds(self) -> AdaptivePolicy:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class ThrottlePolicy(SpecModel):
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
    lease_ms: RedisDuration = Field(default=60_000, alias="lease", ge=30)
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
                fields = list(string.Formatter().parse(template))
            except ValueError as exc:
                raise ValueError(f"bad key template {template!r}: {exc}") from None
            before: str | None = None
            for text, name, spec, conversion in fields:
                # A message's values fill the fields at run time: an index, attribute, format
                # spec or conversion could raise there, on a value the check never saw.
                if name is not None and (spec or conversion or not name.isidentifier()):
                    raise ValueError(
                        f"bad key template {template!r}: only plain fields such as {{tenant}}"
                        f" are allowed, not {{{name}{'!' + conversion if conversion else ''}"
                        f"{':' + spec if spec else ''}}}"
                    )
                if name is not None and before is not None and not text:
                    # tenant "ab" with customer "c" and tenant "a" with "bc" would share a key
                    raise ValueError(
                        f"bad key template {template!r}: put text between {{{before}}} and"
                        f" {{{name}}} (such as /), or two messages could share one key"
                    )
                before = name
        return keys


class RetryBudgetPolicy(SpecModel):
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


class SojournPolicy(SpecModel):
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


class RetryPolicy(SpecModel):
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

    tiers_ms: tuple[RedisDuration, ...] = Field(default=(), alias="tiers")
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


class DebouncePolicy(SpecModel):
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

    @field_validator("quiet_s", "max_wait_s")
    @classmethod
    def _within_redis_range(cls, seconds: float) -> float:
        if not seconds <= MAX_REDIS_DURATION_MS / 1000:  # also refuses .inf and .nan
            longest_s = MAX_REDIS_DURATION_MS // 1000
            raise ValueError(
                f"must be at most 365d ({longest_s} s): Redis expiries are made from it "
                f"(got {seconds})"
            )
        return seconds

    @field_validator("max_wait_s")
    @classmethod
    def _not_below_quiet(cls, max_wait_s: float, info: ValidationInfo) -> float:
        quiet_s = info.data.get("quiet_s")
        if quiet_s is not None and max_wait_s < quiet_s:
            raise ValueError(f"must be at least quiet_s ({quiet_s}) (got {max_wait_s})")
        return max_wait_s


class BatchPolicy(SpecModel):
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

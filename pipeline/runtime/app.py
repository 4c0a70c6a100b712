"""Handlers registered per lane, and how a message of a lane's topics reaches its handler.

::

    app = App()                       # reads $PIPELINE_TOPICS_DIR/*.yaml (default topics/)

    @app.handler("messages")
    async def handle(event: MessageReceived, ctx: Context) -> None:
        ...

The first parameter's annotation decides decoding: a pydantic model is validated from the
value, Avro in the Confluent wire format (through the schema registry) or JSON (a validation
error is not retried: the message goes to the dead-letter topic); ``dict`` (``dict[str, Any]``,
``Mapping[str, Any]``) gets the value parsed as a JSON object and ``str`` the value as UTF-8
text (a value that is neither is a validation error, dead-lettered alike); ``bytes`` gets the
raw value (so do ``bytes | None``, ``Any``, ``object`` and no annotation; a ``LazyPayload``
handler an offloaded one unread), :class:`~pipeline.envelope.Message` the whole message. Any
other type (a dataclass, a TypedDict, ``int``, ``Model | None``) is a :class:`ConfigError` when
the handler is registered: it would be handed the raw bytes, and fail on every message.

A lane declared with ``debounce:`` hands its handler a *turn*: ``list[Model]`` (or
``list[dict]``, ``list[str]``, ``list[bytes]``, ``list[Message]``), every message of one
conversation since its last turn, in order, each decoded as one event is
(:mod:`pipeline.runtime.turns`)::

    @app.handler("ai_turns")
    async def reply(events: list[MessageReceived], ctx: Context) -> None:
        ...
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import types
import typing
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError
from redis.asyncio import Redis

from pipeline.cancel import Target, cancel
from pipeline.config import topics_dir
from pipeline.envelope import Message
from pipeline.errors import ConfigError, DeadLetter
from pipeline.event_bodies import body_kind
from pipeline.offload.lazy import LazyPayload
from pipeline.registry.client.wire import HEADER_BYTES, MAGIC_BYTE, schema_id_of
from pipeline.registry.errors import SerdeError
from pipeline.retry.policy import Backoff, Retryable, default_retryable
from pipeline.retry.router import LaneRoutes
from pipeline.runtime.context import Context
from pipeline.runtime.cpu import function_ref
from pipeline.topics.spec import TopicSpec, check_lanes, load_declared

Handler = Callable[[Any, Context], Awaitable[None]]
M = TypeVar("M", bound=BaseModel)
_AVRO_MAGIC = b"\x00"


@dataclass(frozen=True, slots=True)
class Lane:
    """A lane's declaration, its handler and where its failures go."""

    name: str
    spec: TopicSpec
    handler: Handler
    decode: Callable[[Message], Any]
    routes: LaneRoutes
    cpu_ref: str | None = None
    """For a CPU-bound handler, its ``module:qualname`` (it runs in the process pool)."""
    time_limit_s: float = 30.0
    turns: bool = False
    """The handler takes a turn (a list of events) of a debounced lane."""
    event: Any = bytes
    """The handler's event annotation, resolved (a turn's items if ``turns``)."""

    @property
    def topics(self) -> list[str]:
        """The topics a member of this lane consumes: the main topic and its retry tiers."""
        return [self.spec.name, *self.spec.retry_topic_names()]


def _underlying(handler: Any) -> Any:
    """The function a handler runs: through partials, bound methods, decorators, ``__call__``."""
    target = handler
    for _ in range(32):  # a chain of wrappers, not a cycle
        if isinstance(target, functools.partial):
            target = target.func
        elif inspect.ismethod(target):
            target = target.__func__
        elif hasattr(target, "__wrapped__"):
            target = target.__wrapped__
        elif not inspect.isfunction(target) and not isinstance(target, type) and callable(target):
            target = type(target).__call__
        else:
            break
    return target


def _name(handler: Any) -> str:
    """The handler's name for a line about it (a partial or an object by its function's)."""
    name = getattr(handler, "__qualname__", None)
    return (
        name
        if isinstance(name, str)
        else getattr(_underlying(handler), "__qualname__", repr(handler))
    )


def _is_async(handler: Any) -> bool:
    """Whether awaiting ``handler(event, ctx)`` works: an ``async def``, or an object's one."""
    if inspect.iscoroutinefunction(handler):  # a partial or a bound method of one as well
        return True
    if inspect.isroutine(handler) or isinstance(handler, functools.partial):
        return False
    return callable(handler) and inspect.iscoroutinefunction(type(handler).__call__)


def _resolved(annotation: Any, handler: Any, lane: str, scope: dict[str, Any]) -> Any:
    """``annotation`` (a string under ``from __future__ import annotations``) as a type.

    Names resolve in the handler's module, else in ``scope`` (the locals where it was
    registered: a model defined in the same function).

    Raises:
        ConfigError: a name defined in neither (imported only under ``TYPE_CHECKING``, or
            defined after the handler): the runtime would not know what to decode into.
    """
    holder = types.SimpleNamespace(__annotations__={"event": annotation})
    module: dict[str, Any] = getattr(_underlying(handler), "__globals__", {})
    try:
        return typing.get_type_hints(holder, module)["event"]
    except NameError:
        pass
    try:
        return typing.get_type_hints(holder, module, scope)["event"]
    except NameError as exc:
        raise ConfigError(
            f"handler {_name(handler)} of lane {lane!r}: its event annotation {annotation!r}"
            f" names {exc.name!r}, which is not defined in its module at runtime (imported only"
            " under TYPE_CHECKING, or defined after the handler): the runtime decodes each"
            f" event by that type, so import or define {exc.name} before the handler"
        ) from None


def _event_kind(handler: Handler, lane: str, scope: dict[str, Any]) -> tuple[Any, bool]:
    """The annotation of the handler's event parameter, and whether it takes a list (a turn).

    Only the event's annotation is resolved: the runtime reads no other (``ctx: Context``
    may be imported only for type checking).
    """
    params = list(inspect.signature(handler).parameters.values())
    if len(params) != 2:  # noqa: PLR2004 - (event, ctx)
        raise ConfigError(f"handler {_name(handler)} must take (event, ctx)")
    annotation = params[0].annotation
    kind = (
        bytes
        if annotation is inspect.Parameter.empty
        else _resolved(annotation, handler, lane, scope)
    )
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind) or (bytes,)
        return item, True
    return kind, False


def _readable_fields(model: type[BaseModel]) -> list[str]:
    """The names an event of ``model`` answers with a value: its fields and computed fields."""
    return [*model.model_fields, *model.model_computed_fields]


def _reads_key(model: type[BaseModel], key: str) -> bool:
    """Whether an event of ``model`` can have a value for ``key`` (an attribute read)."""
    if key in _readable_fields(model):
        return True
    attribute = inspect.getattr_static(model, key, None)
    if isinstance(attribute, (property, functools.cached_property)):
        return True
    # A model that keeps extra fields may hold any key not shadowed by one of its attributes.
    return attribute is None and model.model_config.get("extra") == "allow"


def _key_problem(model: type[BaseModel], key: str) -> str | None:
    """Why ``debounce.key`` cannot name a conversation of ``model``'s events; None: it can."""
    if _reads_key(model, key):
        return None
    fields = ", ".join(_readable_fields(model)) or "none"
    aliases = [
        name
        for name, info in model.model_fields.items()
        if key in (info.alias, info.validation_alias)
    ]
    hint = ""
    if aliases:
        hint = f" ({key!r} is the alias of its field {aliases[0]!r}: give the field's name)"
    elif "." in key or "/" in key:
        hint = " (it names a top-level field of the event, not a path into it)"
    return f"{key!r} is no field of {model.__qualname__}{hint} (its fields: {fields})"


class ModelDecoder(Protocol):
    """Turns a framed Avro value into a model (``registry.client.serde.AvroDeserializer``)."""

    def to_model(self, data: bytes, model: type[M]) -> M:
        """The record in ``data`` as ``model``."""
        ...


_RAW: tuple[Any, ...] = (bytes, LazyPayload, Any, object)
"""Annotations of an event handed the raw value (an offloaded one as a ``LazyPayload``)."""

JSON_OBJECT: TypeAdapter[dict[str, Any]] = TypeAdapter(
    dict[str, Any], config=ConfigDict(title="the event's value as a JSON object")
)
"""Decodes an event annotated ``dict``: the value parsed as a JSON object, else a
``ValidationError`` saying what it is (not JSON, an array, nested too deep ...)."""
TEXT: TypeAdapter[str] = TypeAdapter(
    str, config=ConfigDict(title="the event's value as UTF-8 text")
)
"""Decodes an event annotated ``str``: the value as UTF-8 text, else a ``ValidationError``."""


def body_adapter(kind: Any) -> TypeAdapter[Any] | None:
    """How an event annotated ``kind`` is decoded from the value, if it is ``dict`` or ``str``.

    :data:`JSON_OBJECT` for ``dict``, ``dict[str, Any]``, ``Mapping[str, Any]`` (bare or with
    ``object`` for ``Any``), :data:`TEXT` for ``str``; None for anything else (``dict[str, int]``
    and ``dict | None`` too: the runtime does not decode into them).
    """
    body = body_kind(kind)
    if body == "text":
        return TEXT
    if body == "object":
        return JSON_OBJECT
    return None


def _decodes_into(kind: Any) -> bool:
    """Whether an event annotated ``kind`` gets what it says: a model, a JSON object, text ...

    Anything else (a dataclass, a TypedDict, ``int``, ``Model | None``) would be handed the
    raw bytes, and its handler fail on every message.
    """
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return True
    if body_adapter(kind) is not None:
        return True
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        # ``bytes | None`` (``Optional[bytes]``) is handed bytes as ``bytes`` is; a model or the
        # message among the options would not be.
        options = [option for option in typing.get_args(kind) if option is not type(None)]
        return all(any(option is raw for raw in _RAW) for option in options)
    return kind is Message or any(kind is raw for raw in _RAW)


def _shown(kind: Any) -> str:
    """``kind`` as written in a handler's annotation."""
    if isinstance(kind, type) and not typing.get_args(kind):
        return kind.__qualname__
    return repr(kind).replace("typing.", "")


def _refusal(lane: str, handler: Handler, kind: Any, turns: bool) -> str:
    """The line refusing ``handler`` of ``lane``, whose event (or turn's) is ``kind``."""
    name = _shown(kind)
    shown = f"list[{name}]" if turns else name
    what = "a turn annotated" if turns else "an event annotated"
    of = f"{name} is " if turns else ""
    if dataclasses.is_dataclass(kind):
        shown, hint = f"{shown} ({of}a dataclass)", "; for a dataclass, a BaseModel of its fields"
    elif typing.is_typeddict(kind):
        shown, hint = f"{shown} ({of}a TypedDict)", "; for a TypedDict, a BaseModel of its keys"
    else:
        hint = ""
    items = " its items" if turns else " it"
    return (
        f"handler {_name(handler)} of lane {lane!r} takes {what} {shown}, which the"
        " runtime does not decode into: it would be handed each message's raw bytes and fail"
        f" on every one, to the dead-letter topic; annotate{items} with a pydantic model"
        " (validated from JSON or Avro), dict[str, Any] (a JSON object), str (UTF-8 text),"
        f" bytes (the raw value), pipeline.envelope.Message or Any{hint}"
    )


def _check_event(
    lane: str, spec: TopicSpec, fn: Handler, *, cpu: bool, kind: Any, turns: bool
) -> None:
    """Refuse a handler whose event (``kind``, a turn's items if ``turns``) ``lane`` cannot give.

    Raises:
        ConfigError: a CPU-bound handler of a debounced lane, a turn on a lane that is not
            debounced (or one event on a lane that is), or a type the runtime does not decode
            into.
    """
    if cpu and spec.debounce is not None:
        raise ConfigError(f"lane {lane!r} is debounced: its handler cannot be cpu=True")
    if turns != (spec.debounce is not None) and not cpu:
        wants = "a list of events (it is debounced)" if spec.debounce else "one event"
        raise ConfigError(f"handler {_name(fn)} of lane {lane!r} must take {wants}")
    if not _decodes_into(kind):
        raise ConfigError(_refusal(lane, fn, kind, turns))


def _body(body: TypeAdapter[Any], kind: Any, message: Message) -> Any:
    """``message``'s value as ``body`` (:data:`JSON_OBJECT` or :data:`TEXT`) decodes it.

    Raises:
        pydantic.ValidationError: it is not one; an Avro-framed value (Confluent wire format)
            says so, with its schema id and what to do, not only that it is no JSON.
    """
    value = message.value
    try:
        return body.validate_json(value) if body is JSON_OBJECT else body.validate_python(value)
    except ValidationError as exc:
        if len(value) < HEADER_BYTES or value[0] != MAGIC_BYTE:
            raise
        framed = _avro_framed(value, kind, "text" if body is TEXT else "JSON")
        detail = InitErrorDetails(
            type=PydanticCustomError("avro_framed", framed), loc=(), input=value
        )
        raise ValidationError.from_exception_data(exc.title, [detail]) from exc


def _avro_framed(value: bytes, kind: Any, plain: str) -> str:
    """Why an Avro-framed ``value`` is not an event annotated ``kind``, and what to do."""
    return (
        f"the value is Avro in the Confluent wire format (schema id {schema_id_of(value)}),"
        f" which an event annotated {_shown(kind)} is not decoded from: annotate the handler's"
        " event with a pydantic model of the record, decoded through the schema registry at"
        f" PIPELINE_REGISTRY__URL (docs/registry.md), or have the producer send {plain}"
    )


def _decoder(app: App, kind: Any) -> Callable[[Message], Any]:
    """What ``Lane.decode`` does to a message for an event annotated ``kind`` (checked first).

    A value that does not decode raises (a ``pydantic.ValidationError``, a ``DeadLetter``): the
    message is dead-lettered, not retried.
    """
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        model = kind
        return lambda m: app.decode_model(m.value, model)
    body = body_adapter(kind)
    if body is not None:
        return functools.partial(_body, body, kind)
    if kind is Message:
        return lambda m: m
    return lambda m: m.value


class App:
    """The set of lanes one consumer group serves."""

    def __init__(
        self,
        topics: Path | str | Sequence[TopicSpec] | None = None,
        *,
        retryable: Retryable = default_retryable,
    ) -> None:
        """Read the lane declarations (a directory of yaml files, or specs directly).

        Without ``topics``, the directory every command reads: ``PIPELINE_TOPICS_DIR``
        (default ``topics``), so the lanes a member serves are the ones ``pipeline topics
        apply`` declared.
        """
        # Where the lanes were declared and how to declare another, for a line naming one not
        # declared: the directory actually read, which PIPELINE_TOPICS_DIR may have moved.
        self._declared_in, self._to_declare = "the specs given to App()", "pass its spec too"
        if topics is None:
            topics = topics_dir()
            self._to_declare = (
                "declare it in a yaml file there, or set PIPELINE_TOPICS_DIR to the directory"
                " that declares it"
            )
        elif isinstance(topics, (str, Path)):
            self._to_declare = "declare it in a yaml file there"
        if isinstance(topics, (str, Path)):
            self._declared_in = f"{Path(topics)}/"
        if isinstance(topics, (str, Path)):
            declared = load_declared(Path(topics))
            specs = list(declared.values())
            origins = {spec.lane: str(path) for path, spec in declared.items()}
        else:
            specs = list(topics)
            origins = {
                spec.lane: f"the specs given to App() (topic {spec.name!r})" for spec in specs
            }
        check_lanes(specs)
        self._specs = {spec.lane: spec for spec in specs}
        self._origins = origins
        """Where each lane was declared (its file), for a line about its declaration."""
        self.retryable = retryable
        self.avro: ModelDecoder | None = None
        """Decodes Avro values (Confluent wire format); ``pipeline consume`` sets it from the
        registry settings. JSON values are always accepted."""
        self.lanes: dict[str, Lane] = {}
        self._by_topic: dict[str, Lane] = {}

    def handler(
        self, lane: str, *, cpu: bool = False, time_limit_s: float = 30.0
    ) -> Callable[[Handler], Handler]:
        """Register the decorated ``async def handle(event, ctx)`` for ``lane``.

        With ``cpu=True`` the handler is a plain module-level ``def handle(event, ctx)`` that
        runs in a kill-able worker process (:mod:`pipeline.runtime.cpu`), killed and retried
        when it runs longer than ``time_limit_s``.

        On a debounced lane whose handler takes models, ``debounce.key`` must name a field of
        the model (or a computed field, a property, any key of a model that keeps extra
        fields): a misspelt key would leave every event without a conversation, and is a
        :class:`ConfigError` naming the lane's file, the key and the model's fields.

        An event (or a turn's items) annotated ``dict`` (``dict[str, Any]``, ``Mapping[str,
        Any]``) gets the value parsed as a JSON object, ``str`` the value as UTF-8 text; a value
        that is neither is a ``pydantic.ValidationError``, dead-lettered (``fatal``) as a
        model's. One annotated with a type the runtime does not decode into (a dataclass, a
        TypedDict, ``int`` ...) is a :class:`ConfigError` naming the lane, the handler, the
        annotation and what is decoded.
        """
        spec = self._specs.get(lane)
        if spec is None:
            raise ConfigError(self._undeclared(lane))

        def register(fn: Handler) -> Handler:
            # Where the handler is registered: a model defined in the same function resolves.
            scope = dict(sys._getframe(1).f_locals)  # noqa: SLF001 - the caller's namespace
            if cpu == _is_async(fn):
                form = "a plain `def` (cpu=True)" if cpu else "`async def`"
                raise ConfigError(f"handler {_name(fn)} must be {form}")
            if cpu and not inspect.isfunction(fn):
                raise ConfigError(
                    f"CPU-bound handler {_name(fn)} must be a module-level function of an"
                    " importable module (not a partial, a method or an object)"
                )
            try:
                cpu_ref = function_ref(fn) if cpu else None
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            kind, turns = _event_kind(fn, lane, scope)
            _check_event(lane, spec, fn, cpu=cpu, kind=kind, turns=turns)
            routes = LaneRoutes(
                topic=spec.name,
                retry_topics=tuple(spec.retry_topic_names()),
                dead_letter_topic=spec.dead_letter,
                max_attempts=spec.retry.max_attempts,
                backoff=Backoff(spec.retry.tiers_ms),
            )
            if spec.debounce is not None and isinstance(kind, type) and issubclass(kind, BaseModel):
                problem = _key_problem(kind, spec.debounce.key)
                if problem is not None:
                    raise ConfigError(
                        f"{self._origins[lane]}: debounce.key: lane {lane!r}, handler"
                        f" {_name(fn)}: {problem}, so no event would name its"
                        " conversation (each would go by its message key, or alone); set"
                        " debounce.key to the field that names the conversation"
                    )
            decode = _decoder(self, kind)
            entry = Lane(lane, spec, fn, decode, routes, cpu_ref, time_limit_s, turns, kind)
            self.lanes[lane] = entry
            for topic in entry.topics:
                self._by_topic[topic] = entry
            return fn

        return register

    def decode_model(self, value: bytes, model: type[M]) -> M:
        """``value`` as ``model``: Avro in the Confluent wire format (byte 0 first), else JSON.

        Raises:
            DeadLetter: an Avro value that does not fit its schema or the model, or an Avro
                value with no registry configured (neither gets better on a retry).
            pydantic.ValidationError: JSON that does not validate (dead-lettered as well).
        """
        if value[:1] != _AVRO_MAGIC:
            return model.model_validate_json(value)
        if self.avro is None:
            raise DeadLetter("an Avro message, but no schema registry is configured")
        try:
            return self.avro.to_model(value, model)
        except SerdeError as exc:
            raise DeadLetter(str(exc)) from exc

    async def cancel(
        self,
        redis: Redis,
        *,
        event: str | None = None,
        key: str | None = None,
        tenant: str | None = None,
        lane: str | None = None,
        reason: str = "cancelled",
        prefix: str = "pl",
    ) -> int:
        """Cancel the work of one event id, key or tenant (on ``lane`` only, if given).

        The same transition as ``pipeline cancel`` (:func:`pipeline.cancel.cancel`): queued,
        parked and retry-tier messages are skipped with outcome ``cancelled`` when they come
        up; running handlers are stopped. ``prefix`` is the members' ``redis.key_prefix``.
        It stands as long as the covered lanes (``lane``, or every lane of the app) can bring
        their work back (:func:`pipeline.cancel.transition.keep_ms_of`: their longest retention,
        a dead-letter topic's at least 14 days, plus the retry path).
        Returns how many running long-work runs were told to stop.

        Raises:
            ConfigError: not exactly one of ``event``, ``key``, ``tenant``, or an unknown lane.
            pipeline.cancel.CancelFailed: Redis did not record it.
        """
        if lane is not None and lane not in self._specs:
            raise ConfigError(self._undeclared(lane))
        target = Target.of(event=event, key=key, tenant=tenant, lane=lane)
        return await cancel(redis, prefix, target, reason, specs=self._specs.values())

    def _undeclared(self, lane: str) -> str:
        """The line for ``lane``, declared in none of the files read (it names the directory)."""
        known = ", ".join(sorted(self._specs)) or "none"
        return (
            f"no lane {lane!r} is declared in {self._declared_in} (declared: {known});"
            f" {self._to_declare}"
        )

    def lane_of(self, topic: str) -> Lane:
        """The lane a topic (main or retry tier) belongs to."""
        return self._by_topic[topic]

    def topics(self, lanes: Sequence[str] | None = None) -> list[str]:
        """Every topic to subscribe to for ``lanes`` (default: all registered lanes)."""
        chosen = lanes or sorted(self.lanes)
        if not chosen:  # a member of no lane would idle for ever, joined to nothing
            raise ConfigError(
                "the App has no handler: nothing to consume (register one with"
                ' @app.handler("<lane>") in the module `pipeline consume` names)'
            )
        missing = [lane for lane in chosen if lane not in self.lanes]
        if missing:
            raise ConfigError(f"no handler registered for lane(s) {', '.join(missing)}")
        return [topic for lane in chosen for topic in self.lanes[lane].topics]

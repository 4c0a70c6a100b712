"""Avro serdes against our registry: confluent-kafka's own and ours, in both directions."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer as ConfluentDeserializer
from confluent_kafka.schema_registry.avro import AvroSerializer as ConfluentSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext
from registry.samples import message

from pipeline.errors import DeadLetter
from pipeline.registry.canonical import parse
from pipeline.registry.client.events import SCHEMA_FILES, MessageReceivedRecord, model_mismatches
from pipeline.registry.client.http import RegistryClient
from pipeline.registry.client.serde import AvroDeserializer, AvroSerializer, JsonSerializer
from pipeline.registry.client.wire import header, schema_id_of
from pipeline.registry.errors import RegistryError, SerdeError, SubjectNotFound
from pipeline.retry.policy import default_retryable
from pipeline.runtime.app import App

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
V1 = json.dumps(
    {"type": "record", "name": "Ping", "namespace": "t", "fields": [{"name": "n", "type": "int"}]}
)
V2 = json.dumps(
    {
        "type": "record",
        "name": "Ping",
        "namespace": "t",
        "fields": [
            {"name": "n", "type": "long"},
            {"name": "note", "type": "string", "default": "none"},
        ],
    }
)
CTX = SerializationContext("pings", MessageField.VALUE)


@pytest.fixture
def confluent(sqlite_registry_url: str) -> Iterator[SchemaRegistryClient]:
    """confluent-kafka's registry client on our server."""
    client = SchemaRegistryClient({"url": sqlite_registry_url, "max.retries": 0})
    yield client
    client.close()


def test_confluent_serializer_round_trip(confluent: SchemaRegistryClient) -> None:
    """AvroSerializer auto-registers under {topic}-value; AvroDeserializer reads it back."""
    data = ConfluentSerializer(confluent, V1)({"n": 7}, CTX)
    assert data[:1] == b"\x00"
    assert confluent.get_latest_version("pings-value").schema_id == schema_id_of(data)
    assert ConfluentDeserializer(confluent)(data, CTX) == {"n": 7}


def test_auto_register_false_needs_a_registered_schema(confluent: SchemaRegistryClient) -> None:
    """With auto.register.schemas=False the serializer only looks the schema up."""
    serializer = ConfluentSerializer(confluent, V1, conf={"auto.register.schemas": False})
    with pytest.raises(SchemaRegistryError) as info:
        serializer({"n": 1}, CTX)
    assert info.value.error_code == 40401
    schema_id = confluent.register_schema("pings-value", Schema(V1, "AVRO"))
    fresh = ConfluentSerializer(confluent, V1, conf={"auto.register.schemas": False})
    assert schema_id_of(fresh({"n": 1}, CTX)) == schema_id


def test_use_latest_version(confluent: SchemaRegistryClient) -> None:
    """use.latest.version writes with the subject's latest id; the reader resolves into it."""
    confluent.register_schema("pings-value", Schema(V1, "AVRO"))
    latest_id = confluent.register_schema("pings-value", Schema(V2, "AVRO"))
    serializer = ConfluentSerializer(
        confluent, V2, conf={"auto.register.schemas": False, "use.latest.version": True}
    )
    data = serializer({"n": 3, "note": "x"}, CTX)
    assert schema_id_of(data) == latest_id
    old = ConfluentSerializer(confluent, V1, conf={"auto.register.schemas": False})({"n": 5}, CTX)
    reader = ConfluentDeserializer(confluent, conf={"use.latest.version": True})
    assert reader(old, CTX) == {"n": 5, "note": "none"}
    assert reader(data, CTX) == {"n": 3, "note": "x"}


def test_our_serde_and_confluent_serde_interoperate(
    confluent: SchemaRegistryClient, ours: RegistryClient
) -> None:
    """Our bytes equal confluent's for the same schema and record, and each reads the other."""
    theirs = ConfluentSerializer(confluent, V1)({"n": 42}, CTX)
    mine = AvroSerializer(ours, V1, "pings-value")({"n": 42})
    assert mine == theirs
    assert ConfluentDeserializer(confluent)(mine, CTX) == {"n": 42}
    assert AvroDeserializer(ours)(theirs) == {"n": 42}


def test_reader_schema_resolution(ours: RegistryClient) -> None:
    """A deserializer with a newer reader schema promotes types and fills defaults."""
    old = AvroSerializer(ours, V1, "pings-value")({"n": 9})
    assert AvroDeserializer(ours, reader_schema=V2)(old) == {"n": 9, "note": "none"}


def test_lookup_and_latest_modes(ours: RegistryClient) -> None:
    """Without auto-register the schema must exist; use_latest writes with the latest id."""
    with pytest.raises(SubjectNotFound):
        AvroSerializer(ours, V1, "p-value", auto_register=False)({"n": 1})
    first = ours.register("p-value", V1)
    assert AvroSerializer(ours, V1, "p-value", auto_register=False).schema_id == first
    second = ours.register("p-value", V2)
    latest = AvroSerializer(ours, V2, "p-value", auto_register=False, use_latest=True)
    assert schema_id_of(latest({"n": 1, "note": "y"})) == second


def test_pydantic_model_round_trip(ours: RegistryClient) -> None:
    """A MessageReceivedRecord model is written with its .avsc schema and read back equal."""
    schema = (SCHEMAS / "message_received.avsc").read_text()
    data = AvroSerializer(ours, schema, "pipeline.events.MessageReceived")(message())
    back = AvroDeserializer(ours).to_model(data, MessageReceivedRecord)
    assert back == message()
    assert AvroDeserializer(ours).deserialize(data)["received_at"] == message().received_at


def test_models_match_their_schema_files() -> None:
    """Every event model maps field for field onto its schemas/*.avsc record."""
    for model, filename in SCHEMA_FILES.items():
        assert model_mismatches(model, parse((SCHEMAS / filename).read_text())) == []
    wrong = parse(V1)
    assert model_mismatches(MessageReceivedRecord, wrong)


def test_json_mode_for_development(ours: RegistryClient) -> None:
    """JSON messages need no registry and are read by a deserializer that allows them."""
    data = JsonSerializer()(message())
    assert data.startswith(b"{")
    back = AvroDeserializer(ours, allow_json=True)(data)
    assert MessageReceivedRecord.model_validate(back) == message()
    assert JsonSerializer()({"a": 1}) == b'{"a":1}'


def test_bad_frames_and_values_raise_serde_errors(ours: RegistryClient) -> None:
    """Unframed data, a wrong magic byte, a short message or a bad value raise SerdeError."""
    deserializer = AvroDeserializer(ours)
    for bad in (b"", b"\x00\x00", b"\x01\x00\x00\x00\x01\x02", b'{"json": 1}'):
        with pytest.raises(SerdeError):
            deserializer(bad)
    with pytest.raises(SerdeError):
        AvroSerializer(ours, V1, "pings-value")({"n": "not an int"})
    schema_id = ours.register("pings-value", V1)
    with pytest.raises(SerdeError):
        deserializer(header(schema_id))  # framed, but the body is missing
    with pytest.raises(SerdeError):
        header(2**32)


def test_registry_down_at_first_sight_of_an_id_is_retried_not_dead_lettered() -> None:
    """A registry that does not answer when a message's schema id is new fails it retryably."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = RegistryClient(f"http://127.0.0.1:{port}", timeout_s=2)
    app = App(topics=[])
    app.avro = AvroDeserializer(client)
    with pytest.raises(Exception, match="cannot reach the schema registry") as info:
        app.decode_model(header(1) + b"\x02", MessageReceivedRecord)
    client.close()
    assert not isinstance(info.value, DeadLetter)
    assert default_retryable(info.value)
    assert f"127.0.0.1:{port}" in str(info.value)


def test_registry_down_when_serializing_is_a_registry_error_not_a_bad_value() -> None:
    """A serializer whose registry is down raises RegistryError, not the bad-value SerdeError."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = RegistryClient(f"http://127.0.0.1:{port}", timeout_s=2)
    serialize = AvroSerializer(client, V1, "pings-value")
    with pytest.raises(RegistryError, match="cannot reach the schema registry") as info:
        serialize({"n": 1})
    client.close()
    assert not isinstance(info.value, SerdeError)
    assert f"127.0.0.1:{port}" in str(info.value)


def test_reader_that_cannot_read_the_writer_raises_serde_error(ours: RegistryClient) -> None:
    """An enum symbol the reader lacks (and has no default for) is a SerdeError, as documented."""
    color = {"type": "enum", "name": "Color", "symbols": ["RED", "BLUE"]}
    writer = {"type": "record", "name": "Paint", "fields": [{"name": "c", "type": color}]}
    data = AvroSerializer(ours, json.dumps(writer), "paint-value")({"c": "BLUE"})
    old = {**writer, "fields": [{"name": "c", "type": {**color, "symbols": ["RED"]}}]}
    with pytest.raises(SerdeError, match="BLUE"):
        AvroDeserializer(ours, reader_schema=json.dumps(old))(data)
    with_default = {**color, "symbols": ["RED"], "default": "RED"}
    tolerant = {**writer, "fields": [{"name": "c", "type": with_default}]}
    assert AvroDeserializer(ours, reader_schema=json.dumps(tolerant))(data) == {"c": "RED"}


def test_serializer_refuses_numbers_the_schema_cannot_hold(ours: RegistryClient) -> None:
    """A float or an out-of-range integer for an Avro int is a SerdeError, not silently altered."""
    schema = json.dumps(
        {"type": "record", "name": "Nums", "fields": [{"name": "n", "type": "int"}]}
    )
    serialize = AvroSerializer(ours, schema, "nums-value")
    assert AvroDeserializer(ours)(serialize({"n": 7})) == {"n": 7}
    for bad in (2.7, 2**40, True):
        with pytest.raises(SerdeError, match=r"Nums\.n"):
            serialize({"n": bad})


def test_a_body_cut_short_says_so(ours: RegistryClient) -> None:
    """A framed message whose Avro body ends early gets a reason that says so, not a blank."""
    schema_id = ours.register("pings-value", V1)
    with pytest.raises(SerdeError, match="ends before"):
        AvroDeserializer(ours)(header(schema_id))

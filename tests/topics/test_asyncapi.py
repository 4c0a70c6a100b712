"""``pipeline asyncapi``: the AsyncAPI 3.0 document of the topics, checked by @asyncapi/parser."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import create_model
from support import IN_CI

from consumers.messages import MessageReceived
from pipeline import headers as h
from pipeline.offload import reference
from pipeline.topics.asyncapi import avro_schemas, document, model_of
from pipeline.topics.spec import TopicSpec, load_specs

ROOT = Path(__file__).parents[2]
EVERY_OPTION = Path(__file__).with_name("every_option")
PARSER_DIR = Path(__file__).with_name("asyncapi")
APPS = ["consumers.messages:app", "consumers.ai_turns:app", "consumers.engagement:app"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline asyncapi ARGS`` from the repository root, ``env`` added to its environment."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "asyncapi", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_the_project_topics_become_channels_operations_and_payloads() -> None:
    """Each lane has main, tier and DLQ channels, its group's operations and its model's payload."""
    out = cli("--format", "json", *(a for app in APPS for a in ("--app", app)))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["asyncapi"] == "3.0.0"
    channels = doc["channels"]
    assert [channels[c]["address"] for c in channels if c.startswith("messages")] == [
        "messages",
        "messages.retry.5s",
        "messages.retry.1m",
        "messages.retry.10m",
        "messages.dlq",
    ]
    assert channels["messages"]["bindings"]["kafka"]["partitions"] == 12
    assert channels["messages"]["x-pipeline"]["retry"]["tiers"] == [5_000, 60_000, 600_000]
    consume = doc["operations"]["messages_consume"]
    assert consume["action"] == "receive"
    assert consume["bindings"]["kafka"]["groupId"]["enum"] == ["messages"]
    assert doc["operations"]["messages_dead_letter"]["channel"] == {
        "$ref": "#/channels/messages_dlq"
    }
    schemas = doc["components"]["schemas"]
    assert schemas["MessageReceived"] == MessageReceived.model_json_schema()
    event = doc["components"]["messages"]["messages_event"]
    assert event["payload"] == {"$ref": "#/components/schemas/MessageReceived"}
    headers = schemas[event["headers"]["$ref"].rsplit("/", 1)[1]]["properties"]
    assert {h.TENANT, h.EVENT_ID, h.DEADLINE_MS} <= set(headers)
    dead = schemas["DeadLetterHeaders"]["properties"]
    assert {h.ATTEMPT, h.ORIGIN_TOPIC, h.ERROR_CLASS, h.DEAD_REASON} <= set(dead)
    assert doc["servers"]["kafka"]["protocol"] == "kafka"
    assert doc["servers"]["redis"]["protocol"] == "redis"


def test_an_avro_subject_becomes_an_avro_payload_and_groups_can_be_named() -> None:
    """A declaration's schema: subject found in schemas/ is its payload, in Avro format."""
    doc = document(
        load_specs(EVERY_OPTION),
        kafka_bootstrap="kafka-1:9092,kafka-2:9092",
        redis_url="redis://cache:6380/2",
        avro=avro_schemas(ROOT / "schemas"),
        groups={"orders": "fulfilment"},
    )
    payload = doc["components"]["messages"]["orders_event"]["payload"]
    assert payload["schemaFormat"].startswith("application/vnd.apache.avro+json")
    assert payload["schema"]["name"] == "MessageReceived"
    assert doc["channels"]["shop_orders_failed"]["address"] == "shop.orders.failed"
    groups = doc["operations"]["orders_consume"]["bindings"]["kafka"]["groupId"]["enum"]
    assert groups == ["fulfilment"]
    assert doc["servers"]["kafka"]["host"] == "kafka-1:9092"
    assert doc["servers"]["redis"] == {**doc["servers"]["redis"], "host": "cache:6380"}
    assert "payload" not in doc["components"]["messages"]["chat_turns_event"]  # no model known


def _payload_schema(doc: dict[str, Any], lane: str) -> dict[str, Any]:
    """The JSON schema a lane's event payload refers to."""
    ref = doc["components"]["messages"][f"{lane}_event"]["payload"]["$ref"]
    return doc["components"]["schemas"][ref.rsplit("/", 1)[1]]


def test_two_models_of_one_class_name_keep_their_own_schemas() -> None:
    """Lanes whose models share a class name (or a header schema's name) each get their own."""
    order_item = create_model("Item", sku=(str, ...))
    order_event = create_model("Event", order_id=(str, ...), items=(list[order_item], ...))
    refund_item = create_model("Item", refund_id=(str, ...))  # another module's Item
    refund_event = create_model("Event", reason=(str, ...), item=(refund_item, ...))
    paint_event = create_model("EventHeaders", colour=(str, ...))

    specs = [
        TopicSpec.model_validate({"name": name, "partitions": 1})
        for name in ("orders", "refunds", "paints")
    ]
    doc = document(
        specs,
        kafka_bootstrap="k:9092",
        redis_url="redis://r:6379/0",
        models={"orders": order_event, "refunds": refund_event, "paints": paint_event},
    )
    schemas = doc["components"]["schemas"]
    assert set(_payload_schema(doc, "orders")["properties"]) == {"order_id", "items"}
    assert set(_payload_schema(doc, "refunds")["properties"]) == {"reason", "item"}
    assert set(_payload_schema(doc, "paints")["properties"]) == {"colour"}
    assert h.TENANT in schemas["EventHeaders"]["properties"]
    order_ref = _payload_schema(doc, "orders")["properties"]["items"]["items"]["$ref"]
    refund_ref = _payload_schema(doc, "refunds")["properties"]["item"]["$ref"]
    assert set(schemas[order_ref.rsplit("/", 1)[1]]["properties"]) == {"sku"}
    assert set(schemas[refund_ref.rsplit("/", 1)[1]]["properties"]) == {"refund_id"}
    assert all(re.fullmatch(r"[A-Za-z0-9.\-_]+", name) for name in schemas)


def test_every_header_the_pipeline_writes_is_documented() -> None:
    """Abandon time, redrive origin and the offload reference's headers are in the schemas."""
    doc = document(load_specs(EVERY_OPTION), kafka_bootstrap="k:9092", redis_url="redis://r")
    schemas = doc["components"]["schemas"]
    written = {
        value
        for name, value in vars(h).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str)
    }
    written |= set(reference.HEADERS)
    documented = set(schemas["DeadLetterHeaders"]["properties"]) | {h.DUE_MS}
    assert written - documented == set()
    assert set(reference.HEADERS) <= set(schemas["EventHeaders"]["properties"])


def test_an_offloading_lane_says_large_payloads_travel_by_reference() -> None:
    """The channel of a lane with offload: names the threshold, the store and the reference."""
    doc = document(load_specs(EVERY_OPTION), kafka_bootstrap="k:9092", redis_url="redis://r")
    text = doc["channels"]["renders"]["description"]
    assert "Payloads above 64KiB travel by reference to s3://payloads/renders" in text
    assert reference.OFFLOAD in text


def test_model_of_reads_events_and_turns() -> None:
    """The payload model is the lane's event annotation, or the item type of a turn."""
    assert model_of(MessageReceived) is MessageReceived
    assert model_of(list[MessageReceived]) is MessageReceived
    assert model_of(bytes) is None


def test_a_bad_directory_is_one_line_and_exit_2() -> None:
    """A missing declarations directory prints one error line, no traceback."""
    out = cli("no-such-directory")
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error:")
    assert "Traceback" not in out.stderr


def _parser() -> list[str]:
    """The node command of the validator; skips (fails in CI) when node or the parser is absent."""
    node = shutil.which("node")
    if node is None or not (PARSER_DIR / "node_modules" / "@asyncapi" / "parser").is_dir():
        message = "the AsyncAPI parser is not installed: run `make asyncapi-parser` (needs node 20)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return [node, str(PARSER_DIR / "validate.mjs")]


@pytest.mark.parametrize(
    ("directory", "extra"),
    [
        ("topics", [a for app in APPS for a in ("--app", app)]),
        (str(EVERY_OPTION.relative_to(ROOT)), []),
    ],
    ids=["project", "every-option"],
)
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_the_official_parser_accepts_the_document(
    directory: str, extra: list[str], fmt: str, tmp_path: Path
) -> None:
    """@asyncapi/parser (with its Avro schema parser) reports no error on the generated document."""
    validator = _parser()
    out = cli(directory, "--format", fmt, *extra)
    assert out.returncode == 0, out.stderr
    path = tmp_path / f"asyncapi.{fmt}"
    path.write_text(out.stdout)
    loaded = yaml.safe_load(out.stdout) if fmt == "yaml" else json.loads(out.stdout)
    checked = subprocess.run(
        [*validator, str(path)], capture_output=True, text=True, check=False, timeout=120
    )
    report = json.loads(checked.stdout)
    assert report["errors"] == [], report
    assert checked.returncode == 0, checked.stderr
    assert report["parsed"]
    assert report["channels"] == len(loaded["channels"])
    assert report["operations"] == len(loaded["operations"])


@pytest.mark.parametrize(
    ("redis_url", "server"),
    [
        ("rediss://:secret@cache.example:6380/2", ("rediss", "cache.example:6380", "/2")),
        ("redis://[::1]:6379/0", ("redis", "[::1]:6379", "/0")),
        ("rediss://[fd00::7]/1", ("rediss", "[fd00::7]:6379", "/1")),
        ("unix:///run/redis/redis.sock?db=3", ("redis", "localhost", "/run/redis/redis.sock")),
    ],
    ids=["tls", "ipv6", "tls-ipv6-default-port", "unix-socket"],
)
def test_the_redis_server_is_where_and_how_the_pipeline_connects(
    redis_url: str, server: tuple[str, str, str], tmp_path: Path
) -> None:
    """A TLS, IPv6 or Unix-socket Redis URL is documented as that server, valid for the parser."""
    validator = _parser()
    doc = document(load_specs(EVERY_OPTION), kafka_bootstrap="k:9092", redis_url=redis_url)
    redis = doc["servers"]["redis"]
    assert (redis["protocol"], redis["host"], redis["pathname"]) == server
    assert "secret" not in json.dumps(doc)
    path = tmp_path / "asyncapi.json"
    path.write_text(json.dumps(doc))
    checked = subprocess.run(
        [*validator, str(path)], capture_output=True, text=True, check=False, timeout=120
    )
    report = json.loads(checked.stdout)
    assert report["errors"] == [], report
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    ("client", "protocol", "scheme"),
    [
        ({"security.protocol": "SSL"}, "kafka-secure", None),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
            "kafka-secure",
            {"type": "scramSha512"},
        ),
        (
            {"security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-256"},
            "kafka-secure",
            {"type": "scramSha256"},
        ),
        (
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"},
            "kafka",
            {"type": "plain"},
        ),
        ({"security.protocol": "SASL_SSL"}, "kafka-secure", {"type": "gssapi"}),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"},
            "kafka-secure",
            {"type": "oauth2"},
        ),
    ],
    ids=["ssl", "scram-512", "scram-256-lowercase", "plain", "default-gssapi", "oauthbearer"],
)
def test_the_kafka_server_says_tls_and_the_sasl_mechanism(
    client: dict[str, str], protocol: str, scheme: dict[str, str] | None, tmp_path: Path
) -> None:
    """The client's TLS and SASL mechanism become the Kafka server's protocol and security."""
    validator = _parser()
    secret = {"sasl.username": "svc-pipeline", "sasl.password": "hunter2"}
    out = cli(
        str(EVERY_OPTION.relative_to(ROOT)),
        "--format",
        "json",
        env={"PIPELINE_KAFKA__CLIENT": json.dumps({**client, **secret})},
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    kafka = doc["servers"]["kafka"]
    assert kafka["protocol"] == protocol
    if scheme is None:
        assert "security" not in kafka
    else:
        (ref,) = kafka["security"]
        name = ref["$ref"].rsplit("/", 1)[1]
        assert doc["components"]["securitySchemes"][name].items() >= scheme.items()
    assert "hunter2" not in out.stdout
    assert "svc-pipeline" not in out.stdout
    path = tmp_path / "asyncapi.json"
    path.write_text(out.stdout)
    checked = subprocess.run(
        [*validator, str(path)], capture_output=True, text=True, check=False, timeout=120
    )
    report = json.loads(checked.stdout)
    assert report["errors"] == [], report
    assert checked.returncode == 0, checked.stderr


def test_an_unknown_kafka_security_protocol_is_one_line_and_exit_2() -> None:
    """A security.protocol librdkafka does not know is refused with one line naming it."""
    out = cli(env={"PIPELINE_KAFKA__CLIENT": json.dumps({"security.protocol": "TLS"})})
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert "security.protocol" in line
    assert "TLS" in line
    assert "Traceback" not in out.stderr

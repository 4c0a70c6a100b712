"""Topic declaration files: parsing, defaults, derived topics and error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import TopicSpecError
from pipeline.runtime import App
from pipeline.topics.spec import (
    DLQ_MIN_RETENTION_MS,
    TopicSpec,
    format_duration_ms,
    load_spec,
    load_specs,
    parse_duration_ms,
)
from pipeline.transport.protocol import TopicConfig

REPO_TOPICS = Path(__file__).parents[2] / "topics"
DAY_MS = 86_400_000


def write(directory: Path, file_name: str, text: str) -> Path:
    """Write one declaration file and return its path."""
    path = directory / file_name
    path.write_text(text, encoding="utf-8")
    return path


def spec_of(**fields: object) -> TopicSpec:
    """Validate a declaration of ``messages`` with 12 partitions plus ``fields``."""
    return TopicSpec.model_validate({"name": "messages", "partitions": 12, **fields})


@pytest.mark.parametrize(
    ("value", "expected_ms"),
    [
        ("500ms", 500),
        ("30s", 30_000),
        ("5m", 300_000),
        ("2h", 7_200_000),
        ("7d", 7 * DAY_MS),
        (" 5s ", 5_000),
        (1500, 1500),
    ],
)
def test_parse_duration_ms_accepts_units_and_plain_milliseconds(value, expected_ms):
    """Each unit and a bare int of milliseconds parse to milliseconds."""
    assert parse_duration_ms(value) == expected_ms


@pytest.mark.parametrize("value", ["7x", "", "5", "1.5s", "5 s", "-5s", True, 1.5, None])
def test_parse_duration_ms_rejects_other_forms_with_an_example(value):
    """A malformed duration names the accepted forms and echoes the input."""
    with pytest.raises(ValueError, match=r"expected a duration like 500ms, 30s, 5m, 2h, 7d"):
        parse_duration_ms(value)


@pytest.mark.parametrize("value", [0, "0s", -1])
def test_parse_duration_ms_rejects_zero_and_negative(value):
    """A duration must be longer than zero."""
    with pytest.raises(ValueError, match="longer than zero"):
        parse_duration_ms(value)


@pytest.mark.parametrize(
    ("duration_ms", "label"),
    [
        (500, "500ms"),
        (1500, "1500ms"),
        (5_000, "5s"),
        (90_000, "90s"),
        (60_000, "1m"),
        (600_000, "10m"),
        (7_200_000, "2h"),
        (DAY_MS, "1d"),
    ],
)
def test_format_duration_ms_uses_the_coarsest_exact_unit(duration_ms, label):
    """Labels are canonical: the largest unit that divides the duration exactly."""
    assert format_duration_ms(duration_ms) == label


def test_minimal_file_gets_documented_defaults(tmp_path):
    """Only name and partitions are required; the rest default as documented."""
    spec = load_spec(write(tmp_path, "messages.yaml", "name: messages\npartitions: 12\n"))
    assert spec.retention_ms is None
    assert spec.lane == "messages"
    assert spec.ordered is True
    assert spec.max_len is None
    assert spec.retry.tiers_ms == ()
    assert spec.retry.max_attempts == 1
    assert spec.dead_letter == "messages.dlq"
    assert spec.configs == {}
    assert spec.throttle is None
    assert spec.debounce is None


def test_full_file_keeps_every_field(tmp_path):
    """Every field of the format is read into the spec."""
    text = """
name: orders
partitions: 24
retention: 3d
lane: order_lane
ordered: false
max_len: 5000
retry:
  tiers: [500ms, 5s]
  max_attempts: 7
dead_letter: orders.parked
configs: {cleanup.policy: delete, min.insync.replicas: 2, preallocate: true}
throttle: {keys: ["org:{tenant}", "sub:{tenant}/{customer_id}"], priority: 5, lease: 30s}
"""
    spec = load_spec(write(tmp_path, "orders.yaml", text))
    assert spec.name == "orders"
    assert spec.partitions == 24
    assert spec.retention_ms == 3 * DAY_MS
    assert spec.lane == "order_lane"
    assert spec.ordered is False
    assert spec.max_len == 5000
    assert spec.retry.tiers_ms == (500, 5_000)
    assert spec.retry.max_attempts == 7
    assert spec.dead_letter == "orders.parked"
    assert spec.configs == {
        "cleanup.policy": "delete",
        "min.insync.replicas": "2",
        "preallocate": "true",
    }
    assert spec.throttle is not None
    assert spec.throttle.keys == ("org:{tenant}", "sub:{tenant}/{customer_id}")
    assert (spec.throttle.priority, spec.throttle.lease_ms) == (5, 30_000)
    debounced = load_spec(
        write(
            tmp_path,
            "turns.yaml",
            "name: turns\npartitions: 2\ndebounce: {key: conversation_id, quiet_s: 4}\n",
        )
    )  # not with a throttle: a turn runs outside it
    assert debounced.debounce is not None
    assert debounced.debounce.model_dump() == {
        "key": "conversation_id",
        "quiet_s": 4,
        "max_wait_s": 30,
        "max_batch": 100,
    }


def test_max_attempts_defaults_to_one_more_than_the_tiers():
    """Without max_attempts a message gets its first delivery plus one per tier."""
    assert spec_of(retry={"tiers": ["5s", "1m", "10m"]}).retry.max_attempts == 4


def test_spec_is_frozen():
    """A loaded declaration cannot be changed in place."""
    spec = spec_of()
    with pytest.raises(ValueError, match="frozen"):
        spec.partitions = 3  # type: ignore[misc]


def test_retry_topic_names_use_normalised_tier_labels():
    """Tiers written as 5000, 60s and 10m name topics .retry.5s, .retry.1m and .retry.10m."""
    spec = spec_of(retry={"tiers": [5000, "60s", "10m", "36h"]})
    assert spec.retry_topic_names() == [
        "messages.retry.5s",
        "messages.retry.1m",
        "messages.retry.10m",
        "messages.retry.36h",
    ]


def test_topic_configs_expand_main_retry_tiers_and_dead_letter():
    """Retry topics copy the main topic; the dead-letter topic keeps at least 14 days."""
    spec = spec_of(retention="7d", retry={"tiers": ["5s", "1m"]}, configs={"a.b": "c"})
    week_ms = 7 * DAY_MS
    assert spec.topic_configs(default_max_len=1_000) == [
        TopicConfig("messages", 12, week_ms, 1_000, {"a.b": "c"}),
        TopicConfig("messages.retry.5s", 12, week_ms, 1_000, {"a.b": "c"}),
        TopicConfig("messages.retry.1m", 12, week_ms, 1_000, {"a.b": "c"}),
        TopicConfig("messages.dlq", 12, DLQ_MIN_RETENTION_MS, 1_000, {"a.b": "c"}),
    ]


def test_a_retry_copy_is_kept_past_its_tier_delay_however_short_the_retention():
    """With a retention shorter than a tier's delay, that tier's topic keeps twice the delay.

    Before, retry topics kept the main retention: with `retention: 1m` and a 1 h tier, Kafka
    deleted every copy waiting in that tier before it was due (lost to retention).
    """
    spec = spec_of(retention="1m", retry={"tiers": ["10m", "1h"]})
    _, ten_minutes, hour, _ = spec.topic_configs(default_max_len=1)
    assert ten_minutes.retention_ms == 20 * 60_000
    assert hour.retention_ms == 2 * 3_600_000
    unset = spec_of(retry={"tiers": ["1h"]}).topic_configs(default_max_len=1)
    assert unset[1].retention_ms is None  # the broker's default, as the main topic's


def test_dead_letter_keeps_a_longer_main_retention():
    """When the main retention exceeds 14 days the dead-letter topic keeps it too."""
    dlq = spec_of(retention="30d").topic_configs(default_max_len=1)[-1]
    assert dlq.retention_ms == 30 * DAY_MS


def test_dead_letter_keeps_14_days_when_retention_is_the_broker_default():
    """Without a declared retention the main topics keep the default and the DLQ 14 days."""
    main, dlq = spec_of().topic_configs(default_max_len=1)
    assert main.retention_ms is None
    assert dlq.retention_ms == DLQ_MIN_RETENTION_MS


def test_declared_max_len_overrides_the_default():
    """max_len in the file wins over the transport default for every derived topic."""
    configs = spec_of(max_len=42, retry={"tiers": ["1s"]}).topic_configs(default_max_len=1_000)
    assert {config.max_len for config in configs} == {42}


def test_custom_dead_letter_name_is_used():
    """An explicit dead_letter replaces <name>.dlq in the derived topics."""
    spec = spec_of(dead_letter="messages.parked")
    assert spec.topic_names() == ["messages", "messages.parked"]


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ("partitions: 12\n", "name", "required field is missing"),
        ("name: messages\n", "partitions", "required field is missing"),
        ("name: a b\npartitions: 1\n", "name", "expected letters, digits"),
        ("name: ..\npartitions: 1\n", "name", "'.' and '..' are not topic names"),
        (f"name: {'a' * 201}\npartitions: 1\n", "name", "at most 200 characters"),
        ("name: messages.dlq\npartitions: 1\n", "name", "reserved for dead-letter topics"),
        ("name: a.retry.b\npartitions: 1\n", "name", "reserved for retry tier topics"),
        ("name: m\npartitions: 0\n", "partitions", "greater than or equal to 1"),
        ("name: m\npartitions: 10001\n", "partitions", "less than or equal to 10000"),
        ("name: m\npartitions: '12'\n", "partitions", "valid integer"),
        ("name: m\npartitions: 1\nretention: 7x\n", "retention", "expected a duration like"),
        ("name: m\npartitions: 1\nlane: ai-turns\n", "lane", "expected an identifier"),
        ("name: m-x\npartitions: 1\n", "lane", "set lane when the name has"),
        ("name: m\npartitions: 1\nmax_len: 0\n", "max_len", "greater than or equal to 1"),
        (
            "name: m\npartitions: 1\nretry: {tiers: [5s, 1x]}\n",
            "retry.tiers[1]",
            "expected a duration like 500ms, 30s, 5m, 2h, 7d (got '1x')",
        ),
        (
            "name: m\npartitions: 1\nretry: {tiers: [1m, 30s]}\n",
            "retry.tiers",
            "strictly increasing: tiers[1] (30s) is not longer than tiers[0] (1m)",
        ),
        (
            "name: m\npartitions: 1\nretry: {max_attempts: 0}\n",
            "retry.max_attempts",
            "greater than or equal to 1",
        ),
        (
            "name: m\npartitions: 1\nretry: {delay: 5s}\n",
            "retry.delay",
            (
                "unknown field (expected one of: tiers, max_attempts, after_dead_letter, "
                "poison_after, budget)"
            ),
        ),
        ("name: m\npartitions: 1\ndead_letter: null\n", "dead_letter", "every topic has"),
        ("name: m\npartitions: 1\ndead_letter: false\n", "dead_letter", "every topic has"),
        ("name: m\npartitions: 1\ndead_letter: m\n", "dead_letter", "must differ"),
        ("name: m\npartitions: 1\ndead_letter: m.retry.x\n", "dead_letter", "reserved"),
        ("name: m\npartitions: 1\nconfigs: {retention.ms: 5}\n", "configs", "retention field"),
        ("name: m\npartitions: 1\nconfigs: {a: null}\n", "configs.a", "valid string"),
        (
            "name: m\npartitions: 1\nconfigs: {max.message.bytes: 2MB}\n",
            "configs",
            "max.message.bytes: expected a whole number of bytes, e.g. 2097152 (got '2MB')",
        ),
        ("name: m\npartitions: 1\nthrottle: 5\n", "throttle", "valid dictionary"),
        ("name: m\npartitions: 1\nthrottle: {keys: ['org:{x'] }\n", "throttle.keys", "bad key"),
        ("name: m\npartitions: 1\nthrottle: {keys: ['{tenant[0]}']}\n", "throttle.keys", "plain"),
        ("name: m\npartitions: 1\nthrottle: {keys: ['{tenant.x}']}\n", "throttle.keys", "plain"),
        ("name: m\npartitions: 1\nthrottle: {keys: ['{tenant:d}']}\n", "throttle.keys", "plain"),
        ("name: m\npartitions: 1\nthrottle: {keys: ['{tenant!r}']}\n", "throttle.keys", "plain"),
        (
            "name: m\npartitions: 1\nthrottle: {keys: ['x{tenant}{customer}']}\n",
            "throttle.keys",
            "put text between {tenant} and {customer}",
        ),
        ("name: m\npartitions: 1\nthrottle: {keys: []}\n", "throttle.keys", "at least 1"),
        ("name: m\npartitions: 1\ncolour: red\n", "colour", "unknown field"),
        (
            "name: m\npartitions: 1\nthrottle: {keys: [k], lease: 1ms}\n",
            "throttle.lease",
            "greater than or equal to 30",
        ),
        (
            (
                "name: m\npartitions: 1\ndebounce: {key: c, quiet_s: 1, max_wait_s: 5}\n"
                "throttle: {keys: [k]}\nheartbeat_timeout: 30s\n"
            ),
            "debounce",
            "cannot be combined with throttle, heartbeat_timeout (a debounced message",
        ),
    ],
)
def test_invalid_field_is_reported_with_file_and_field_path(tmp_path, text, field, problem):
    """Each validation error names the file, the field path and the problem."""
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(TopicSpecError) as info:
        load_spec(path)
    assert f"{path}: {field}: " in str(info.value)
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("retry: {tiers: [5s, 100000000000d]}", "retry.tiers[1]"),
        ("retry: {tiers: [366d]}", "retry.tiers[0]"),
        ("throttle: {keys: [k], lease: 100000000000d}", "throttle.lease"),
        (
            "throttle: {keys: [dep:x], adaptive: {dep:x: {max: 3, cooldown: 400d}}}",
            "throttle.adaptive.dep:x.cooldown",
        ),
        ("debounce: {key: c, quiet_s: 1.0e+20}", "debounce.quiet_s"),
        ("debounce: {key: c, quiet_s: .inf}", "debounce.quiet_s"),
        ("debounce: {key: c, quiet_s: 1, max_wait_s: 1.0e+20}", "debounce.max_wait_s"),
    ],
)
def test_a_lane_duration_past_a_year_is_refused_naming_file_field_and_bound(tmp_path, text, field):
    """A lane duration past 365 days, whose Redis expiries would overflow, is refused at load."""
    write(tmp_path, "long.yaml", f"name: m\npartitions: 1\n{text}\n")
    with pytest.raises(TopicSpecError) as info:
        load_specs(tmp_path)
    (line,) = str(info.value).splitlines()
    assert line.startswith(f"{tmp_path / 'long.yaml'}: {field}: ")
    assert "at most 365d" in line


def test_a_lane_duration_of_a_year_and_a_longer_retention_still_load(tmp_path):
    """The bound is inclusive, and retention (the broker's, no Redis expiry) is not bound by it."""
    text = "retry: {tiers: [365d]}\ndebounce: {key: c, quiet_s: 31536000}\nretention: 3650d\n"
    write(tmp_path, "year.yaml", f"name: m\npartitions: 1\n{text}")
    (spec,) = load_specs(tmp_path)
    assert spec.retry.tiers_ms == (365 * DAY_MS,)
    assert spec.retention_ms == 3650 * DAY_MS


@pytest.mark.parametrize(
    ("text", "field", "expected"),
    [
        (
            "throttle: {keys: [k], bogus: 1}",
            "throttle.bogus",
            "keys, priority, lease, max_waiting, adaptive",
        ),
        ("sojourn: {target: 1s, intervl: 5s}", "sojourn.intervl", "target, interval, brief"),
        ("batch: {slo: 12h}", "batch.slo", "idle_below, sla, promote_at"),
        ("retry: {budget: {rate: 0.1}}", "retry.budget.rate", "ratio, min_per_s"),
        (
            "throttle: {keys: [dep:x], adaptive: {dep:x: {max: 3, mn: 1}}}",
            "throttle.adaptive.dep:x.mn",
            "min, max, decrease, latency, cooldown",
        ),
    ],
)
def test_an_unknown_nested_field_lists_the_fields_of_its_own_section(
    tmp_path, text, field, expected
):
    """An unknown field inside a section names that section's fields, not the top-level ones."""
    path = write(tmp_path, "bad.yaml", f"name: m\npartitions: 1\n{text}\n")
    with pytest.raises(TopicSpecError) as info:
        load_spec(path)
    assert f"{path}: {field}: unknown field (expected one of: {expected})" in str(info.value)


def test_every_invalid_field_is_reported_on_its_own_line(tmp_path):
    """Several errors in one file each get a line naming the file and the field."""
    path = write(tmp_path, "bad.yaml", "name: a b\npartitions: 0\n")
    with pytest.raises(TopicSpecError) as info:
        load_spec(path)
    lines = str(info.value).splitlines()
    assert [line.split(": ")[:2] for line in lines] == [
        [str(path), "name"],
        [str(path), "partitions"],
    ]


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    """Broken YAML is reported with the file and the line yaml points at."""
    path = write(tmp_path, "broken.yaml", "name: m\npartitions: [1\nlane: x\n")
    with pytest.raises(TopicSpecError, match=r"broken\.yaml: line \d+, column \d+: invalid YAML"):
        load_spec(path)


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("name: m\npartitions: 3\npartitions: 12\n", 3, "partitions"),
        ("name: m\npartitions: 3\nretry:\n  tiers: [5s]\n  tiers: [1m]\n", 5, "tiers"),
    ],
)
def test_a_key_given_twice_is_refused_with_its_line(tmp_path, text, line, key):
    """A mapping key repeated in one file is an error naming its line, not a silent overwrite."""
    path = write(tmp_path, "twice.yaml", text)
    with pytest.raises(TopicSpecError) as info:
        load_spec(path)
    assert str(info.value).startswith(f"{path}: line {line}, column ")
    assert f"invalid YAML: duplicate key {key!r}" in str(info.value)


@pytest.mark.parametrize(("text", "found"), [("- a\n", "a list"), ("", "an empty document")])
def test_non_mapping_document_is_rejected(tmp_path, text, found):
    """A document that is not a mapping names the file and what was found."""
    path = write(tmp_path, "odd.yaml", text)
    with pytest.raises(TopicSpecError, match=rf"odd\.yaml: expected a mapping .*got {found}"):
        load_spec(path)


def test_load_specs_reads_yaml_and_yml_sorted_by_file_name(tmp_path):
    """Both extensions are read, in file-name order, and other files are ignored."""
    write(tmp_path, "b.yaml", "name: bravo\npartitions: 1\n")
    write(tmp_path, "a.yml", "name: alpha\npartitions: 1\n")
    write(tmp_path, "notes.txt", "not a declaration")
    assert [spec.name for spec in load_specs(tmp_path)] == ["alpha", "bravo"]


def test_duplicate_topic_name_names_both_files(tmp_path):
    """Two files declaring one topic name is an error naming both files."""
    first = write(tmp_path, "a.yaml", "name: messages\npartitions: 1\n")
    second = write(tmp_path, "b.yaml", "name: messages\npartitions: 2\n")
    with pytest.raises(TopicSpecError) as info:
        load_specs(tmp_path)
    assert f"{second}: name: duplicate topic 'messages'" in str(info.value)
    assert f"already declared by {first} (name)" in str(info.value)


def test_duplicate_derived_topic_names_both_files(tmp_path):
    """A main topic that collides with another file's dead-letter topic is a duplicate too."""
    first = write(tmp_path, "a.yaml", "name: alpha\npartitions: 1\ndead_letter: parked\n")
    second = write(tmp_path, "b.yaml", "name: parked\npartitions: 1\n")
    with pytest.raises(TopicSpecError) as info:
        load_specs(tmp_path)
    assert f"{second}: name: duplicate topic 'parked'" in str(info.value)
    assert f"already declared by {first} (dead_letter)" in str(info.value)


def test_topic_names_kafka_confuses_name_both_files(tmp_path):
    """Names differing only in '.' against '_' are one topic to Kafka: refused before any apply."""
    first = write(tmp_path, "a.yaml", "name: orders.eu\nlane: orders_dot_eu\npartitions: 1\n")
    second = write(tmp_path, "b.yaml", "name: orders_eu\npartitions: 1\n")
    with pytest.raises(TopicSpecError) as info:
        load_specs(tmp_path)
    assert str(info.value) == (
        f"{second}: name: topic 'orders_eu' collides with 'orders.eu' of {first} (name): Kafka"
        " treats '.' and '_' in topic names alike; rename one of them"
    )


def test_two_topics_of_one_lane_name_both_files(tmp_path):
    """Two topics declaring one lane is an error naming both files.

    A consumer serves a lane's one topic: it read only the last file's, and the other topic's
    events were accepted by the ingress and never consumed.
    """
    first = write(tmp_path, "a.yaml", "name: orders-eu\nlane: orders\npartitions: 1\n")
    second = write(tmp_path, "b.yaml", "name: orders-us\nlane: orders\npartitions: 1\n")
    with pytest.raises(TopicSpecError) as info:
        load_specs(tmp_path)
    assert f"{second}: lane: duplicate lane 'orders', already declared by {first}" in str(
        info.value
    )


def test_an_app_refuses_two_topics_of_one_lane():
    """Specs given to an App directly are checked the same way."""
    specs = [
        TopicSpec.model_validate({"name": name, "lane": "orders", "partitions": 1})
        for name in ("orders-eu", "orders-us")
    ]
    with pytest.raises(TopicSpecError, match="duplicate lane 'orders'"):
        App(specs)


def test_missing_directory_is_a_clear_error(tmp_path):
    """A topics directory that does not exist is reported by path."""
    missing = tmp_path / "nope"
    with pytest.raises(TopicSpecError, match=rf"{missing}: topic directory not found"):
        load_specs(missing)


def test_directory_without_declarations_is_a_clear_error(tmp_path):
    """A directory with no *.yaml or *.yml file is reported by path."""
    write(tmp_path, "README.md", "# topics")
    with pytest.raises(TopicSpecError, match=r"no topic declarations \(\*\.yaml, \*\.yml\)"):
        load_specs(tmp_path)


def test_repository_declarations_load():
    """The topics/ files shipped with the project are valid and expand as documented."""
    specs = {spec.name: spec for spec in load_specs(REPO_TOPICS)}
    assert sorted(specs) == ["ai_turns", "engagement", "messages"]
    assert specs["messages"].retry_topic_names() == [
        "messages.retry.5s",
        "messages.retry.1m",
        "messages.retry.10m",
    ]
    assert specs["ai_turns"].debounce.model_dump() == {
        "key": "conversation_id",
        "quiet_s": 4,
        "max_wait_s": 30,
        "max_batch": 100,
    }
    assert specs["engagement"].ordered is False
    assert specs["engagement"].partitions == 6


@pytest.mark.parametrize(
    "field_text", ["configs: {x: *l6}", "retention: *l6", "throttle: {keys: *l6}"]
)
def test_a_yaml_alias_bomb_is_refused_in_a_short_line(tmp_path, field_text):
    """A few hundred bytes of nested aliases expanding to millions of values are refused briefly."""
    anchors = ['  l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    anchors += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 7)]
    text = "anchors:\n" + "\n".join(anchors) + f"\nname: m\npartitions: 1\n{field_text}\n"
    path = write(tmp_path, "bomb.yaml", text)
    with pytest.raises(TopicSpecError) as info:
        load_spec(path)
    (line,) = str(info.value).splitlines()
    assert line.startswith(f"{path}: ")
    assert "aliases" in line
    assert len(line) < 500


def test_a_retention_past_a_64_bit_count_of_milliseconds_is_refused_at_load(tmp_path):
    """A retention Kafka's retention.ms cannot hold is refused naming the file and the field."""
    path = write(tmp_path, "m.yaml", "name: m\npartitions: 1\nretention: 99999999999999999999d\n")
    with pytest.raises(TopicSpecError) as info:
        load_spec(path)
    (line,) = str(info.value).splitlines()
    assert line.startswith(f"{path}: retention: must be at most 9223372036854775807 ms")

"""An offloading lane's ``above`` must leave its inline payloads room under the message limit.

Payloads up to ``above`` stay inline; one larger than the topic's message limit can then never
be produced. Such a declaration is refused when it is loaded, naming the file, the lane,
``above``, the limit and what to do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import TopicSpecError
from pipeline.topics.spec import INLINE_HEADROOM_BYTES, load_spec, load_specs

REPO = Path(__file__).parents[2]
DEFAULT_LIMIT = 1_114_112  # PIPELINE_MAX_MESSAGE_BYTES's default
LARGEST_ABOVE = DEFAULT_LIMIT - INLINE_HEADROOM_BYTES


def declare(directory: Path, above: object, *, configs: str = "") -> Path:
    """Write ``uploads.yaml`` (lane ``files``) offloading above ``above``; return its path."""
    path = directory / "uploads.yaml"
    path.write_text(
        "name: uploads\npartitions: 1\nlane: files\n"
        f"offload: {{above: {above}, store: 'file:///tmp/unused-payloads'}}\n{configs}",
        encoding="utf-8",
    )
    return path


def test_above_beyond_the_default_limit_is_refused_in_one_line(tmp_path):
    """``above: 10GiB`` under the default limit: one line with file, lane, above, limit, advice."""
    path = declare(tmp_path, "10GiB")
    with pytest.raises(TopicSpecError) as raised:
        load_specs(tmp_path, DEFAULT_LIMIT)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: offload.above: ")
    assert "lane 'files'" in message
    assert "10GiB" in message
    assert f"max message bytes is {DEFAULT_LIMIT}" in message
    assert "PIPELINE_MAX_MESSAGE_BYTES" in message
    assert f"lower above to at most {LARGEST_ABOVE} bytes" in message
    assert f"{INLINE_HEADROOM_BYTES} bytes" in message


def test_above_at_the_limit_less_the_headroom_loads(tmp_path):
    """The largest ``above`` whose inline payloads fit with their headers is accepted."""
    declare(tmp_path, LARGEST_ABOVE)
    assert load_spec(tmp_path / "uploads.yaml", DEFAULT_LIMIT).offload is not None
    declare(tmp_path, LARGEST_ABOVE + 1)
    with pytest.raises(TopicSpecError, match=r"offload\.above: "):
        load_spec(tmp_path / "uploads.yaml", DEFAULT_LIMIT)


def test_without_a_known_limit_above_is_not_judged(tmp_path):
    """An App loading a directory has no settings: a raised limit is not second-guessed.

    ``PIPELINE_MAX_MESSAGE_BYTES`` raised to 16 MiB lets a lane offload above 8 MiB; judged by
    the default limit it would be refused. Every command passes its setting instead.
    """
    declare(tmp_path, "8MiB")
    assert load_specs(tmp_path)[0].offload is not None
    assert load_specs(tmp_path, 16 * 1_048_576)[0].offload is not None
    with pytest.raises(TopicSpecError, match=r"max message bytes is 1114112"):
        load_specs(tmp_path, DEFAULT_LIMIT)


def test_the_declared_max_message_bytes_is_the_limit(tmp_path):
    """A topic declaring its own ``max.message.bytes`` is checked against that, not the default."""
    declare(tmp_path, "4MiB", configs="configs: {max.message.bytes: 8388608}\n")
    assert load_spec(tmp_path / "uploads.yaml").offload is not None
    path = declare(tmp_path, "4MiB", configs="configs: {max.message.bytes: 2097152}\n")
    with pytest.raises(TopicSpecError) as raised:
        load_spec(path)
    assert "max message bytes is 2097152 (its configs max.message.bytes)" in str(raised.value)


def test_a_limit_given_by_the_caller_caps_the_declared_one(tmp_path):
    """A process's ``PIPELINE_MAX_MESSAGE_BYTES`` below the topic's own limit is what binds."""
    declare(tmp_path, "4MiB", configs="configs: {max.message.bytes: 8388608}\n")
    with pytest.raises(TopicSpecError, match=r"max message bytes is 2097152 \(PIPELINE_MAX"):
        load_specs(tmp_path, max_message_bytes=2_097_152)
    declare(tmp_path, "4MiB")
    assert load_specs(tmp_path, max_message_bytes=8_388_608)[0].offload is not None


@pytest.mark.parametrize("directory", ["topics", "tests/topics/every_option"])
def test_the_project_declarations_still_load(directory):
    """The shipped examples and the every-option declarations stay valid."""
    assert load_specs(REPO / directory)


def test_produce_to_such_a_lane_names_the_lane_not_the_message_size(tmp_path):
    """``pipeline produce`` (where it was found) stops on the declaration, before any message."""
    declare(tmp_path, "10GiB")
    value = tmp_path / "event.bin"
    value.write_bytes(b"a" * 3_000_000)
    env = {
        **os.environ,
        "PIPELINE_TOPICS_DIR": str(tmp_path),
        "PIPELINE_REDIS__KEY_PREFIX": f"t-above-{os.getpid()}",
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "produce", "uploads", "-t", "redis", "-f", str(value)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "offload.above" in done.stderr
    assert "lane 'files'" in done.stderr
    assert "exceeds max_message_bytes" not in done.stderr
    raised = {**env, "PIPELINE_MAX_MESSAGE_BYTES": str(16 * 1_048_576)}
    declare(tmp_path, "8MiB")
    value.write_bytes(b"{}")
    listed = subprocess.run(
        [sys.executable, "-m", "pipeline", "asyncapi", str(tmp_path)],
        env=raised,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr  # the raised limit is the one judged
